"""Grading stored attempts as a resumable step (the verify stage, and the filter, warm start and evaluation, which
grade their own attempts).

A rerun grades only the rollouts without an outcome of this grading stage; each outcome is stored as soon as it is
known. Grading reads trajectory headers only (diff, termination, metadata), never their tokens.

The real grader (lego.verify in a fresh Docker sandbox) lives here, not beside the rollout stack: a stage's cache
key covers the modules it imports (lego.pipeline.keys), so the stages that grade key the verifier's code and the
sandbox, and none of the proxy or harness code that produced the attempts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Protocol

from lego.data.catalog import Catalog
from lego.data.reader import iter_trajectory_headers
from lego.data.writer import DatasetWriter
from lego.errors import LegoError
from lego.pipeline.artifacts import StageContext
from lego.pipeline.stored import kind_counts, stored_outcomes
from lego.records import Outcome, Trajectory
from lego.tasksets.task import Task

Grader = Callable[[Task, Trajectory], Outcome]


class GradingRunner(Protocol):
    """What grades one attempt: the verifier (`verifier_grader`) or a stand-in that a config injects."""

    def grader(self, ctx: StageContext) -> contextlib.AbstractContextManager[Grader]:
        """A grading function, valid inside the context."""


@contextlib.contextmanager
def verifier_grader(ctx: StageContext) -> Iterator[Grader]:
    """The real grader: lego.verify, each attempt in a fresh sandbox on the configured Docker engine."""
    from lego.sandbox.daemon import docker_engine
    from lego.sandbox.image import ensure_base_image
    from lego.verify import Verifier

    config = ctx.config
    with docker_engine(ctx.work.docker_root, config.docker.host, config.docker.start_private_daemon) as engine:
        base_image = ensure_base_image(engine.client, config.docker)
        verifier = Verifier(engine.client, base_image, config.sandbox, config.verify)
        yield verifier.verify


def grade_attempts(ctx: StageContext, tasks: Sequence[Task], *, data_run_id: str, rollout_stage: str,
                   outcome_stage: str, iteration: int, label: str | None = None,
                   only: Collection[str] | None = None) -> list[Outcome]:
    """Grade every stored rollout of (data run, stage, iteration) that has no outcome of `outcome_stage` yet;
    each outcome is persisted as soon as it is known. `label` names the grading in the run's progress (default
    `outcome_stage/iteration`). `only`: grade just these rollout ids (one shard of a grading fanned out over
    workers, each on its own engine); the outcomes returned are still all of the stage's."""
    by_id = {task.instance_id: task for task in tasks}
    graded = stored_outcomes(ctx, data_run_id, outcome_stage, iteration)
    writer = DatasetWriter(ctx.work, data_run_id)
    with Catalog.open(ctx.work, ctx.config, in_memory=True) as catalog:
        todo = [t for t in iter_trajectory_headers(catalog, data_run_id, rollout_stage, iteration)
                if t.rollout_id not in graded and (only is None or t.rollout_id in only)]
    if todo:
        for trajectory in todo:
            if trajectory.task_id not in by_id:
                raise LegoError(f"rollout {trajectory.rollout_id} is for task {trajectory.task_id!r}, "
                                "which is not in this stage's task list")
        ctx.log(f"{outcome_stage}: grading {len(todo)} rollouts")
        progress = None
        if ctx.progress is not None:
            progress = ctx.progress.start(label or f"{outcome_stage}/{iteration}", len(graded) + len(todo),
                                          done=len(graded), verb="graded",
                                          counts=kind_counts(o.kind.value for o in graded.values()))
        runner: GradingRunner = ctx.runner
        try:
            with runner.grader(ctx) as grade:
                # Each grading is a fresh sandbox of its own, so `verify.concurrency` of them run at once; their
                # outcomes are stored here, one at a time, as each is known. After a failure nothing more begins;
                # the gradings under way are finished and stored before the error goes up.
                waiting = iter(todo)
                running: set[Future] = set()
                failure: BaseException | None = None
                with ThreadPoolExecutor(max_workers=ctx.config.verify.concurrency,
                                        thread_name_prefix="grading") as pool:
                    while True:
                        while failure is None and len(running) < ctx.config.verify.concurrency:
                            trajectory = next(waiting, None)
                            if trajectory is None:
                                break
                            running.add(pool.submit(grade, by_id[trajectory.task_id], trajectory))
                        if not running:
                            break
                        done, running = wait(running, return_when=FIRST_COMPLETED)
                        for future in done:
                            try:
                                outcome = future.result()
                            except BaseException as exc:  # noqa: BLE001 (raised below, after what is under way)
                                failure = failure or exc
                                continue
                            writer.append_outcomes([outcome], iteration, stage=outcome_stage)
                            graded[outcome.rollout_id] = outcome
                            if progress is not None:
                                progress.advance(outcome.kind.value)
                if failure is not None:
                    raise failure
        finally:
            if progress is not None:
                progress.finish()
    return list(graded.values())
