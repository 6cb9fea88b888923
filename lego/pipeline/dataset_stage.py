"""Stage `dataset`: GRPO advantages (sql/advantages.sql) over the graded rollouts; the training set."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from lego.data.catalog import Catalog
from lego.data.writer import DatasetWriter
from lego.pipeline.artifacts import StageContext, StageOutput, StageResult, run_cached
from lego.pipeline.stored import stored_outcomes

STAGE = "dataset"
COLUMNS = ("rollout_id", "task_id", "sample_index", "policy_version", "kind", "reward", "is_cheat", "group_size",
           "group_valid", "group_mean", "group_std", "in_loss", "excluded_reason", "advantage")


def _ensure_latest(ctx: StageContext, catalog: Catalog, verify: StageResult, iteration: int) -> None:
    """The advantages view reads the newest outcome per rollout. If a different verify config graded these rollouts
    later, make this verify artifact's outcomes the newest again (re-append them) before computing advantages."""
    data_run_id = verify.data["data_run_id"]
    mine = stored_outcomes(ctx, data_run_id, verify.data["outcome_stage"], iteration)
    latest = {row["rollout_id"]: row["stage"] for row in catalog.rows(
        "SELECT rollout_id, stage FROM latest_outcomes WHERE run_id = ? AND iteration = ?", [data_run_id, iteration])}
    if any(latest.get(rollout_id) != verify.data["outcome_stage"] for rollout_id in mine):
        DatasetWriter(ctx.work, data_run_id).append_outcomes(list(mine.values()), iteration,
                                                             stage=verify.data["outcome_stage"])


def run_dataset_stage(ctx: StageContext, verify: StageResult) -> StageResult:
    iteration = verify.iteration or 0
    inputs = {"verify": verify.key, "data": ctx.config.section_dict("data")}

    def compute(directory: Path) -> StageOutput:
        data_run_id = verify.data["data_run_id"]
        with Catalog.open(ctx.work, ctx.config, in_memory=True) as catalog:
            _ensure_latest(ctx, catalog, verify, iteration)
            rows = catalog.rows(
                f"SELECT {', '.join(COLUMNS)} FROM advantages WHERE run_id = ? AND iteration = ? "
                "ORDER BY task_id, sample_index", [data_run_id, iteration])
        table = pa.Table.from_pylist(rows) if rows else pa.table({name: pa.array([], pa.string()) for name in COLUMNS})
        path = directory / "advantages.parquet"
        pq.write_table(table, path)
        in_loss = [row for row in rows if row["in_loss"]]
        groups = {row["task_id"] for row in in_loss}
        rewards = [row["reward"] for row in rows if row["reward"] is not None]
        metrics = {"rollouts": len(rows), "in_loss": len(in_loss), "groups_in_loss": len(groups),
                   "mean_reward": sum(rewards) / len(rewards) if rewards else 0.0,
                   "nonzero_advantages": sum(1 for row in in_loss if abs(row["advantage"] or 0) > 1e-9),
                   # GRPO groups whose rewards differ: the only ones that move the policy
                   "groups_with_signal": len({row["task_id"] for row in in_loss
                                              if abs(row["advantage"] or 0) > 1e-9})}
        for reason in ("infra_error", "group_too_small", "not_graded"):
            metrics[f"excluded.{reason}"] = sum(1 for row in rows if row["excluded_reason"] == reason)
        return StageOutput(metrics=metrics, outputs={"advantages": path},
                           data={"data_run_id": data_run_id, "iteration": iteration})

    return run_cached(ctx, STAGE, iteration, inputs, compute)


def read_advantages(result: StageResult) -> list[dict]:
    return pq.read_table(result.outputs["advantages"]).to_pylist()

