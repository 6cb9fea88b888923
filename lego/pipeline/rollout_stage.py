"""Stage `rollout`: the harness runs each training task `rollout.samples_per_task` times at the current policy.

Split in three steps so that the flow can fan the requests out over a Prefect task runner:
plan (key, cache check, pending requests) -> execute shards -> finish (check all stored, write the result).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from lego.pipeline.artifacts import (
    StageContext,
    StageOutput,
    StageResult,
    artifact_dir,
    load_result,
    run_cached,
)
from lego.pipeline.attempts import check_complete, pending_requests
from lego.pipeline.keys import code_version, key_of
from lego.pipeline.policy import Policy
from lego.pipeline.taskset_stage import practised, read_tasks
from lego.rollout.requests import RolloutRequest, rollout_requests, round_seed
from lego.tasksets.task import Task

STAGE = "rollout"


def rollout_settings(ctx: StageContext) -> dict:
    """The config that shapes a rollout's trajectory."""
    config = ctx.config
    return {"sampling": config.section_dict("sampling"), "harness": config.section_dict("harness"),
            "sandbox": config.section_dict("sandbox"), "engine": config.section_dict("engine"),
            "context_length": config.model.context_length, "seed": config.project.seed}


@dataclass
class RolloutPlan:
    key: str
    data_run_id: str
    inputs: dict
    tasks: list[Task]
    requests: list[RolloutRequest]
    pending: list[RolloutRequest]
    policy: Policy
    iteration: int
    cached: StageResult | None = None
    started_at: float = 0.0  # wall clock (time.time(): the shards may run in other processes)


def plan_rollouts(ctx: StageContext, task_list: StageResult, policy: Policy, iteration: int) -> RolloutPlan:
    """`task_list`: the filter result (kept tasks) or the tasks result (train tasks, less the demonstrated ones
    where rollout.practise_demonstrated is false; the config allows that without the filter only)."""
    kept = task_list.outputs.get("kept_tasks")
    tasks = read_tasks(kept) if kept else practised(ctx.config, read_tasks(task_list.outputs["train_tasks"]))
    inputs = {"task_list": task_list.key, "policy": policy.key, "rollout": ctx.config.section_dict("rollout"),
              **rollout_settings(ctx)}
    if not ctx.config.rollout.practise_demonstrated:
        inputs["demonstrated"] = ctx.config.warmstart.tasks  # which tasks are left out
    key = key_of({"stage": STAGE, "iteration": iteration, "code": code_version(STAGE), **inputs})
    data_run_id = f"rollout-{key[:16]}"
    plan = RolloutPlan(key, data_run_id, inputs, tasks, [], [], policy, iteration, started_at=time.time())
    if not ctx.force:
        plan.cached = load_result(ctx.work, STAGE, key)
        if plan.cached is not None:
            return plan
    seed = round_seed(ctx.config.project.seed, iteration)
    plan.requests = rollout_requests(data_run_id, tasks, ctx.config.rollout.samples_per_task, seed)
    plan.pending = pending_requests(ctx, plan.requests, data_run_id, STAGE, iteration)
    if ctx.force and len(plan.pending) < len(plan.requests):
        # --force: recompute everything under a fresh data run so old trajectories do not count
        plan.data_run_id = f"rollout-{key[:10]}-{_stamp()}"
        plan.requests = rollout_requests(plan.data_run_id, tasks, ctx.config.rollout.samples_per_task, seed)
        plan.pending = list(plan.requests)
    return plan


def _stamp() -> str:
    return f"{time.time_ns() // 1_000_000:x}"


def shard(requests: list[RolloutRequest], shards: int) -> list[list[RolloutRequest]]:
    """Whole tasks per shard (a GRPO group stays together), round-robin."""
    by_task: dict[str, list[RolloutRequest]] = {}
    for request in requests:
        by_task.setdefault(request.task_id, []).append(request)
    out: list[list[RolloutRequest]] = [[] for _ in range(max(1, min(shards, len(by_task))))]
    for index, group in enumerate(by_task.values()):
        out[index % len(out)].extend(group)
    return [part for part in out if part]


def finish_rollouts(ctx: StageContext, plan: RolloutPlan) -> StageResult:
    if plan.cached is not None:
        return plan.cached
    check_complete(ctx, plan.requests, plan.data_run_id, STAGE, plan.iteration)

    def compute(directory: Path) -> StageOutput:
        output = rollout_output(ctx, directory, plan.data_run_id, STAGE, plan.iteration, plan.requests,
                                plan.policy)
        output.seconds = time.time() - plan.started_at  # planning, the shards and this summary
        # Throughput of this computation only: rollouts stored by an earlier, interrupted one took time not counted
        # here.
        output.metrics["rollouts_run"] = float(len(plan.pending))
        if plan.pending and output.seconds > 0:
            output.metrics["rollouts_per_hour"] = len(plan.pending) * 3600.0 / output.seconds
        return output

    result = run_cached(ctx, STAGE, plan.iteration, plan.inputs, compute)
    assert result.key == plan.key, "rollout key drifted between plan and finish"
    return result


# LLM calls by what the proxy made of them (lego.records.LLMCall): a rewrite of the history (a new segment), and a
# call on a sub-agent's thread (`thread` is "subagent:<n>"; records from before threads were kept say it in `kind`).
CALL_COUNTS_SQL = (
    "SELECT count(*) AS calls, count(*) FILTER (WHERE kind = 'rewrite') AS rewrite_calls, "
    "count(*) FILTER (WHERE starts_with(coalesce(thread, ''), 'subagent') OR kind = 'subagent') AS subagent_calls "
    "FROM llm_calls WHERE run_id = ? AND stage = ? AND iteration = ? AND list_contains(?, rollout_id)")


def rollout_output(ctx: StageContext, directory: Path, data_run_id: str, stage: str, iteration: int,
                   requests: list[RolloutRequest], policy: Policy) -> StageOutput:
    """Summary of stored rollouts: counts, turns, tokens, terminations, and the shares of LLM calls that rewrote the
    history or served a sub-agent (from the rollouts and llm_calls tables, no tokens read)."""
    from lego.data.catalog import Catalog

    wanted = [request.rollout_id for request in requests]
    with Catalog.open(ctx.work, ctx.config, in_memory=True) as catalog:
        rows = catalog.rows(
            "SELECT * FROM rollouts WHERE run_id = ? AND stage = ? AND iteration = ? AND list_contains(?, rollout_id)",
            [data_run_id, stage, iteration, wanted])
        calls = catalog.rows(CALL_COUNTS_SQL, [data_run_id, stage, iteration, wanted])[0]
    terminations: dict[str, int] = {}
    for row in rows:
        terminations[str(row.get("termination"))] = terminations.get(str(row.get("termination")), 0) + 1
    summary = {"data_run_id": data_run_id, "rollouts": len(rows), "terminations": terminations,
               "rollout_ids": wanted}
    (directory / "rollouts.json").write_text(json.dumps(summary, indent=2, default=str))
    tokens = [row.get("num_tokens") or 0 for row in rows]
    turns = [row.get("num_turns") or row.get("num_calls") or 0 for row in rows]
    metrics = {"rollouts": len(rows), "tokens": sum(tokens), "mean_tokens": sum(tokens) / max(len(rows), 1),
               "mean_turns": sum(turns) / max(len(rows), 1)}
    metrics.update({f"termination.{name}": count for name, count in terminations.items()})
    total_calls = int(calls["calls"] or 0)
    metrics.update({"llm_calls": total_calls, "rewrite_calls": int(calls["rewrite_calls"] or 0),
                    "subagent_calls": int(calls["subagent_calls"] or 0),
                    "rewrite_share": int(calls["rewrite_calls"] or 0) / total_calls if total_calls else 0.0,
                    "subagent_share": int(calls["subagent_calls"] or 0) / total_calls if total_calls else 0.0})
    data_dir = ctx.work.data / data_run_id / stage / f"iter={iteration}"
    return StageOutput(metrics=metrics, outputs={"rollout_summary": directory / "rollouts.json",
                                                 "trajectories": data_dir},
                       data={"data_run_id": data_run_id, "stage": stage, **policy.as_data()})


__all__ = ["RolloutPlan", "artifact_dir", "finish_rollouts", "plan_rollouts", "shard"]
