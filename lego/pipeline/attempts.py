"""Running attempts as a resumable step over the Parquet dataset (the rollout stage, and the filter, warm start and
evaluation, which run their own attempts).

Rollout ids are deterministic (lego.rollout.requests: data run id, task, sample), so a rerun after a crash runs
only the requests whose trajectory is not stored yet.

The real rollout stack (lego.rollout: the harness in a sandbox, its model calls through the proxy) lives here, not
beside the grader or the readers of stored records: a stage's cache key covers the modules it imports
(lego.pipeline.keys), so the stages that run attempts key that stack and the stages that only grade or read the
stored attempts do not (lego.pipeline.grading, lego.pipeline.stored).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol

from lego.config import LegoConfig
from lego.data.writer import DatasetWriter
from lego.errors import LegoError
from lego.pipeline.artifacts import StageContext
from lego.pipeline.policy import Policy
from lego.pipeline.stored import kind_counts, stored_rollout_ids, stored_terminations
from lego.records import Trajectory
from lego.rollout.requests import RolloutRequest, rollout_requests
from lego.tasksets.task import Task


class IncompleteRolloutsError(LegoError):
    """The rollout runner returned without persisting every requested trajectory."""


class RolloutRunner(Protocol):
    """What runs attempts: the real stack (`harness_rollouts`) or a stand-in that a config injects."""

    def rollout(self, ctx: StageContext, tasks: Sequence[Task], requests: Sequence[RolloutRequest], policy: Policy,
                *, stage: str, iteration: int, writer: DatasetWriter, gold: bool = False) -> None:
        """Run the requests and persist one trajectory per request with `writer` (stage, iteration). `gold`: the
        policy does not sample; a scripted policy answers with each task's gold solution in the harness's own
        tools (HarnessAdapter.gold_replies), scored by `policy` (the warm start's demonstrations)."""


def harness_rollouts(ctx: StageContext, tasks: Sequence[Task], requests: Sequence[RolloutRequest], policy: Policy,
                     *, stage: str, iteration: int, writer: DatasetWriter, gold: bool = False) -> None:
    """The real rollouts: the harness in a Docker sandbox, its model calls through the proxy to the policy's
    engine (lego.rollout.batch). See RolloutRunner.rollout."""
    from lego.engine.pool import lease_engine
    from lego.rollout.batch import run_rollouts
    from lego.termination import run_until_terminated

    with lease_engine(ctx.config, policy.path, policy.version, lambda line: ctx.log(f"{stage}: {line}")) as engine:
        run_until_terminated(run_rollouts(requests, tasks, ctx.config, ctx.work, engine, writer=writer, stage=stage,
                                 iteration=iteration, engine_for=gold_engines(ctx.config, engine) if gold else None))


def gold_command(task: Task) -> str:
    """The shell command a gold attempt runs: the task's own `provenance["gold_command"]` where it has one (a
    generated family's fix written from its statement alone, lego.tasksets.family.gold_command, which a policy can
    learn to write for a task it never saw), else the gold patch's lines edited by number, else the gold patch
    applied whole."""
    from lego.harness.base import apply_patch_command, line_edit_command

    command = task.provenance.get("gold_command") if isinstance(task.provenance, dict) else None
    if isinstance(command, str) and command.strip():
        return command
    return line_edit_command(task.patch) or apply_patch_command(task.patch)


def gold_engines(config: LegoConfig, scorer):
    """A scripted engine per task that answers with the task's gold solution (`gold_command`) in the harness's own
    tools, its tokens scored by `scorer` (the policy: real log-probs and routing)."""
    from lego.engine.scripted import ScriptedEngine
    from lego.engine.tokenizer import load_tokenizer
    from lego.harness.base import get_harness

    adapter, tokenizer = get_harness(config.harness.name), load_tokenizer()
    return lambda task: ScriptedEngine(scorer, tokenizer, adapter.gold_replies(gold_command(task)))


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
    runner: RolloutRunner = ctx.runner  # the real stack (harness_rollouts) unless the config injects another
    writer = (DatasetWriter(ctx.work, data_run_id) if on_stored is None
              else ReportingWriter(ctx.work, data_run_id, on_stored))
    runner.rollout(ctx, [task for task in tasks if task.instance_id in wanted], list(requests), policy,
                   stage=stage, iteration=iteration, writer=writer, gold=gold)


def run_attempts(ctx: StageContext, tasks: Sequence[Task], policy: Policy, *, samples: int, data_run_id: str,
                 stage: str, iteration: int, gold: bool = False, label: str | None = None,
                 seed: int | None = None) -> list[str]:
    """Make sure every (task, sample) has a stored trajectory; returns the rollout ids. `label` names the step in
    the run's progress (default `stage/iteration`); `seed`: the round's base seed (lego.rollout.requests)."""
    requests = rollout_requests(data_run_id, tasks, samples, seed)
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
