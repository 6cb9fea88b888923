"""Rollouts and grading as resumable steps over the Parquet dataset (shared by filter, rollout/verify, evaluate).

Rollout ids are deterministic (lego.rollout.requests: data run id, task, sample), so a rerun after a crash runs
only the requests whose trajectory is not stored yet, and grades only the rollouts without an outcome of this
grading stage. Grading reads trajectory headers only (diff, termination, metadata), never their tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow.parquet as pq

from lego.data import codec
from lego.data.catalog import Catalog
from lego.data.reader import iter_trajectory_headers
from lego.data.writer import DatasetWriter
from lego.errors import LegoError
from lego.pipeline.artifacts import StageContext, StageResult
from lego.pipeline.policy import Policy
from lego.pipeline.runners import StageRunner
from lego.pipeline.taskset_stage import read_tasks
from lego.records import Outcome
from lego.rollout.requests import RolloutRequest, rollout_requests
from lego.tasksets.task import Task


class IncompleteRolloutsError(LegoError):
    """The rollout runner returned without persisting every requested trajectory."""


def stored_rollout_ids(ctx: StageContext, data_run_id: str, stage: str, iteration: int) -> set[str]:
    with Catalog.open(ctx.work, ctx.config, in_memory=True) as catalog:
        files = catalog.files("rollouts", data_run_id, stage, iteration)
    ids: set[str] = set()
    for path in files:
        ids.update(pq.read_table(path, columns=["rollout_id"]).column("rollout_id").to_pylist())
    return ids


def pending_requests(ctx: StageContext, requests: Sequence[RolloutRequest], data_run_id: str, stage: str,
                     iteration: int) -> list[RolloutRequest]:
    done = stored_rollout_ids(ctx, data_run_id, stage, iteration)
    return [request for request in requests if request.rollout_id not in done]


def execute_requests(ctx: StageContext, tasks: Sequence[Task], requests: Sequence[RolloutRequest], policy: Policy,
                     *, data_run_id: str, stage: str, iteration: int, gold: bool = False) -> None:
    if not requests:
        return
    wanted = {request.task_id for request in requests}
    runner: StageRunner = ctx.runner  # the real stack (lego.rollout) unless the config injects another
    runner.rollout(ctx, [task for task in tasks if task.instance_id in wanted], list(requests), policy,
                       stage=stage, iteration=iteration, writer=DatasetWriter(ctx.work, data_run_id), gold=gold)


def run_attempts(ctx: StageContext, tasks: Sequence[Task], policy: Policy, *, samples: int, data_run_id: str,
                 stage: str, iteration: int, gold: bool = False) -> list[str]:
    """Make sure every (task, sample) has a stored trajectory; returns the rollout ids."""
    requests = rollout_requests(data_run_id, tasks, samples)
    pending = pending_requests(ctx, requests, data_run_id, stage, iteration)
    if pending:
        ctx.log(f"{stage}: {len(pending)} of {len(requests)} rollouts to run")
    execute_requests(ctx, tasks, pending, policy, data_run_id=data_run_id, stage=stage, iteration=iteration,
                     gold=gold)
    check_complete(ctx, requests, data_run_id, stage, iteration)
    return [request.rollout_id for request in requests]


def check_complete(ctx: StageContext, requests: Sequence[RolloutRequest], data_run_id: str, stage: str,
                   iteration: int) -> None:
    missing = pending_requests(ctx, requests, data_run_id, stage, iteration)
    if missing:
        raise IncompleteRolloutsError(
            f"{len(missing)} of {len(requests)} rollouts of {data_run_id}/{stage}/iter={iteration} were not stored "
            f"(first: {missing[0].rollout_id}); rerun the stage: stored rollouts are kept and only these run")


def stored_outcomes(ctx: StageContext, data_run_id: str, outcome_stage: str, iteration: int) -> dict[str, Outcome]:
    with Catalog.open(ctx.work, ctx.config, in_memory=True) as catalog:
        if not catalog.files("outcomes", data_run_id, outcome_stage, iteration):
            return {}
        rows = catalog.rows(
            "SELECT * FROM outcomes WHERE run_id = ? AND stage = ? AND iteration = ? "
            "QUALIFY row_number() OVER (PARTITION BY rollout_id ORDER BY written_at DESC) = 1",
            [data_run_id, outcome_stage, iteration])
    return {row["rollout_id"]: codec.outcome_from_row(row) for row in rows}


def grade_attempts(ctx: StageContext, tasks: Sequence[Task], *, data_run_id: str, rollout_stage: str,
                   outcome_stage: str, iteration: int) -> list[Outcome]:
    """Grade every stored rollout of (data run, stage, iteration) that has no outcome of `outcome_stage` yet;
    each outcome is persisted as soon as it is known."""
    by_id = {task.instance_id: task for task in tasks}
    graded = stored_outcomes(ctx, data_run_id, outcome_stage, iteration)
    writer = DatasetWriter(ctx.work, data_run_id)
    with Catalog.open(ctx.work, ctx.config, in_memory=True) as catalog:
        todo = [t for t in iter_trajectory_headers(catalog, data_run_id, rollout_stage, iteration)
                if t.rollout_id not in graded]
    if todo:
        ctx.log(f"{outcome_stage}: grading {len(todo)} rollouts")
        runner: StageRunner = ctx.runner
        with runner.grader(ctx) as grade:
            for trajectory in todo:
                task = by_id.get(trajectory.task_id)
                if task is None:
                    raise LegoError(f"rollout {trajectory.rollout_id} is for task {trajectory.task_id!r}, which "
                                    "is not in this stage's task list")
                outcome = grade(task, trajectory)
                writer.append_outcomes([outcome], iteration, stage=outcome_stage)
                graded[outcome.rollout_id] = outcome
    return list(graded.values())


def attempt_and_grade(ctx: StageContext, tasks_result: StageResult, split: str, policy: Policy, *, data_run_id: str,
                      stage: str, samples: int, iteration: int) -> tuple[list[Task], list[Outcome]]:
    """The loop of the stages that measure a policy on a split (filter, evaluate): the tasks of
    `tasks_result.outputs[split]`, `samples` attempts each at `policy` (stored under `data_run_id` and `stage`),
    every attempt graded (outcome stage `<stage>-verify`). Returns the tasks and the outcomes."""
    tasks = read_tasks(tasks_result.outputs[split])
    run_attempts(ctx, tasks, policy, samples=samples, data_run_id=data_run_id, stage=stage, iteration=iteration)
    outcomes = grade_attempts(ctx, tasks, data_run_id=data_run_id, rollout_stage=stage,
                              outcome_stage=f"{stage}-verify", iteration=iteration)
    return tasks, outcomes
