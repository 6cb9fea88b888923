"""Stage `filter`: keep the training tasks whose pass rate at the current policy lies in the configured window
(sql/difficulty.sql): too easy and too hard tasks give GRPO groups without signal."""

from __future__ import annotations

import json
from pathlib import Path

from lego.data.catalog import Catalog
from lego.data.queries import task_difficulty
from lego.errors import LegoError
from lego.pipeline.artifacts import StageContext, StageOutput, StageResult, run_cached
from lego.pipeline.attempts import run_attempts
from lego.pipeline.grading import grade_attempts
from lego.pipeline.policy import Policy
from lego.pipeline.rollout_stage import rollout_settings
from lego.pipeline.taskset_stage import read_tasks, write_tasks
from lego.pipeline.verify_stage import grading_settings
from lego.records import Outcome
from lego.tasksets.task import Task

STAGE = "filter"


class NothingKeptError(LegoError):
    """The difficulty filter kept no task."""


def attempt_and_grade(ctx: StageContext, tasks_result: StageResult, split: str, policy: Policy, *, data_run_id: str,
                      stage: str, samples: int, iteration: int) -> tuple[list[Task], list[Outcome]]:
    """The tasks of `tasks_result.outputs[split]`, `samples` attempts each at `policy` (stored under `data_run_id`
    and `stage`), every attempt graded (outcome stage `<stage>-verify`). Returns the tasks and the outcomes."""
    tasks = read_tasks(tasks_result.outputs[split])
    label = f"{stage}/{iteration} {split.removesuffix('_tasks')}"  # a stage measuring two splits shows both
    run_attempts(ctx, tasks, policy, samples=samples, data_run_id=data_run_id, stage=stage, iteration=iteration,
                 label=label)
    outcomes = grade_attempts(ctx, tasks, data_run_id=data_run_id, rollout_stage=stage,
                              outcome_stage=f"{stage}-verify", iteration=iteration, label=f"{label} grading")
    return tasks, outcomes


def run_filter_stage(ctx: StageContext, tasks_result: StageResult, policy: Policy) -> StageResult:
    inputs = {"tasks": tasks_result.key, "policy": policy.key, "filter": ctx.config.section_dict("filter"),
              **rollout_settings(ctx), **grading_settings(ctx)}

    def compute(directory: Path) -> StageOutput:
        data_run_id = f"filter-{directory.name[:16]}"
        tasks, _ = attempt_and_grade(ctx, tasks_result, "train_tasks", policy, data_run_id=data_run_id, stage=STAGE,
                                     samples=ctx.config.filter.attempts, iteration=0)
        with Catalog.open(ctx.work, ctx.config, in_memory=True) as catalog:
            rows = task_difficulty(catalog, data_run_id)
        kept_ids = {row["task_id"] for row in rows if row["keep"]}
        kept = [task for task in tasks if task.instance_id in kept_ids]
        (directory / "difficulty.json").write_text(json.dumps(rows, indent=2, default=str))
        if not kept:
            verdicts = {row["task_id"]: row["verdict"] for row in rows}
            raise NothingKeptError(
                f"the difficulty filter kept none of {len(tasks)} tasks ({verdicts}); widen the window "
                "(filter.min_solved / filter.max_solved), raise filter.attempts, or set filter.enabled=false")
        verdicts: dict[str, int] = {}
        for row in rows:
            verdicts[row["verdict"]] = verdicts.get(row["verdict"], 0) + 1
        return StageOutput(
            metrics={"tasks": len(tasks), "kept": len(kept), **{f"verdict.{k}": v for k, v in verdicts.items()}},
            outputs={"kept_tasks": write_tasks(directory / "kept_tasks.jsonl", kept),
                     "difficulty": directory / "difficulty.json"},
            data={"data_run_id": data_run_id},
        )

    return run_cached(ctx, STAGE, None, inputs, compute)
