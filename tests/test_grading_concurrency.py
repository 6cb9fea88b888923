"""Grading stored attempts `verify.concurrency` at a time (lego/pipeline/grading.py): the gradings overlap, each
outcome is stored as it is known, and a failing grading stops what has not begun while what is under way is
finished and stored."""

from __future__ import annotations

import contextlib
import threading

import pytest
from run_builders import TASKS, Iteration, crafted_config, store_rollouts

from lego import records
from lego.pipeline.artifacts import StageContext
from lego.pipeline.grading import grade_attempts
from lego.pipeline.stored import stored_outcomes
from lego.tasksets.task import Task
from lego.workdir import WorkDir

RUN = "grading-run"


class Grader:
    """Grades each attempt resolved once `together` gradings are under way at the same moment (a barrier), or
    fails the ones named in `fail`."""

    def __init__(self, together: int, fail: set[str] = frozenset(), wait_s: float = 60):
        self.barrier = threading.Barrier(together)
        self.wait_s = wait_s
        self.fail = fail
        self.started: list[str] = []
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def grader(self, ctx):
        def grade(task, trajectory):
            with self.lock:
                self.started.append(trajectory.rollout_id)
            if trajectory.rollout_id in self.fail:
                raise RuntimeError(f"grading {trajectory.rollout_id} broke")
            self.barrier.wait(timeout=self.wait_s)  # BrokenBarrierError unless `together` gradings run at once
            return records.Outcome(trajectory.rollout_id, task.instance_id, records.OutcomeKind.resolved)

        yield grade


def setup(tmp_path, concurrency: int, runner) -> tuple[StageContext, list[Task], list[str]]:
    config = crafted_config(tmp_path / "work", f"verify.concurrency={concurrency}")
    work = WorkDir.create(tmp_path / "work")
    stored = store_rollouts(work, RUN, 0, Iteration(kinds={task: [records.OutcomeKind.resolved] * 2
                                                           for task in TASKS[:2]}))
    tasks = [Task(instance_id=task, repo="r", base_commit="c", problem_statement="p", FAIL_TO_PASS=["t"])
             for task in TASKS[:2]]
    ctx = StageContext(config=config, work=work, run_id=RUN, runner=runner, log=lambda _: None)
    return ctx, tasks, [t.rollout_id for t in stored]


def grade(ctx, tasks):
    return grade_attempts(ctx, tasks, data_run_id=RUN, rollout_stage="rollout", outcome_stage="verify", iteration=0)


def test_gradings_run_concurrency_at_a_time_and_each_is_stored(tmp_path):
    runner = Grader(together=2)
    ctx, tasks, ids = setup(tmp_path, 2, runner)
    outcomes = grade(ctx, tasks)
    assert sorted(o.rollout_id for o in outcomes) == sorted(ids)
    assert sorted(stored_outcomes(ctx, RUN, "verify", 0)) == sorted(ids)


def test_with_concurrency_one_the_gradings_do_not_overlap(tmp_path):
    runner = Grader(together=2, wait_s=2)  # two at once never happens: the first grading's barrier breaks
    ctx, tasks, _ = setup(tmp_path, 1, runner)
    with pytest.raises(threading.BrokenBarrierError):
        grade(ctx, tasks)
    assert runner.started == runner.started[:1]  # the rest were never begun


def test_a_failing_grading_keeps_what_was_under_way(tmp_path):
    ctx, tasks, ids = setup(tmp_path, 2, None)
    runner = Grader(together=1, fail={ids[1]})
    ctx.runner = runner
    with pytest.raises(RuntimeError, match="broke"):
        grade(ctx, tasks)
    stored = stored_outcomes(ctx, RUN, "verify", 0)
    # every grading begun beside the failed one was finished and stored
    assert ids[1] in runner.started and ids[1] not in stored
    assert set(stored) == set(runner.started) - {ids[1]}
    # a rerun grades only what has no outcome yet
    runner.fail = set()
    runner.started.clear()
    assert sorted(o.rollout_id for o in grade(ctx, tasks)) == sorted(ids)
    assert sorted(runner.started) == sorted(set(ids) - set(stored))


def test_after_a_failure_no_grading_begins(tmp_path):
    ctx, tasks, ids = setup(tmp_path, 2, None)
    ctx.runner = runner = Grader(together=1, fail=set(ids))
    with pytest.raises(RuntimeError, match="broke"):
        grade(ctx, tasks)
    assert len(runner.started) == 2  # the first two, under way together; the other two never begun
    assert stored_outcomes(ctx, RUN, "verify", 0) == {}
