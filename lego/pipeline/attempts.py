"""Rollouts and grading as resumable steps over the Parquet dataset (shared by filter, rollout/verify, evaluate).

Rollout ids are deterministic (lego.rollout.requests: data run id, task, sample), so a rerun after a crash runs
only the requests whose trajectory is not stored yet, and grades only the rollouts without an outcome of this
grading stage. Grading reads trajectory headers only (diff, termination, metadata), never their tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

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
from lego.records import Outcome, Trajectory
from lego.rollout.requests import RolloutRequest, rollout_requests
from lego.tasksets.task import Task


class IncompleteRolloutsError(LegoError):
    """The rollout runner returned without persisting every requested trajectory."""


def read_terminations(files: Iterable[Path]) -> dict[str, str]:
    """rollout id -> termination, from rollouts Parquet files (two columns read, never the tokens)."""
    out: dict[str, str] = {}
    for path in files:
        table = pq.read_table(path, columns=["rollout_id", "termination"])
        out.update(zip(table.column("rollout_id").to_pylist(),
                       (str(value) for value in table.column("termination").to_pylist()), strict=True))
    return out


def stored_terminations(ctx: StageContext, data_run_id: str, stage: str, iteration: int) -> dict[str, str]:
    with Catalog.open(ctx.work, ctx.config, in_memory=True) as catalog:
        files = catalog.files("rollouts", data_run_id, stage, iteration)
    return read_terminations(files)


def stored_rollout_ids(ctx: StageContext, data_run_id: str, stage: str, iteration: int) -> set[str]:
    return set(stored_terminations(ctx, data_run_id, stage, iteration))


def kind_counts(kinds: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
    return counts


class ReportingWriter(DatasetWriter):
    """A DatasetWriter that tells `on_stored` of each trajectory once it is stored: any runner reports progress
    through the writer it is given, without knowing of it."""

    def __init__(self, work, run_id: str, on_stored: Callable[[Trajectory], None]) -> None:
        super().__init__(work, run_id)
        self.on_stored = on_stored

    def append_trajectories(self, trajectories: Iterable[Trajectory], stage: str = "rollout") -> list[Path]:
        trajectories = list(trajectories)
        written = super().append_trajectories(trajectories, stage)
        for trajectory in trajectories:
            self.on_stored(trajectory)
        return written


def pending_requests(ctx: StageContext, requests: Sequence[RolloutRequest], data_run_id: str, stage: str,
                     iteration: int) -> list[RolloutRequest]:
    done = stored_rollout_ids(ctx, data_run_id, stage, iteration)
    return [request for request in requests if request.rollout_id not in done]


def execute_requests(ctx: StageContext, tasks: Sequence[Task], requests: Sequence[RolloutRequest], policy: Policy,
                     *, data_run_id: str, stage: str, iteration: int, gold: bool = False,
                     on_stored: Callable[[Trajectory], None] | None = None) -> None:
    """Run the requests with the stage runner; `on_stored` is told of each trajectory as it is stored."""
    if not requests:
        return
    wanted = {request.task_id for request in requests}
    runner: StageRunner = ctx.runner  # the real stack (lego.rollout) unless the config injects another
    writer = (DatasetWriter(ctx.work, data_run_id) if on_stored is None
              else ReportingWriter(ctx.work, data_run_id, on_stored))
    runner.rollout(ctx, [task for task in tasks if task.instance_id in wanted], list(requests), policy,
                   stage=stage, iteration=iteration, writer=writer, gold=gold)


def run_attempts(ctx: StageContext, tasks: Sequence[Task], policy: Policy, *, samples: int, data_run_id: str,
                 stage: str, iteration: int, gold: bool = False, label: str | None = None) -> list[str]:
    """Make sure every (task, sample) has a stored trajectory; returns the rollout ids. `label` names the step in
    the run's progress (default `stage/iteration`)."""
    requests = rollout_requests(data_run_id, tasks, samples)
    stored = stored_terminations(ctx, data_run_id, stage, iteration)
    pending = [request for request in requests if request.rollout_id not in stored]
    progress = None
    if pending:
        ctx.log(f"{stage}: {len(pending)} of {len(requests)} rollouts to run")
        if ctx.progress is not None:
            wanted = {request.rollout_id for request in requests}
            progress = ctx.progress.start(label or f"{stage}/{iteration}", len(requests),
                                          done=len(requests) - len(pending),
                                          counts=kind_counts(t for r, t in stored.items() if r in wanted))
    try:
        execute_requests(ctx, tasks, pending, policy, data_run_id=data_run_id, stage=stage, iteration=iteration,
                         gold=gold, on_stored=None if progress is None else
                         lambda trajectory: progress.advance(trajectory.termination.value))
    finally:
        if progress is not None:
            progress.finish()
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
                   outcome_stage: str, iteration: int, label: str | None = None) -> list[Outcome]:
    """Grade every stored rollout of (data run, stage, iteration) that has no outcome of `outcome_stage` yet;
    each outcome is persisted as soon as it is known. `label` names the grading in the run's progress (default
    `outcome_stage/iteration`)."""
    by_id = {task.instance_id: task for task in tasks}
    graded = stored_outcomes(ctx, data_run_id, outcome_stage, iteration)
    writer = DatasetWriter(ctx.work, data_run_id)
    with Catalog.open(ctx.work, ctx.config, in_memory=True) as catalog:
        todo = [t for t in iter_trajectory_headers(catalog, data_run_id, rollout_stage, iteration)
                if t.rollout_id not in graded]
    if todo:
        ctx.log(f"{outcome_stage}: grading {len(todo)} rollouts")
        progress = None
        if ctx.progress is not None:
            progress = ctx.progress.start(label or f"{outcome_stage}/{iteration}", len(graded) + len(todo),
                                          done=len(graded), verb="graded",
                                          counts=kind_counts(o.kind.value for o in graded.values()))
        runner: StageRunner = ctx.runner
        try:
            with runner.grader(ctx) as grade:
                for trajectory in todo:
                    task = by_id.get(trajectory.task_id)
                    if task is None:
                        raise LegoError(f"rollout {trajectory.rollout_id} is for task {trajectory.task_id!r}, "
                                        "which is not in this stage's task list")
                    outcome = grade(task, trajectory)
                    writer.append_outcomes([outcome], iteration, stage=outcome_stage)
                    graded[outcome.rollout_id] = outcome
                    if progress is not None:
                        progress.advance(outcome.kind.value)
        finally:
            if progress is not None:
                progress.finish()
    return list(graded.values())


def attempt_and_grade(ctx: StageContext, tasks_result: StageResult, split: str, policy: Policy, *, data_run_id: str,
                      stage: str, samples: int, iteration: int) -> tuple[list[Task], list[Outcome]]:
    """The loop of the stages that measure a policy on a split (filter, evaluate): the tasks of
    `tasks_result.outputs[split]`, `samples` attempts each at `policy` (stored under `data_run_id` and `stage`),
    every attempt graded (outcome stage `<stage>-verify`). Returns the tasks and the outcomes."""
    tasks = read_tasks(tasks_result.outputs[split])
    label = f"{stage}/{iteration} {split.removesuffix('_tasks')}"  # a stage measuring two splits shows both
    run_attempts(ctx, tasks, policy, samples=samples, data_run_id=data_run_id, stage=stage, iteration=iteration,
                 label=label)
    outcomes = grade_attempts(ctx, tasks, data_run_id=data_run_id, rollout_stage=stage,
                              outcome_stage=f"{stage}-verify", iteration=iteration, label=f"{label} grading")
    return tasks, outcomes
