"""Trajectories, outcomes and tasks round-trip exactly through Parquet; readers stream in bounded batches."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from lego.data.catalog import Catalog
from lego.data.codec import EvalResult, TrainStep
from lego.data.reader import (
    iter_segment_batches,
    iter_trajectories,
    read_outcomes,
    read_tasks,
    read_trajectories,
)
from lego.data.synthetic import synthetic_trajectory
from lego.data.writer import DatasetWriter
from lego.records import Outcome, OutcomeKind, Segment, SegmentReason, TerminationReason
from lego.tasksets.task import Task
from lego.workdir import WorkDir


@pytest.fixture()
def work(tmp_path) -> WorkDir:
    return WorkDir(tmp_path / "work")


def assert_same_array(a: np.ndarray | None, b: np.ndarray | None) -> None:
    if a is None or b is None:
        assert a is None and b is None
        return
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


def assert_same_trajectory(a, b) -> None:
    for name in ("rollout_id", "task_id", "harness", "policy_version", "iteration", "sample_index", "final_diff",
                 "termination", "timings", "harness_log", "error", "metadata", "calls"):
        assert getattr(a, name) == getattr(b, name), name
    assert len(a.segments) == len(b.segments)
    for x, y in zip(a.segments, b.segments, strict=True):
        for name in ("token_ids", "response_mask", "logprobs", "routed_experts"):
            assert_same_array(getattr(x, name), getattr(y, name))
        assert (x.reason, x.thread) == (y.reason, y.thread)


def test_trajectories_round_trip_exactly(work):
    rng = np.random.default_rng(1)
    trajectories = [
        synthetic_trajectory(rng, "moe-48x8", "task-a", segments=2, tokens_per_segment=257, layers=48, top_k=8,
                             num_experts=128),
        synthetic_trajectory(rng, "tiny-2x2", "task-a", sample_index=1, segments=3, tokens_per_segment=100),
    ]
    dense = synthetic_trajectory(rng, "dense", "task-b", layers=None, tokens_per_segment=64)
    dense.segments.append(Segment(token_ids=np.zeros(0, np.int32), response_mask=np.zeros(0, np.uint8),
                                  logprobs=np.zeros(0, np.float32), routed_experts=None,
                                  reason=SegmentReason.subagent, thread="subagent:grep"))
    dense.termination = TerminationReason.max_turns
    dense.error = "ran out of turns"
    dense.metadata = {"temperature": 0.7, "nested": {"list": [1, 2.5, "x"], "none": None}}
    empty = synthetic_trajectory(rng, "no-segments", "task-b", segments=1)
    empty.segments = []
    trajectories += [dense, empty]
    writer = DatasetWriter(work, "run-1")
    writer.append_trajectories(trajectories[:2])
    writer.append_trajectories(trajectories[2:])

    with Catalog.open(work) as catalog:
        streamed = list(iter_trajectories(catalog, batch_size=2))
        assert [t.rollout_id for t in streamed] == [t.rollout_id for t in trajectories]
        for original, back in zip(trajectories, streamed, strict=True):
            assert_same_trajectory(original, back)
        by_id = read_trajectories(catalog, ["dense", "moe-48x8"], run_id="run-1")
        assert_same_trajectory(dense, by_id[0])
        assert_same_trajectory(trajectories[0], by_id[1])
        assert by_id[1].segments[0].routed_experts.shape == (257, 48, 8)
        counts = catalog.one("SELECT count(*), sum(num_tokens) FROM segments")
        assert counts == (2 + 3 + 2 + 0, 2 * 257 + 3 * 100 + 64)
        assert catalog.one("SELECT temperature FROM rollouts WHERE rollout_id = 'dense'") == (0.7,)


def test_outcomes_tasks_steps_round_trip(work):
    writer = DatasetWriter(work, "run-1")
    outcomes = [
        Outcome("r1", "t1", OutcomeKind.resolved, evidence={"tests": {"a": "PASSED"}}, test_log="ok", exit_code=0),
        Outcome("r2", "t1", OutcomeKind.cheat, cheat_rules=["tests_modified"], exit_code=1),
        Outcome("r3", "t1", OutcomeKind.infra_error, evidence={"error": "docker died"}, attempts=3),
    ]
    writer.append_outcomes(outcomes, iteration=0)
    task = Task(instance_id="pkg__1", repo="org/pkg", base_commit="abc", problem_statement="fix it",
                FAIL_TO_PASS=["t::a"], PASS_TO_PASS=["t::b"], provenance={"source": "synth"}, custom_field=3)
    writer.append_tasks([task])
    writer.append_train_steps([TrainStep(step=0, policy_version=1, loss=0.25, num_sequences=4, num_tokens=900,
                                         metrics={"grad_norm": 1.5})], iteration=0)
    writer.append_eval_results([EvalResult("pkg__1", "mini-swe-agent", 1, OutcomeKind.resolved, "e1")], iteration=0)
    with Catalog.open(work) as catalog:
        back = read_outcomes(catalog, "run-1")
        assert sorted(back, key=lambda o: o.rollout_id) == outcomes
        rewards = dict(catalog.sql("SELECT rollout_id, reward FROM outcomes").fetchall())
        assert rewards == {"r1": 1.0, "r2": 0.0, "r3": None}
        assert read_tasks(catalog, "run-1") == [task]
        assert catalog.one("SELECT metrics['grad_norm'] FROM train_steps") == (1.5,)
        assert catalog.one("SELECT resolved_rate FROM eval_summary") == (1.0,)


def test_streaming_reader_yields_batches_of_the_configured_size(work):
    rng = np.random.default_rng(2)
    writer = DatasetWriter(work, "run-1", row_group_bytes=8_000)  # several row groups per file
    for part in range(2):
        writer.append_trajectories([
            synthetic_trajectory(rng, f"r{part}-{i}", "t", segments=1, tokens_per_segment=300) for i in range(5)
        ])
    with Catalog.open(work) as catalog:
        files = catalog.files("segments")
        assert len(files) == 2 and all(pq.ParquetFile(f).num_row_groups > 1 for f in files)
        sizes = [batch.num_rows for batch in iter_segment_batches(catalog, "run-1", batch_size=3)]
        assert sizes == [3, 3, 3, 1]
        # the trajectory reader streams the same way and still returns every trajectory whole
        assert len(list(iter_trajectories(catalog, batch_size=1))) == 10


def test_catalog_views_see_files_written_after_opening(work):
    with Catalog.open(work) as catalog:
        assert catalog.one("SELECT count(*) FROM rollouts") == (0,)
        DatasetWriter(work, "late").append_trajectories(
            [synthetic_trajectory(np.random.default_rng(0), "r", "t", tokens_per_segment=10)])
        assert catalog.one("SELECT count(*) FROM rollouts") == (1,)
    assert work.catalog.exists()
