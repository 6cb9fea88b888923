"""Malformed records are rejected before anything is written, with an error naming the record and the field."""

from __future__ import annotations

import numpy as np
import pytest

from lego.data.catalog import Catalog
from lego.data.codec import DataValidationError, EvalResult
from lego.data.schema import DataLayoutError
from lego.data.synthetic import synthetic_trajectory
from lego.data.writer import DatasetWriter
from lego.records import Outcome, OutcomeKind
from lego.workdir import WorkDir


def trajectory(rollout_id: str = "r1"):
    return synthetic_trajectory(np.random.default_rng(0), rollout_id, "t1", segments=2, tokens_per_segment=20)


def break_segment(field: str, value):
    bad = trajectory()
    setattr(bad.segments[1], field, value)
    return bad


@pytest.mark.parametrize(("bad", "pattern"), [
    (break_segment("logprobs", np.zeros(19, np.float32)),
     r"trajectory 'r1' segment 1: field 'logprobs' has 19 entries for 20 token_ids"),
    (break_segment("token_ids", np.zeros(20, np.int64)),
     r"trajectory 'r1' segment 1: field 'token_ids' has dtype int64, expected int32"),
    (break_segment("routed_experts", np.zeros((20, 2, 2), np.int16)),
     r"segment 1: field 'routed_experts' has dtype int16, expected uint8"),
    (break_segment("routed_experts", np.zeros((19, 2, 2), np.uint8)),
     r"segment 1: field 'routed_experts' has shape \(19, 2, 2\) for 20 tokens"),
    (break_segment("routed_experts", np.zeros((20, 4), np.uint8)),
     r"segment 1: field 'routed_experts' has shape \(20, 4\), expected 3 dimension"),
    (break_segment("response_mask", np.full(20, 2, np.uint8)),
     r"segment 1: field 'response_mask' has values other than 0 and 1"),
    (break_segment("logprobs", np.full(20, np.nan, np.float32)),
     r"segment 1: field 'logprobs' has NaN"),
    (break_segment("token_ids", [1] * 20),
     r"segment 1: field 'token_ids' is a list, not a numpy array"),
])
def test_malformed_segments_are_rejected(tmp_path, bad, pattern):
    writer = DatasetWriter(WorkDir(tmp_path), "run")
    with pytest.raises(DataValidationError, match=pattern):
        writer.append_trajectories([trajectory("good"), bad])
    with Catalog.open(WorkDir(tmp_path)) as catalog:  # nothing of the batch was written
        assert catalog.one("SELECT count(*) FROM segments") == (0,)
        assert catalog.files("rollouts") == []


def test_malformed_trajectories_and_outcomes_are_rejected(tmp_path):
    writer = DatasetWriter(WorkDir(tmp_path), "run")
    bad = trajectory()
    bad.termination = "exploded"
    with pytest.raises(DataValidationError, match=r"trajectory 'r1': field 'termination' is 'exploded'.*completed"):
        writer.append_trajectories([bad])
    bad = trajectory()
    bad.metadata = {"when": object()}
    with pytest.raises(DataValidationError, match=r"trajectory 'r1': field 'metadata' is not JSON-serializable"):
        writer.append_trajectories([bad])
    with pytest.raises(DataValidationError, match=r"'r1' appears twice"):
        writer.append_trajectories([trajectory(), trajectory()])
    with pytest.raises(DataValidationError,
                       match=r"outcome of rollout 'r9': field 'kind' is 'passed', not a known OutcomeKind; use one of"):
        writer.append_outcomes([Outcome("r8", "t", OutcomeKind.resolved), Outcome("r9", "t", "passed")], iteration=0)
    with pytest.raises(DataValidationError, match=r"outcome of rollout 'r8': field 'attempts' is 0"):
        writer.append_outcomes([Outcome("r8", "t", OutcomeKind.resolved, attempts=0)], iteration=0)
    with pytest.raises(DataValidationError, match=r"eval result of task 't': field 'kind' is 'ok'"):
        writer.append_eval_results([EvalResult("t", "h", 0, "ok")], iteration=0)
    with pytest.raises(DataLayoutError, match=r"run id '../x' is not usable"):
        DatasetWriter(WorkDir(tmp_path), "../x")
    with Catalog.open(WorkDir(tmp_path)) as catalog:
        assert catalog.one("SELECT count(*) FROM outcomes") == (0,)
