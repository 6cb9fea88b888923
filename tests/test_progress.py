"""lego.pipeline.progress: a stage's progress as periodic lines off a terminal (never one per rollout), as bars on
one, and the rollout stage's counts read from what its shards store."""

from __future__ import annotations

import io
import logging
import sys

import numpy as np
import pytest
from rich.console import Console

from lego.data.synthetic import synthetic_trajectory
from lego.data.writer import DatasetWriter
from lego.pipeline.progress import RunProgress, StageStalledError, StoredRecords, follow
from lego.records import Outcome, OutcomeKind, TerminationReason


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def board(lines: list[str], clock: Clock | None = None, **kwargs) -> RunProgress:
    return RunProgress(lines.append, live=False, clock=clock or Clock(), **kwargs)


def test_a_line_each_tenth_and_one_at_the_end_never_one_per_item():
    lines: list[str] = []
    step = board(lines).start("verify/0", 24, verb="graded")
    for index in range(24):
        step.advance("resolved" if index % 3 == 0 else "unresolved")
    step.finish()
    # a tenth of 24 rounds up to 3 items a line; the last line falls on the end, so finish adds none
    assert len(lines) == 8
    assert lines[0] == "verify/0: 3/24 graded (resolved 1, unresolved 2)"
    assert lines[-1] == "verify/0: 24/24 graded (resolved 8, unresolved 16)"


def test_a_slow_step_reports_after_every_s_and_a_failed_one_where_it_stopped():
    lines: list[str] = []
    clock = Clock()
    step = board(lines, clock, every_s=30.0).start("rollout/1", 100, done=10, counts={"completed": 10})
    step.advance("completed")
    assert lines == []  # 11 of 100: not a tenth further, and no time passed
    clock.now = 31.0
    step.advance("timeout")
    assert lines == ["rollout/1: 12/100 done (completed 11, timeout 1)"]
    clock.now = 100.0
    step.update(12, {"completed": 11, "timeout": 1})  # nothing new: no line however long it took
    assert len(lines) == 1
    step.advance("completed")
    step.finish()
    step.finish()
    assert lines[-1] == "rollout/1: 13/100 done (completed 12, timeout 1)" and len(lines) == 2


def test_bars_on_a_terminal_and_the_final_counts_in_the_log():
    out = io.StringIO()
    lines: list[str] = []
    # a handler that writes to the terminal, as Prefect's console handler does
    handler = logging.StreamHandler(sys.stderr)
    stream = handler.stream
    logger = logging.getLogger("lego.test.progress")
    logger.addHandler(handler)
    try:
        progress = RunProgress(lines.append, console=Console(file=out, force_terminal=True, width=120))
        assert progress.live
        step = progress.start("rollout/0", 4)
        for _ in range(4):
            step.advance("completed")
        assert lines == []  # on a terminal the bar shows the way, the log gets the end
        logger.warning("a log line while the bars are live")
        step.finish()
        progress.close()
    finally:
        logger.removeHandler(handler)
    assert lines == ["rollout/0: 4/4 done (completed 4)"]
    assert "rollout/0" in out.getvalue() and "4/4" in out.getvalue()
    # the log line was printed through rich, above the bars, and the handler writes where it did before
    assert "a log line while the bars are live" in out.getvalue()
    assert handler.stream is stream


def store(writer: DatasetWriter, ids: list[str], termination: TerminationReason) -> None:
    for index, rollout_id in enumerate(ids):
        trajectory = synthetic_trajectory(np.random.default_rng(index), rollout_id, "task-a", sample_index=index,
                                          tokens_per_segment=16)
        trajectory.termination = termination
        writer.append_trajectories([trajectory], stage="rollout")


def test_stored_rollouts_are_counted_from_the_files_whoever_wrote_them(tmp_path):
    writer = DatasetWriter(tmp_path / "data", "rollout-abc")
    directory = writer.directory("rollout", 0)
    wanted = [f"r{i}" for i in range(6)]
    counter = StoredRecords(directory, wanted)
    assert counter.poll() == (0, {})  # nothing stored yet (the directory does not even exist)
    store(writer, ["r0", "r1"], TerminationReason.completed)
    store(writer, ["other"], TerminationReason.completed)  # not one of this stage's requests
    assert counter.poll() == (2, {"completed": 2})

    lines: list[str] = []
    step = board(lines).start("rollout/0", len(wanted), done=2, counts={"completed": 2})
    batches = iter([(["r2", "r3"], TerminationReason.timeout), (["r4", "r5"], TerminationReason.completed)])

    def wait(timeout: float) -> bool:
        batch = next(batches, None)
        if batch is not None:
            store(writer, *batch)
        return batch is None

    follow(step, counter, wait, poll_s=0.0)
    assert lines == ["rollout/0: 4/6 done (completed 2, timeout 2)", "rollout/0: 6/6 done (completed 4, timeout 2)"]
    assert len(counter.seen) == 7  # each file read once


def test_shards_that_store_nothing_for_the_stall_timeout_fail_the_stage_and_keep_what_is_stored(tmp_path):
    """A lost node that never closes its connections keeps its shard 'running' for the driver: the stage gives up
    when nothing new is stored for `stall_s`, and the rollouts stored before stay (a rerun runs only the rest)."""
    writer = DatasetWriter(tmp_path / "data", "rollout-abc")
    counter = StoredRecords(writer.directory("rollout", 0), ["r0", "r1", "r2", "r3"])
    clock = Clock()
    lines: list[str] = []
    step = board(lines, clock).start("rollout/0", 4)
    stored = iter([["r0"], ["r1"]])  # the surviving node's rollouts, then silence

    def wait(timeout: float) -> bool:
        clock.now += 10.0
        batch = next(stored, None)
        if batch is not None:
            store(writer, batch, TerminationReason.completed)
        return False  # the lost node's shard never reports back

    with pytest.raises(StageStalledError, match="2 of 4 rollouts stored and none for 60 s") as raised:
        follow(step, counter, wait, poll_s=0.0, stall_s=60.0, clock=clock)
    assert "rerun the stage" in str(raised.value)
    assert 70.0 < clock.now <= 90.0  # the clock restarted at the last stored rollout (t=20), not at the start
    assert lines[-1] == "rollout/0: 2/4 done (completed 2)"  # the failed step still reports where it stopped
    assert counter.poll() == (2, {"completed": 2})


def test_slow_shards_that_keep_storing_are_never_stalled(tmp_path):
    writer = DatasetWriter(tmp_path / "data", "rollout-abc")
    wanted = [f"r{i}" for i in range(5)]
    counter = StoredRecords(writer.directory("rollout", 0), wanted)
    clock = Clock()
    step = board([], clock).start("rollout/0", 5)
    pending = list(wanted)

    def wait(timeout: float) -> bool:
        clock.now += 50.0  # every rollout takes 50 s: under the 60 s limit each time, far over it in all
        store(writer, [pending.pop(0)], TerminationReason.completed)
        return not pending

    follow(step, counter, wait, poll_s=0.0, stall_s=60.0, clock=clock)
    assert counter.poll() == (5, {"completed": 5})


def test_grading_shards_are_counted_from_their_outcomes_and_a_silent_one_fails_the_verify_stage(tmp_path):
    """The verify stage's grading shards run on other nodes too: their progress is the outcomes they store (the
    newest per rollout), and when none is stored for `stall_s` the stage fails with what to rerun."""
    writer = DatasetWriter(tmp_path / "data", "rollout-abc")
    counter = StoredRecords(writer.directory("verify-1234", 0), ["r0", "r1", "r2"], table="outcomes")
    clock = Clock()
    lines: list[str] = []
    step = board(lines, clock).start("verify/0", 3, verb="graded")
    graded = iter([[Outcome("r0", "task-a", OutcomeKind.resolved), Outcome("other", "task-b", OutcomeKind.resolved)],
                   [Outcome("r1", "task-a", OutcomeKind.infra_error)],
                   [Outcome("r1", "task-a", OutcomeKind.unresolved)]])  # r1 graded again: the newer one counts

    def wait(timeout: float) -> bool:
        clock.now += 10.0
        batch = next(graded, None)
        if batch is not None:
            writer.append_outcomes(batch, 0, stage="verify-1234")
        return False  # the third shard's node is gone

    with pytest.raises(StageStalledError, match="2 of 3 rollouts graded and none for 30 s") as raised:
        follow(step, counter, wait, poll_s=0.0, stall_s=30.0, clock=clock)
    assert "lego stage verify --from RUN" in str(raised.value)
    assert counter.poll() == (2, {"resolved": 1, "unresolved": 1})
    assert lines[-1].startswith("verify/0: 2/3 graded")
    with pytest.raises(ValueError, match="counted are"):
        StoredRecords(tmp_path, [], table="segments")
