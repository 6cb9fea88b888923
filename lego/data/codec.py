"""Records <-> Arrow: validation on the way in (a clear error naming the record and the field), exact
rebuilds on the way out (same arrays, dtypes and shapes)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa

from lego.data.schema import SCHEMAS
from lego.errors import LegoError
from lego.records import (
    REWARD,
    LLMCall,
    Outcome,
    OutcomeKind,
    Segment,
    SegmentReason,
    TerminationReason,
    Trajectory,
)
from lego.tasksets.task import Task


class DataValidationError(LegoError):
    """A record cannot be stored as given; the message names the record, the field and the fix."""


@dataclass
class TrainStep:
    """One optimizer step of the trainer, as the train stage records it."""

    step: int
    policy_version: int
    loss: float
    num_sequences: int
    num_tokens: int
    duration_s: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class EvalResult:
    """One graded evaluation attempt of one task by one harness at one policy version."""

    task_id: str
    harness: str
    policy_version: int
    kind: OutcomeKind
    rollout_id: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def resolved(self) -> bool:
        return self.kind == OutcomeKind.resolved


# ---------------------------------------------------------------------------------------------------- checks


def _fail(where: str, field_name: str, problem: str, fix: str) -> DataValidationError:
    return DataValidationError(f"{where}: field {field_name!r} {problem}; {fix}")


def _check_array(where: str, name: str, value: Any, dtype: np.dtype, ndim: int) -> None:
    if not isinstance(value, np.ndarray):
        raise _fail(where, name, f"is a {type(value).__name__}, not a numpy array",
                    f"pass np.asarray(values, dtype=np.{dtype.name})")
    if value.dtype != dtype:
        raise _fail(where, name, f"has dtype {value.dtype}, expected {dtype.name}",
                    f"convert it with .astype(np.{dtype.name}) where the values fit")
    if value.ndim != ndim:
        raise _fail(where, name, f"has shape {value.shape}, expected {ndim} dimension(s)",
                    "store one row per token")


def _check_str(where: str, name: str, value: Any, allow_empty: bool = False) -> None:
    if not isinstance(value, str) or (not allow_empty and not value):
        raise _fail(where, name, f"is {value!r}", "it must be a non-empty string" if not allow_empty
                    else "it must be a string")


def _check_int(where: str, name: str, value: Any, minimum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or (
        minimum is not None and value < minimum
    ):
        bound = f" >= {minimum}" if minimum is not None else ""
        raise _fail(where, name, f"is {value!r}", f"it must be an integer{bound}")


def _check_enum(where: str, name: str, value: Any, enum: type) -> Any:
    try:
        return enum(value)
    except ValueError:
        choices = ", ".join(member.value for member in enum)
        raise _fail(where, name, f"is {value!r}, not a known {enum.__name__}", f"use one of: {choices}") from None


def _json(where: str, name: str, value: Any) -> str:
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise _fail(where, name, f"is not JSON-serializable ({exc})",
                    "store only strings, numbers, booleans, lists and dicts there") from None


def _metrics(where: str, name: str, value: Any) -> list[tuple[str, float]]:
    if not isinstance(value, dict):
        raise _fail(where, name, f"is a {type(value).__name__}", "it must be a dict of name -> number")
    items = []
    for key, number in value.items():
        if not isinstance(key, str) or isinstance(number, bool) or not isinstance(number, int | float | np.number):
            raise _fail(where, name, f"has the entry {key!r}: {number!r}", "keys must be strings, values numbers")
        items.append((key, float(number)))
    return items


def validate_segment(segment: Any, where: str) -> None:
    if not isinstance(segment, Segment):
        raise DataValidationError(f"{where} is a {type(segment).__name__}, not a lego.records.Segment")
    _check_array(where, "token_ids", segment.token_ids, np.dtype(np.int32), 1)
    _check_array(where, "response_mask", segment.response_mask, np.dtype(np.uint8), 1)
    _check_array(where, "logprobs", segment.logprobs, np.dtype(np.float32), 1)
    n = len(segment.token_ids)
    for name in ("response_mask", "logprobs"):
        if len(getattr(segment, name)) != n:
            raise _fail(where, name, f"has {len(getattr(segment, name))} entries for {n} token_ids",
                        "the arrays of a segment must have one entry per token")
    if n and segment.response_mask.max() > 1:
        raise _fail(where, "response_mask", "has values other than 0 and 1", "mark sampled tokens 1, others 0")
    if n and not np.isfinite(segment.logprobs).all():
        raise _fail(where, "logprobs", "has NaN or infinite values", "store the engine's finite log-probs")
    if segment.routed_experts is not None:
        _check_array(where, "routed_experts", segment.routed_experts, np.dtype(np.uint8), 3)
        rows, layers, top_k = segment.routed_experts.shape
        if rows != n or layers < 1 or top_k < 1:
            raise _fail(where, "routed_experts", f"has shape {segment.routed_experts.shape} for {n} tokens",
                        "it must be [tokens, layers, top_k] with one row per token")
    _check_enum(where, "reason", segment.reason, SegmentReason)
    _check_str(where, "thread", segment.thread)


def _rollout_record(record: Any, kind: type, label: str) -> str:
    """Where a record of one rollout is, for messages, once it is of `kind` and names its rollout and task."""
    if not isinstance(record, kind):
        raise DataValidationError(f"expected a lego.records.{kind.__name__}, got {type(record).__name__}")
    where = f"{label} {getattr(record, 'rollout_id', '?')!r}"
    _check_str(where, "rollout_id", record.rollout_id)
    _check_str(where, "task_id", record.task_id)
    return where


def validate_trajectory(trajectory: Any) -> None:
    where = _rollout_record(trajectory, Trajectory, "trajectory")
    _check_str(where, "harness", trajectory.harness, allow_empty=True)
    _check_int(where, "policy_version", trajectory.policy_version, 0)
    _check_int(where, "iteration", trajectory.iteration, 0)
    _check_int(where, "sample_index", trajectory.sample_index, 0)
    _check_enum(where, "termination", trajectory.termination, TerminationReason)
    _check_str(where, "final_diff", trajectory.final_diff, allow_empty=True)
    _check_str(where, "harness_log", trajectory.harness_log, allow_empty=True)
    if trajectory.error is not None:
        _check_str(where, "error", trajectory.error, allow_empty=True)
    _metrics(where, "timings", trajectory.timings)
    _json(where, "metadata", trajectory.metadata)
    for index, segment in enumerate(trajectory.segments):
        validate_segment(segment, f"{where} segment {index}")
    for index, call in enumerate(trajectory.calls):
        if not isinstance(call, LLMCall):
            raise DataValidationError(f"{where} call {index} is a {type(call).__name__}, not a lego.records.LLMCall")
        _check_int(f"{where} call {index}", "call_index", call.call_index, 0)
        _check_str(f"{where} call {index}", "protocol", call.protocol)
        for name in ("thread", "request_json", "reply_json"):
            _check_str(f"{where} call {index}", name, getattr(call, name), allow_empty=True)


def validate_outcome(outcome: Any) -> OutcomeKind:
    where = _rollout_record(outcome, Outcome, "outcome of rollout")
    kind = _check_enum(where, "kind", outcome.kind, OutcomeKind)
    if not isinstance(outcome.cheat_rules, list) or not all(isinstance(rule, str) for rule in outcome.cheat_rules):
        raise _fail(where, "cheat_rules", f"is {outcome.cheat_rules!r}", "it must be a list of rule names")
    if outcome.exit_code is not None:
        _check_int(where, "exit_code", outcome.exit_code)
    _check_int(where, "attempts", outcome.attempts, 1)
    _check_str(where, "test_log", outcome.test_log, allow_empty=True)
    _json(where, "evidence", outcome.evidence)
    return kind


# ---------------------------------------------------------------------------------------------------- to Arrow


def _keys(n: int, run_id: str, stage: str, iterations: Sequence[int], written_at: datetime) -> dict[str, pa.Array]:
    return {
        "run_id": pa.array([run_id] * n, pa.string()),
        "stage": pa.array([stage] * n, pa.string()),
        "iteration": pa.array(list(iterations), pa.int32()),
        "written_at": pa.array([written_at] * n, pa.timestamp("us", tz="UTC")),
    }


def _table(name: str, columns: dict[str, Any]) -> pa.Table:
    schema = SCHEMAS[name]
    return pa.Table.from_arrays([columns[field.name] for field in schema], schema=schema)


def _list_array(arrays: Sequence[np.ndarray], value_type: pa.DataType) -> pa.Array:
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum([len(array) for array in arrays], out=offsets[1:])
    values = np.concatenate(arrays) if arrays else np.zeros(0, dtype=value_type.to_pandas_dtype())
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, value_type))


def _blob_array(arrays: Sequence[np.ndarray | None]) -> pa.Array:
    valid = np.array([array is not None for array in arrays], dtype=bool)
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([0 if array is None else array.nbytes for array in arrays], out=offsets[1:])
    present = [np.ascontiguousarray(array).reshape(-1) for array in arrays if array is not None]
    data = np.concatenate(present) if present else np.zeros(0, dtype=np.uint8)
    null_count = int((~valid).sum())
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if null_count else None
    return pa.Array.from_buffers(pa.large_binary(), len(arrays),
                                 [validity, pa.py_buffer(offsets), pa.py_buffer(data)], null_count)


def segments_table(trajectories: Sequence[Trajectory], run_id: str, stage: str, written_at: datetime) -> pa.Table:
    rows = [(trajectory, index, segment) for trajectory in trajectories
            for index, segment in enumerate(trajectory.segments)]
    segments = [segment for _, _, segment in rows]
    routing = [segment.routed_experts for segment in segments]
    columns = _keys(len(rows), run_id, stage, [t.iteration for t, _, _ in rows], written_at)
    columns.update({
        "rollout_id": pa.array([t.rollout_id for t, _, _ in rows], pa.string()),
        "task_id": pa.array([t.task_id for t, _, _ in rows], pa.string()),
        "segment_index": pa.array([index for _, index, _ in rows], pa.int32()),
        "thread": pa.array([s.thread for s in segments], pa.string()),
        "reason": pa.array([str(SegmentReason(s.reason)) for s in segments], pa.string()),
        "num_tokens": pa.array([s.num_tokens for s in segments], pa.int32()),
        "num_response_tokens": pa.array([s.num_sampled for s in segments], pa.int32()),
        "token_ids": _list_array([s.token_ids for s in segments], pa.int32()),
        "response_mask": _list_array([s.response_mask for s in segments], pa.uint8()),
        "logprobs": _list_array([s.logprobs for s in segments], pa.float32()),
        "routed_experts": _blob_array(routing),
        "routing_layers": pa.array([None if r is None else r.shape[1] for r in routing], pa.int16()),
        "routing_top_k": pa.array([None if r is None else r.shape[2] for r in routing], pa.int16()),
    })
    return _table("segments", columns)


def rollouts_table(trajectories: Sequence[Trajectory], run_id: str, stage: str, written_at: datetime) -> pa.Table:
    def temperature(trajectory: Trajectory) -> float | None:
        value = trajectory.metadata.get("temperature")
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    ts = list(trajectories)
    columns = _keys(len(ts), run_id, stage, [t.iteration for t in ts], written_at)
    columns.update({
        "rollout_id": pa.array([t.rollout_id for t in ts], pa.string()),
        "task_id": pa.array([t.task_id for t in ts], pa.string()),
        "harness": pa.array([t.harness for t in ts], pa.string()),
        "policy_version": pa.array([int(t.policy_version) for t in ts], pa.int32()),
        "sample_index": pa.array([int(t.sample_index) for t in ts], pa.int32()),
        "temperature": pa.array([temperature(t) for t in ts], pa.float64()),
        "termination": pa.array([str(TerminationReason(t.termination)) for t in ts], pa.string()),
        "final_diff": pa.array([t.final_diff for t in ts], pa.string()),
        "harness_log": pa.array([t.harness_log for t in ts], pa.string()),
        "error": pa.array([t.error for t in ts], pa.string()),
        "timings": pa.array([_metrics("", "timings", t.timings) for t in ts], SCHEMAS["rollouts"].field("timings").type),
        "metadata_json": pa.array([json.dumps(t.metadata) for t in ts], pa.string()),
        "num_segments": pa.array([len(t.segments) for t in ts], pa.int32()),
        "num_calls": pa.array([len(t.calls) for t in ts], pa.int32()),
        "num_turns": pa.array([t.num_turns for t in ts], pa.int32()),
        "num_tokens": pa.array([sum(s.num_tokens for s in t.segments) for t in ts], pa.int64()),
        "num_response_tokens": pa.array([sum(s.num_sampled for s in t.segments) for t in ts], pa.int64()),
    })
    return _table("rollouts", columns)


def llm_calls_table(trajectories: Sequence[Trajectory], run_id: str, stage: str, written_at: datetime) -> pa.Table:
    rows = [(t, call) for t in trajectories for call in t.calls]
    calls = [call for _, call in rows]
    columns = _keys(len(rows), run_id, stage, [t.iteration for t, _ in rows], written_at)
    columns["rollout_id"] = pa.array([t.rollout_id for t, _ in rows], pa.string())
    for field_ in SCHEMAS["llm_calls"]:
        if field_.name not in columns:
            columns[field_.name] = pa.array([getattr(call, field_.name) for call in calls], field_.type)
    return _table("llm_calls", columns)


def outcomes_table(outcomes: Sequence[Outcome], run_id: str, stage: str, iteration: int,
                   written_at: datetime) -> pa.Table:
    kinds = [validate_outcome(outcome) for outcome in outcomes]
    columns = _keys(len(outcomes), run_id, stage, [iteration] * len(outcomes), written_at)
    columns.update({
        "rollout_id": pa.array([o.rollout_id for o in outcomes], pa.string()),
        "task_id": pa.array([o.task_id for o in outcomes], pa.string()),
        "kind": pa.array([str(kind) for kind in kinds], pa.string()),
        "reward": pa.array([REWARD[kind] for kind in kinds], pa.float64()),
        "is_cheat": pa.array([kind == OutcomeKind.cheat for kind in kinds], pa.bool_()),
        "cheat_rules": pa.array([list(o.cheat_rules) for o in outcomes], pa.list_(pa.string())),
        "evidence_json": pa.array([json.dumps(o.evidence) for o in outcomes], pa.string()),
        "test_log": pa.array([o.test_log for o in outcomes], pa.string()),
        "exit_code": pa.array([o.exit_code for o in outcomes], pa.int32()),
        "attempts": pa.array([o.attempts for o in outcomes], pa.int32()),
    })
    return _table("outcomes", columns)


def tasks_table(tasks: Sequence[Task], run_id: str, stage: str, iteration: int, written_at: datetime) -> pa.Table:
    for index, task in enumerate(tasks):
        if not isinstance(task, Task):
            raise DataValidationError(f"task {index} is a {type(task).__name__}, not a lego.tasksets.task.Task")
    columns = _keys(len(tasks), run_id, stage, [iteration] * len(tasks), written_at)
    for name in ("instance_id", "repo", "base_commit", "split", "version", "difficulty", "problem_statement",
                 "patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS"):
        columns[name] = pa.array([getattr(task, name) for task in tasks], SCHEMAS["tasks"].field(name).type)
    columns["environment_kind"] = pa.array([task.environment.kind for task in tasks], pa.string())
    columns["task_json"] = pa.array([task.model_dump_json() for task in tasks], pa.string())
    return _table("tasks", columns)


def train_steps_table(steps: Sequence[TrainStep], run_id: str, stage: str, iteration: int,
                      written_at: datetime) -> pa.Table:
    for step in steps:
        where = f"train step {getattr(step, 'step', '?')!r}"
        if not isinstance(step, TrainStep):
            raise DataValidationError(f"{where} is a {type(step).__name__}, not a lego.data.codec.TrainStep")
        _check_int(where, "step", step.step, 0)
        if not isinstance(step.loss, int | float) or not math.isfinite(step.loss):
            raise _fail(where, "loss", f"is {step.loss!r}", "it must be a finite number")
    columns = _keys(len(steps), run_id, stage, [iteration] * len(steps), written_at)
    for field_ in SCHEMAS["train_steps"]:
        if field_.name == "metrics":
            columns["metrics"] = pa.array([_metrics(f"train step {s.step}", "metrics", s.metrics) for s in steps],
                                          field_.type)
        elif field_.name not in columns:
            columns[field_.name] = pa.array([getattr(s, field_.name) for s in steps], field_.type)
    return _table("train_steps", columns)


def eval_results_table(results: Sequence[EvalResult], run_id: str, stage: str, iteration: int,
                       written_at: datetime) -> pa.Table:
    kinds = []
    for result in results:
        where = f"eval result of task {getattr(result, 'task_id', '?')!r}"
        if not isinstance(result, EvalResult):
            raise DataValidationError(f"{where} is a {type(result).__name__}, not a lego.data.codec.EvalResult")
        _check_str(where, "task_id", result.task_id)
        kinds.append(_check_enum(where, "kind", result.kind, OutcomeKind))
    columns = _keys(len(results), run_id, stage, [iteration] * len(results), written_at)
    columns.update({
        "policy_version": pa.array([r.policy_version for r in results], pa.int32()),
        "harness": pa.array([r.harness for r in results], pa.string()),
        "task_id": pa.array([r.task_id for r in results], pa.string()),
        "rollout_id": pa.array([r.rollout_id for r in results], pa.string()),
        "kind": pa.array([str(kind) for kind in kinds], pa.string()),
        "resolved": pa.array([kind == OutcomeKind.resolved for kind in kinds], pa.bool_()),
        "reward": pa.array([REWARD[kind] for kind in kinds], pa.float64()),
        "metrics": pa.array([_metrics("eval result", "metrics", r.metrics) for r in results],
                            SCHEMAS["eval_results"].field("metrics").type),
    })
    return _table("eval_results", columns)


# ---------------------------------------------------------------------------------------------------- from Arrow


def _list_values(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(flat values, offsets) of a list column, without a per-row Python object."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = column.offsets.to_numpy()
    return column.values.to_numpy(zero_copy_only=False), offsets


def segments_from_batch(batch: pa.RecordBatch | pa.Table) -> list[tuple[str, int, Segment]]:
    """(rollout_id, segment_index, Segment) per row; arrays are fresh, writable copies."""
    n = batch.num_rows
    if n == 0:
        return []
    tokens, token_offsets = _list_values(batch.column("token_ids"))
    mask, mask_offsets = _list_values(batch.column("response_mask"))
    logprobs, logprob_offsets = _list_values(batch.column("logprobs"))
    routing = batch.column("routed_experts")
    routing = routing.combine_chunks() if isinstance(routing, pa.ChunkedArray) else routing
    layers = batch.column("routing_layers").to_pylist()
    top_k = batch.column("routing_top_k").to_pylist()
    rollout_ids = batch.column("rollout_id").to_pylist()
    indices = batch.column("segment_index").to_pylist()
    threads = batch.column("thread").to_pylist()
    reasons = batch.column("reason").to_pylist()
    out = []
    for i in range(n):
        count = int(token_offsets[i + 1] - token_offsets[i])
        routed = None
        if routing[i].is_valid:
            routed = np.frombuffer(routing[i].as_buffer(), dtype=np.uint8).reshape(count, layers[i], top_k[i]).copy()
        segment = Segment(
            token_ids=tokens[token_offsets[i]:token_offsets[i + 1]].copy(),
            response_mask=mask[mask_offsets[i]:mask_offsets[i + 1]].copy(),
            logprobs=logprobs[logprob_offsets[i]:logprob_offsets[i + 1]].copy(),
            routed_experts=routed,
            reason=SegmentReason(reasons[i]),
            thread=threads[i],
        )
        out.append((rollout_ids[i], indices[i], segment))
    return out


def call_from_row(row: dict[str, Any]) -> LLMCall:
    """A call record; a column that files written before it existed lack (NULL) gets the field's default."""
    values = {}
    for name, spec in LLMCall.__dataclass_fields__.items():
        value = row.get(name)
        values[name] = spec.default if value is None and spec.default is not MISSING else value
    return LLMCall(**values)


def trajectory_from_row(row: dict[str, Any], segments: list[Segment], calls: list[LLMCall]) -> Trajectory:
    return Trajectory(
        rollout_id=row["rollout_id"],
        task_id=row["task_id"],
        harness=row["harness"],
        policy_version=row["policy_version"],
        iteration=row["iteration"],
        sample_index=row["sample_index"],
        segments=segments,
        calls=calls,
        final_diff=row["final_diff"],
        termination=TerminationReason(row["termination"]),
        timings=dict(row["timings"] or []),
        harness_log=row["harness_log"],
        error=row["error"],
        metadata=json.loads(row["metadata_json"]),
    )


def outcome_from_row(row: dict[str, Any]) -> Outcome:
    return Outcome(
        rollout_id=row["rollout_id"],
        task_id=row["task_id"],
        kind=OutcomeKind(row["kind"]),
        cheat_rules=list(row["cheat_rules"] or []),
        evidence=json.loads(row["evidence_json"]),
        test_log=row["test_log"],
        exit_code=row["exit_code"],
        attempts=row["attempts"],
    )


def task_from_row(row: dict[str, Any]) -> Task:
    return Task.model_validate_json(row["task_json"])
