"""Every rollout as an MLflow trace, in the tracking store the runs use (SQLite under the work dir by default), so a
user reads any trajectory in MLflow's own trace viewer.

A trace per rollout, written from the stored records when a stage's result is recorded (PipelineRun.record, after
the stage: what a stage stores is unchanged by tracing, and this module stays out of the stages' content keys), for
the rollouts of the rollout, evaluate, baseline, filter and warm-start stages (`stage_trace_targets`):
- a root span (AGENT) `<task> #<sample>` from the rollout's start to its end: task, harness and policy in, the
  termination, final diff, error and the harness log's tail out;
- a span per LLM call (CHAT_MODEL) at the call's recorded start and latency: the request's messages as the harness
  sent them (OpenAI chat form, whatever the protocol; the tools too, on the first call of a thread and whenever they
  change) in, the reply as a chat completion out, with the token usage; attributes give the call kind
  (start/extend/rewrite/subagent), the thread, the segment, prompt/new/sampled token counts, latency, finish
  reason and protocol. A sub-agent's calls are grouped under a span of that sub-agent;
- a span per grading (EVALUATOR), appended to the same trace by the verify stage (MLflow's SQL store takes spans for
  an existing trace: `log_spans` upserts by trace id): outcome kind, reward, the rules that fired, the check, the
  test log's tail; the trace then carries the `lego.outcome` tag. Its end is when the outcome was stored, its start
  that minus the grading's measured seconds (the grader records no start time).
Tags: lego.run_id, lego.stage, lego.iteration, lego.data_run_id, lego.rollout_id, lego.task_id, lego.sample_index,
lego.harness, lego.policy_version, lego.termination (then lego.outcome, lego.reward, lego.cheat_rules). Each trace
is linked to the MLflow run of the stage that ran the rollout (`mlflow.sourceRun`: that run's Traces tab lists
them; `lego compare` links each evaluation to its run's).

Traces are written through MLflow's TracingClient with explicit span times and ids rather than the fluent tracing
API, which stamps spans with the time they are created, keeps global state (active experiment, tracking URI) and
exports in the background. Trace ids derive from (experiment, rollout id): writing a rollout again (a resumed or
forced stage) replaces its trace instead of adding another, and the verify stage finds the trace without a search.

Writing traces never fails a stage: an MLflow error is logged as a warning and counted in the stage run's
`traces_failed` metric (beside `traces_logged`; the pipeline run gets `<stage>.traces_failed`).
`tracking.traces: false` turns them off. The token data stays in the Parquet datasets; a trace holds text, counts
and times only. Each call's span holds its whole request, as MLflow's viewer needs, so a trace grows with the square
of its conversation's length (measured: 100 turns of 2 KB tool output, 12 MB of SQLite; 25 turns, 0.9 MB), while
the llm_calls Parquet stores each message once (155 KB and 42 KB).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from lego.config import LegoConfig
from lego.errors import LegoError, tail
from lego.records import REWARD, ChatRequest, LLMCall, Outcome, OutcomeKind, Trajectory, expand_requests
from lego.workdir import WorkDir

if TYPE_CHECKING:
    from mlflow.entities import Span, TraceInfo

    from lego.track.tracker import Tracker

log = logging.getLogger(__name__)

DIFF_LIMIT = 50_000  # characters of the final diff a root span shows (verify.max_patch_bytes may allow more)
TEST_LOG_TAIL = 10_000
HARNESS_LOG_TAIL = 4_000
PREVIEW_CHARS = 1_000  # what MLflow shows of a trace's request and response in its list
WARNINGS_SHOWN = 3  # failures logged in full per stage; the rest are counted
LOCAL_UI_URL = "http://127.0.0.1:5000"  # where `lego server` serves MLflow's UI for a local store


class TracesUnsupportedError(LegoError):
    """The tracking store cannot hold spans."""


class TraceContext(BaseModel):
    """What a stage's traces are tagged with."""

    run_id: str  # the pipeline run
    stage: str  # the pipeline stage that ran the rollouts (rollout, evaluate, baseline, filter)
    iteration: int
    data_run_id: str
    source_run: str | None = None  # the MLflow run the traces are linked to (the stage's)
    model: str = ""


class TraceCounts(BaseModel):
    logged: int = 0
    failed: int = 0

    def metrics(self) -> dict[str, float]:
        return {"traces_logged": float(self.logged), "traces_failed": float(self.failed)}


# ------------------------------------------------------------------------------------------------------- ids


def _int_id(text: str, bits: int) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=bits // 8).digest(), "big") or 1


def _otel_trace_id(experiment_id: str, rollout_id: str) -> int:
    return _int_id(f"{experiment_id}/{rollout_id}", 128)


def rollout_trace_id(experiment_id: str, rollout_id: str) -> str:
    """The MLflow trace id of a rollout's trace in an experiment."""
    from mlflow.tracing.utils import generate_mlflow_trace_id_from_otel_trace_id

    return generate_mlflow_trace_id_from_otel_trace_id(_otel_trace_id(experiment_id, rollout_id))


# ------------------------------------------------------------------------------------------------------- spans


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


class _Spans:
    """Builds the immutable spans of one trace (ids derived from the trace and a per-span key)."""

    def __init__(self, experiment_id: str, rollout_id: str) -> None:
        from mlflow.tracing.utils import generate_mlflow_trace_id_from_otel_trace_id

        self.otel_trace = _otel_trace_id(experiment_id, rollout_id)
        self.trace_id = generate_mlflow_trace_id_from_otel_trace_id(self.otel_trace)

    def span_id(self, key: str) -> int:
        return _int_id(f"{self.otel_trace}/{key}", 64)

    def make(self, key: str, name: str, span_type: str, start_ns: int, end_ns: int, *, parent: int | None,
             inputs: Any, outputs: Any, attributes: dict[str, Any], error: str | None = None) -> Span:
        from mlflow.entities import Span, SpanStatus, SpanStatusCode
        from mlflow.tracing.constant import SpanAttributeKey
        from mlflow.tracing.utils import build_otel_context, dump_span_attribute_value
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import ReadableSpan

        values = {SpanAttributeKey.REQUEST_ID: self.trace_id, SpanAttributeKey.SPAN_TYPE: span_type,
                  SpanAttributeKey.INPUTS: inputs, SpanAttributeKey.OUTPUTS: outputs, **attributes}
        status = SpanStatus(SpanStatusCode.ERROR, tail(error)) if error else SpanStatus(SpanStatusCode.OK)
        otel = ReadableSpan(
            name=name, context=build_otel_context(self.otel_trace, self.span_id(key)),
            parent=build_otel_context(self.otel_trace, parent) if parent is not None else None,
            start_time=start_ns, end_time=max(start_ns, end_ns),
            attributes={k: dump_span_attribute_value(v) for k, v in values.items() if v is not None},
            status=status.to_otel_status(), resource=Resource.get_empty())
        return Span(otel)


def _thread_of(call: LLMCall) -> str:
    if call.thread:
        return call.thread
    return "subagent" if call.kind == "subagent" else "main"  # records from before the thread was kept


def _call_span(spans: _Spans, call: LLMCall, request: ChatRequest | None, tools_from: int | None, model: str,
               parent: int) -> Span:
    from mlflow.tracing.constant import SpanAttributeKey

    inputs: dict[str, Any] = {"model": model, "messages": request.messages if request else []}
    if request is not None and tools_from is None and request.tools:
        inputs["tools"] = request.tools
    usage = {"prompt_tokens": call.prompt_tokens, "completion_tokens": call.completion_tokens,
             "total_tokens": call.prompt_tokens + call.completion_tokens}
    outputs = None
    if call.error is None:
        reply = json.loads(call.reply_json) if call.reply_json else None
        outputs = {"object": "chat.completion", "model": model, "usage": usage,
                   "choices": [{"index": 0, "message": reply, "finish_reason": call.finish_reason}]}
    attributes: dict[str, Any] = {
        SpanAttributeKey.MESSAGE_FORMAT: "openai",
        SpanAttributeKey.CHAT_USAGE: {"input_tokens": call.prompt_tokens, "output_tokens": call.completion_tokens,
                                      "total_tokens": call.prompt_tokens + call.completion_tokens},
        "lego.call_index": call.call_index, "lego.kind": call.kind, "lego.thread": _thread_of(call),
        "lego.segment_index": call.segment_index, "lego.protocol": call.protocol, "lego.stream": call.stream,
        "lego.prompt_tokens": call.prompt_tokens, "lego.new_prompt_tokens": call.new_prompt_tokens,
        "lego.completion_tokens": call.completion_tokens, "lego.latency_s": call.latency_s,
        "lego.finish_reason": call.finish_reason,
    }
    if tools_from is not None:
        attributes["lego.tools_from_call"] = tools_from  # the same tools as that call's span shows
    if request is None:
        attributes["lego.request"] = "not recorded (a rollout stored before requests were kept)"
    start = _ns(call.started_at)
    return spans.make(f"call/{call.call_index}", f"call {call.call_index} {call.kind}", "CHAT_MODEL", start,
                      start + _ns(call.latency_s), parent=parent, inputs=inputs, outputs=outputs,
                      attributes=attributes, error=call.error)


def _first_user_text(requests: dict[int, ChatRequest]) -> str:
    for index in sorted(requests):
        for message in requests[index].messages:
            if message.get("role") == "user" and message.get("content"):
                return str(message["content"])
    return ""


def rollout_trace(experiment_id: str, trajectory: Trajectory, context: TraceContext,
                  ended_at: datetime | None = None) -> tuple[list[Span], TraceInfo]:
    """The spans and TraceInfo of a rollout's trace. `ended_at`: when the rollout was stored (its end)."""
    from mlflow.entities import TraceInfo, TraceLocation, TraceState
    from mlflow.tracing.constant import TraceMetadataKey, TraceTagKey

    spans = _Spans(experiment_id, trajectory.rollout_id)
    calls = sorted(trajectory.calls, key=lambda c: c.call_index)
    requests = expand_requests(calls)
    call_starts = [_ns(c.started_at) for c in calls]
    call_ends = [_ns(c.started_at) + _ns(c.latency_s) for c in calls]
    end = _ns(ended_at.timestamp()) if ended_at is not None else max(call_ends, default=None)
    total = trajectory.timings.get("total_s")
    start = end - _ns(total) if end is not None and total else min(call_starts, default=end)
    if end is None:  # no calls, no stored time: a record built in memory
        end = start = time.time_ns()
    start, end = min([start, *call_starts]), max([end, *call_ends])

    root_id = spans.span_id("root")
    diff = trajectory.final_diff
    outputs = {"termination": str(trajectory.termination), "error": trajectory.error,
               "final_diff": diff if len(diff) <= DIFF_LIMIT else diff[:DIFF_LIMIT] + f"\n[... {len(diff)} chars]",
               "harness_log_tail": tail(trajectory.harness_log, HARNESS_LOG_TAIL), "timings": trajectory.timings,
               "calls": len(calls), "turns": trajectory.num_turns}
    inputs = {"task_id": trajectory.task_id, "sample_index": trajectory.sample_index,
              "harness": trajectory.harness, "policy_version": trajectory.policy_version,
              "rollout_id": trajectory.rollout_id}
    out = [spans.make("root", f"{trajectory.task_id} #{trajectory.sample_index}", "AGENT", start, end,
                      parent=None, inputs=inputs, outputs=outputs,
                      attributes={"lego.termination": str(trajectory.termination)}, error=trajectory.error)]
    parents: dict[str, int] = {"main": root_id}
    for thread in sorted({_thread_of(c) for c in calls} - {"main"}):
        own = [i for i, c in enumerate(calls) if _thread_of(c) == thread]
        parents[thread] = spans.span_id(f"thread/{thread}")
        out.append(spans.make(f"thread/{thread}", thread, "AGENT", min(call_starts[i] for i in own),
                              max(call_ends[i] for i in own), parent=root_id, inputs={"thread": thread},
                              outputs={"calls": len(own)}, attributes={"lego.thread": thread}))
    tools_shown: dict[str, tuple[int, list]] = {}  # thread -> (call whose span shows its tools, the tools)
    for call in calls:
        thread, request = _thread_of(call), requests.get(call.call_index)
        tools_from = None
        if request is not None:
            shown = tools_shown.get(thread)
            if shown is not None and shown[1] == request.tools:
                tools_from = shown[0]
            else:
                tools_shown[thread] = (call.call_index, request.tools)
        out.append(_call_span(spans, call, request, tools_from, context.model, parents[thread]))

    tags = {TraceTagKey.TRACE_NAME: f"{trajectory.task_id} #{trajectory.sample_index}",
            "lego.run_id": context.run_id, "lego.stage": context.stage, "lego.iteration": str(context.iteration),
            "lego.data_run_id": context.data_run_id, "lego.rollout_id": trajectory.rollout_id,
            "lego.task_id": trajectory.task_id, "lego.sample_index": str(trajectory.sample_index),
            "lego.harness": trajectory.harness, "lego.policy_version": str(trajectory.policy_version),
            "lego.termination": str(trajectory.termination), "lego.calls": str(len(calls))}
    metadata = {TraceMetadataKey.SOURCE_RUN: context.source_run} if context.source_run else {}
    response = diff or trajectory.error or str(trajectory.termination)
    info = TraceInfo(trace_id=spans.trace_id, trace_location=TraceLocation.from_experiment_id(experiment_id),
                     request_time=start // 1_000_000, execution_duration=(end - start) // 1_000_000,
                     state=TraceState.ERROR if trajectory.error else TraceState.OK,
                     request_preview=(_first_user_text(requests) or trajectory.task_id)[:PREVIEW_CHARS],
                     response_preview=response[:PREVIEW_CHARS], trace_metadata=metadata, tags=tags)
    return out, info


def _grading_seconds(evidence: dict[str, Any]) -> float:
    seconds = evidence.get("grade_seconds")
    if isinstance(seconds, int | float):
        return float(seconds)
    runs = evidence.get("runs") or []
    return float(sum(run.get("seconds") or 0 for run in runs if isinstance(run, dict)))


def verification_span(experiment_id: str, outcome: Outcome, outcome_stage: str, graded_at: datetime) -> Span:
    """The span of one grading, a child of the rollout trace's root."""
    spans = _Spans(experiment_id, outcome.rollout_id)
    end = _ns(graded_at.timestamp())
    start = end - _ns(_grading_seconds(outcome.evidence))
    reward = REWARD[outcome.kind]
    check = (outcome.evidence or {}).get("check")
    outputs = {"kind": str(outcome.kind), "reward": reward, "cheat_rules": outcome.cheat_rules, "check": check,
               "exit_code": outcome.exit_code, "attempts": outcome.attempts,
               "test_log_tail": tail(outcome.test_log, TEST_LOG_TAIL), "evidence": outcome.evidence}
    attributes = {"lego.outcome": str(outcome.kind), "lego.reward": reward, "lego.cheat_rules": outcome.cheat_rules,
                  "lego.check": check, "lego.outcome_stage": outcome_stage,
                  "lego.timing": "end: when the outcome was stored; start: end minus the grading's measured seconds"}
    error = f"infrastructure failure ({check})" if outcome.kind == OutcomeKind.infra_error else None
    return spans.make(f"verification/{outcome_stage}", f"verification {outcome.kind.value}", "EVALUATOR", start, end,
                      parent=spans.span_id("root"),
                      inputs={"task_id": outcome.task_id, "rollout_id": outcome.rollout_id,
                              "outcome_stage": outcome_stage},
                      outputs=outputs, attributes=attributes, error=error)


# ------------------------------------------------------------------------------------------------------- writing


class TraceWriter:
    """Writes traces to one experiment of one tracking store (synchronously)."""

    def __init__(self, tracking_uri: str, experiment_id: str) -> None:
        from mlflow.tracing.client import TracingClient

        self.client = TracingClient(tracking_uri)
        self.tracking_uri = tracking_uri
        self.experiment_id = experiment_id

    @classmethod
    def for_tracker(cls, tracker: Tracker) -> TraceWriter:
        return cls(tracker.uri, tracker.experiment_id)

    def _log_spans(self, spans: list[Span]) -> None:
        try:
            self.client.log_spans(self.experiment_id, spans)
        except NotImplementedError:
            raise TracesUnsupportedError(
                f"the tracking store {self.tracking_uri} does not store spans; use a SQL store (sqlite:///..., the "
                "default) or an MLflow server, or set tracking.traces=false") from None

    def log_rollout(self, trajectory: Trajectory, context: TraceContext, ended_at: datetime | None = None) -> str:
        spans, info = rollout_trace(self.experiment_id, trajectory, context, ended_at)
        self._log_spans(spans)
        self.client.start_trace(info)  # tags, metadata, previews, state and times, as built
        return info.trace_id

    def has_trace(self, rollout_id: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_trace_info(rollout_trace_id(self.experiment_id, rollout_id))
        except MlflowException:
            return False
        return True

    def log_verification(self, outcome: Outcome, outcome_stage: str, graded_at: datetime) -> str:
        """Append a grading to its rollout's trace (which must exist: `has_trace`)."""
        self._log_spans([verification_span(self.experiment_id, outcome, outcome_stage, graded_at)])
        trace_id = rollout_trace_id(self.experiment_id, outcome.rollout_id)
        reward = REWARD[outcome.kind]
        tags = {"lego.outcome": outcome.kind.value, "lego.reward": "excluded" if reward is None else f"{reward:g}"}
        if outcome.cheat_rules:
            tags["lego.cheat_rules"] = ",".join(outcome.cheat_rules)
        self.client.set_trace_tags(trace_id, tags)
        return trace_id


# ------------------------------------------------------------------------------------------------------- stages


def _stored_rollouts(config: LegoConfig, work: WorkDir, data_run_id: str, data_stage: str, iteration: int,
                     only: set[str] | None = None) -> Iterator[tuple[Trajectory, datetime]]:
    """Stored rollouts with their calls (no token arrays) and when each was stored."""
    import pyarrow.parquet as pq

    from lego.data import codec
    from lego.data.catalog import Catalog
    from lego.data.schema import SCHEMAS

    with Catalog.open(work, config, in_memory=True) as catalog:
        files = catalog.files("rollouts", data_run_id, data_stage, iteration)
    for path in files:
        rows = [row for row in pq.read_table(path, schema=SCHEMAS["rollouts"]).to_pylist()
                if only is None or row["rollout_id"] in only]
        if not rows:
            continue
        calls: dict[str, list[LLMCall]] = defaultdict(list)
        calls_file = path.with_name("llm_calls-" + path.name.removeprefix("rollouts-"))
        if calls_file.exists():
            for row in pq.read_table(calls_file, schema=SCHEMAS["llm_calls"]).to_pylist():
                calls[row["rollout_id"]].append(codec.call_from_row(row))
        for row in rows:
            yield codec.trajectory_from_row(row, [], calls[row["rollout_id"]]), row["written_at"]


def _stored_outcomes(config: LegoConfig, work: WorkDir, data_run_id: str, outcome_stage: str,
                     iteration: int) -> list[tuple[Outcome, datetime]]:
    """The newest outcome of each graded rollout, with when it was stored."""
    import pyarrow.parquet as pq

    from lego.data import codec
    from lego.data.catalog import Catalog
    from lego.data.schema import SCHEMAS

    with Catalog.open(work, config, in_memory=True) as catalog:
        files: Sequence[Path] = catalog.files("outcomes", data_run_id, outcome_stage, iteration)
    newest: dict[str, dict[str, Any]] = {}
    for path in files:
        for row in pq.read_table(path, schema=SCHEMAS["outcomes"]).to_pylist():
            known = newest.get(row["rollout_id"])
            if known is None or row["written_at"] >= known["written_at"]:
                newest[row["rollout_id"]] = row
    return [(codec.outcome_from_row(row), row["written_at"]) for row in newest.values()]


class TraceTarget(BaseModel):
    """One set of stored rollouts (and maybe their gradings) a finished stage's traces come from."""

    stage: str  # the pipeline stage that ran the rollouts (the traces' lego.stage tag)
    iteration: int
    data_run_id: str
    data_stage: str  # the stage name the rollouts are stored under
    outcome_stage: str | None = None  # the gradings to append
    rollouts: bool = True  # write the rollouts' traces (False: the gradings only, for rollouts traced before)


def stage_trace_targets(stage: str, iteration: int | None, data: dict[str, Any]) -> list[TraceTarget]:
    """What a stage result names, from the `data` the stage modules of lego.pipeline put in it: the rollout stage
    its rollouts, verify the gradings of rollout's, evaluate/baseline/filter/warmstart their attempts and gradings
    (stored as `<stage>-verify`; evaluate and baseline store theirs under `evaluate`, each split its data run)."""
    it = iteration or 0
    if stage == "rollout":
        return [TraceTarget(stage=stage, iteration=it, data_run_id=data["data_run_id"], data_stage="rollout")]
    if stage == "verify":
        return [TraceTarget(stage="rollout", iteration=it, data_run_id=data["data_run_id"], data_stage="rollout",
                            outcome_stage=data["outcome_stage"], rollouts=False)]
    if stage in ("evaluate", "baseline"):
        return [TraceTarget(stage=stage, iteration=it, data_run_id=value, data_stage="evaluate",
                            outcome_stage="evaluate-verify")
                for key, value in sorted(data.items()) if key.startswith("data_run_id")]
    if stage in ("filter", "warmstart") and "data_run_id" in data:
        return [TraceTarget(stage=stage, iteration=0, data_run_id=data["data_run_id"], data_stage=stage,
                            outcome_stage=f"{stage}-verify")]
    return []


class _Failures:
    def __init__(self, what: str) -> None:
        self.what = what
        self.counts = TraceCounts()

    def record(self, subject: str, exc: Exception) -> None:
        self.counts.failed += 1
        if self.counts.failed <= WARNINGS_SHOWN:
            log.warning("%s: the MLflow trace of %s was not written (%s: %s); the stage goes on (set "
                        "tracking.traces=false to skip traces)", self.what, subject, type(exc).__name__, exc)

    def summary(self) -> TraceCounts:
        if self.counts.failed > WARNINGS_SHOWN:
            log.warning("%s: %d MLflow traces were not written (the first %d are logged above)", self.what,
                        self.counts.failed, WARNINGS_SHOWN)
        return self.counts


def log_target_traces(writer: TraceWriter, config: LegoConfig, work: WorkDir, target: TraceTarget, *, run_id: str,
                      source_run: str | None) -> TraceCounts:
    """Write the traces of one target's stored rollouts and append its gradings (a graded rollout whose trace is
    missing gets it first). Never raises: each failure is logged and counted."""
    failures = _Failures(f"{target.stage}/{target.iteration} ({target.data_run_id})")
    context = TraceContext(run_id=run_id, stage=target.stage, iteration=target.iteration,
                           data_run_id=target.data_run_id, source_run=source_run, model=config.model.name)

    def write(trajectory: Trajectory, ended_at: datetime) -> None:
        try:
            writer.log_rollout(trajectory, context, ended_at)
            failures.counts.logged += 1
        except Exception as exc:  # noqa: BLE001 - no MLflow error may fail a stage
            failures.record(f"rollout {trajectory.rollout_id}", exc)

    try:
        if target.rollouts:
            for trajectory, ended_at in _stored_rollouts(config, work, target.data_run_id, target.data_stage,
                                                         target.iteration):
                write(trajectory, ended_at)
        if target.outcome_stage is not None:
            outcomes = _stored_outcomes(config, work, target.data_run_id, target.outcome_stage, target.iteration)
            missing = {o.rollout_id for o, _ in outcomes if not writer.has_trace(o.rollout_id)}
            if missing:
                for trajectory, ended_at in _stored_rollouts(config, work, target.data_run_id, target.data_stage,
                                                             target.iteration, only=missing):
                    write(trajectory, ended_at)
            for outcome, graded_at in outcomes:
                try:
                    writer.log_verification(outcome, target.outcome_stage, graded_at)
                    failures.counts.logged += 1
                except Exception as exc:  # noqa: BLE001
                    failures.record(f"the grading of {outcome.rollout_id}", exc)
    except Exception as exc:  # noqa: BLE001 - reading the records, or the store failing on a lookup
        failures.record(f"the rollouts of {target.data_run_id}", exc)
    return failures.summary()


def log_result_traces(tracker: Tracker, *, run_id: str, stage: str, iteration: int | None, data: dict[str, Any],
                      stage_run: str, pipeline_run: str | None = None) -> dict[str, float]:
    """The traces of a freshly computed stage result, linked to its MLflow stage run, and their counts logged as
    that run's metrics traces_logged / traces_failed (and `<stage>.traces_*` on the pipeline run). Never raises.
    Returns the metrics ({} when tracking.traces is off or the stage ran no rollouts)."""
    targets = stage_trace_targets(stage, iteration, data) if tracker.config.tracking.traces else []
    if not targets:
        return {}
    total = TraceCounts()
    try:
        writer = TraceWriter.for_tracker(tracker)
    except Exception as exc:  # noqa: BLE001
        _Failures(f"{stage}/{iteration}").record("the stage's rollouts", exc)
        total.failed += 1
    else:
        for target in targets:
            counts = log_target_traces(writer, tracker.config, tracker.work, target, run_id=run_id,
                                       source_run=stage_run)
            total.logged += counts.logged
            total.failed += counts.failed
    metrics = total.metrics()
    try:
        tracker.log_metrics(stage_run, metrics, step=iteration or 0)
        if pipeline_run:
            tracker.log_metrics(pipeline_run, {f"{stage}.{k}": v for k, v in metrics.items()}, step=iteration or 0)
    except Exception as exc:  # noqa: BLE001
        log.warning("%s/%s: the trace counts %s were not logged to MLflow (%s: %s)", stage, iteration, metrics,
                    type(exc).__name__, exc)
    return metrics


# ------------------------------------------------------------------------------------------------------- links


def mlflow_ui_url(tracking_uri: str) -> str:
    """Where MLflow's UI for a tracking store is: the server itself, or `lego server`'s for a local store."""
    if tracking_uri.startswith(("http://", "https://")):
        return tracking_uri.rstrip("/")
    return LOCAL_UI_URL


def traces_filter(run_id: str, stage: str | None = None, iteration: int | str | None = None) -> str:
    """The `search_traces` filter (also what MLflow's trace search box takes) for a run's traces."""
    parts = [f"tags.`lego.run_id` = '{run_id}'"]
    if stage:
        parts.append(f"tags.`lego.stage` = '{stage}'")
    if iteration not in (None, ""):
        parts.append(f"tags.`lego.iteration` = '{iteration}'")
    return " AND ".join(parts)


def run_traces_url(tracking_uri: str, experiment_id: str, mlflow_run_id: str) -> str:
    """The Traces tab of an MLflow run: the traces linked to it (a pipeline run's rollouts)."""
    return f"{mlflow_ui_url(tracking_uri)}/#/experiments/{experiment_id}/runs/{mlflow_run_id}/traces"


__all__ = ["TraceContext", "TraceCounts", "TraceTarget", "TraceWriter", "TracesUnsupportedError",
           "log_result_traces", "log_target_traces", "mlflow_ui_url", "rollout_trace", "rollout_trace_id",
           "run_traces_url", "stage_trace_targets", "traces_filter", "verification_span"]
