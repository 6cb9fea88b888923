"""Rollouts as MLflow traces (lego/track/traces.py), on a real MLflow SQLite store.

- The proxy keeps what each call asked and answered: replaying every captured harness run (tests/fixtures/threads),
  each call's rebuilt request is exactly the request the harness sent, as parsed, and its reply the served one.
- A Claude Code rollout (sub-agent, compaction rewrites), stored and read back through MLflow's trace API: every LLM
  call is a span at its recorded time with its messages, reply, token counts, call kind and thread; the trace's
  tags and its link to the stage run; then its grading appended to the same trace, and a rewrite of the trace
  replacing rather than adding.
- Through the pipeline's own path (PipelineRun.record, the doubles' rollouts and grades): every rollout of the
  rollout stage is traced and graded by the verify stage; with MLflow failing, both stages still finish and count
  the failures in `traces_failed`.
"""

# ruff: noqa: F811  (the proxy fixture imported from test_proxy_threads is a parameter here)

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from proxy_doubles import BackgroundProxy, ScriptedEngine
from test_proxy_threads import EXPECTED, load, proxy, replay  # noqa: F401

from lego.config import SamplingConfig, load_config
from lego.data.catalog import Catalog
from lego.data.reader import read_trajectories
from lego.data.writer import DatasetWriter
from lego.proxy.server import POST_ROUTES
from lego.proxy.transcript import message_dict
from lego.records import Outcome, OutcomeKind, RequestRecordError, Trajectory, expand_requests
from lego.track.traces import log_result_traces, rollout_trace_id
from lego.track.tracker import Tracker
from lego.workdir import WorkDir


def sent(call: dict) -> tuple[list[dict], list[dict]]:
    """The request of a captured call as the proxy parses it: OpenAI chat messages and tools."""
    conversation, _ = POST_ROUTES[call["path"].split("?")[0]].parse_request(json.loads(json.dumps(call["body"])))
    return [message_dict(m) for m in conversation.messages], conversation.tools


@pytest.mark.parametrize("harness", sorted(EXPECTED))
def test_every_call_keeps_its_request_and_reply(proxy, harness):
    calls = load(harness)["calls"]
    session = replay(proxy, calls)
    segments, records = session.trajectory_parts()
    requests = expand_requests(records)
    assert sorted(requests) == list(range(len(calls)))
    for number, (call, record) in enumerate(zip(calls, records, strict=True)):
        messages, tools = sent(call)
        assert requests[number].messages == messages, f"call {number}"
        assert requests[number].tools == tools, f"call {number}"
        assert record.thread == segments[record.segment_index].thread
        reply = json.loads(record.reply_json)
        assert reply["role"] == "assistant" and (reply["content"] or reply.get("tool_calls"))
    # stored as deltas: the whole conversation once, not once per call
    stored = sum(len(record.request_json) for record in records)
    whole = sum(len(json.dumps(request.model_dump())) for request in requests.values())
    assert stored < whole or len(records) == 1


def make_config(tmp_path: Path, *extra: str):
    config = load_config("test", [f"project.work_dir={tmp_path / 'work'}", *extra])
    return config, WorkDir.create(config.project.work_dir)


def claude_code_rollout(proxy, data_run_id: str) -> tuple[Trajectory, list[dict]]:
    calls = load("claude-code")["calls"]
    session = replay(proxy, calls)
    segments, records = session.trajectory_parts()
    trajectory = Trajectory(rollout_id=f"{data_run_id}.calc-1.0", task_id="calc-1", harness="claude-code",
                            policy_version=3, iteration=0, segments=segments, calls=records,
                            final_diff="diff --git a/calc.py b/calc.py\n", timings={"total_s": 30.0},
                            harness_log="done\n")
    return trajectory, calls


def test_rollout_read_back_from_mlflow_with_every_call(proxy, tmp_path):
    from mlflow import MlflowClient

    config, work = make_config(tmp_path)
    data_run_id = "rollout-abc"
    trajectory, captured = claude_code_rollout(proxy, data_run_id)
    DatasetWriter(work, data_run_id).append_trajectories([trajectory], stage="rollout")
    with Catalog.open(work, config, in_memory=True) as catalog:
        (stored,) = read_trajectories(catalog, [trajectory.rollout_id])
    assert stored.calls == trajectory.calls  # requests, replies and threads kept whole in llm_calls
    tracker = Tracker(config, work)
    parent = tracker.start_pipeline_run("run-t")
    stage_run = tracker.start_stage_run(parent, "run-t", "rollout", 0)
    metrics = log_result_traces(tracker, run_id="run-t", stage="rollout", iteration=0,
                                data={"data_run_id": data_run_id}, stage_run=stage_run, pipeline_run=parent)
    assert metrics == {"traces_logged": 1.0, "traces_failed": 0.0}
    assert tracker.client.get_run(stage_run).data.metrics["traces_logged"] == 1.0
    assert tracker.client.get_run(parent).data.metrics["rollout.traces_failed"] == 0.0

    client = MlflowClient(tracking_uri=tracker.uri)
    found = client.search_traces(locations=[tracker.experiment_id],
                                 filter_string=f"tags.`lego.rollout_id` = '{trajectory.rollout_id}'")
    assert len(found) == 1
    assert [t.info.trace_id for t in client.search_traces(locations=[tracker.experiment_id], run_id=stage_run)] == \
        [found[0].info.trace_id]
    trace = client.get_trace(found[0].info.trace_id)
    tags = trace.info.tags
    assert {key: tags[key] for key in ("lego.run_id", "lego.stage", "lego.iteration", "lego.task_id", "lego.harness",
                                       "lego.policy_version", "lego.termination", "lego.data_run_id")} == {
        "lego.run_id": "run-t", "lego.stage": "rollout", "lego.iteration": "0", "lego.task_id": "calc-1",
        "lego.harness": "claude-code", "lego.policy_version": "3", "lego.termination": "completed",
        "lego.data_run_id": data_run_id}
    assert trace.info.trace_metadata["mlflow.sourceRun"] == stage_run

    spans = {span.span_id: span for span in trace.data.spans}
    root = next(span for span in spans.values() if span.parent_id is None)
    assert root.outputs["final_diff"] == trajectory.final_diff and root.span_type == "AGENT"
    llm = sorted((span for span in spans.values() if span.span_type == "CHAT_MODEL"),
                 key=lambda span: span.attributes["lego.call_index"])
    assert len(llm) == len(trajectory.calls) == len(captured)
    for call, span, capture in zip(trajectory.calls, llm, captured, strict=True):
        messages, tools = sent(capture)
        assert span.inputs["messages"] == messages
        reply = span.outputs["choices"][0]["message"]
        assert reply == json.loads(call.reply_json) and span.outputs["choices"][0]["finish_reason"] == "stop"
        assert span.start_time_ns == round(call.started_at * 1e9)
        assert span.end_time_ns - span.start_time_ns == pytest.approx(call.latency_s * 1e9, abs=2)
        attributes = span.attributes
        assert attributes["lego.kind"] == call.kind and attributes["lego.thread"] == call.thread
        assert attributes["lego.prompt_tokens"] == call.prompt_tokens > 0
        assert attributes["lego.completion_tokens"] == call.completion_tokens > 0
        assert attributes["lego.new_prompt_tokens"] == call.new_prompt_tokens
        assert attributes["mlflow.chat.tokenUsage"]["input_tokens"] == call.prompt_tokens
        # tools on a thread's first call; later ones point at the span that shows them
        assert ("tools" in span.inputs) != ("lego.tools_from_call" in attributes)
        if "tools" in span.inputs:
            assert span.inputs["tools"] == tools
        else:
            assert spans_by_call(llm)[attributes["lego.tools_from_call"]].inputs["tools"] == tools
        # a sub-agent's calls hang under a span of that sub-agent
        parent_span = spans[span.parent_id]
        assert parent_span is root if call.thread == "main" else parent_span.name == call.thread
    assert [span.attributes["lego.kind"] for span in llm] == \
        ["start", "extend", "rewrite", "rewrite", "subagent", "subagent", "extend", "extend"]
    assert {span.attributes["lego.thread"] for span in llm} == {"main", "subagent:1"}
    assert root.start_time_ns <= min(span.start_time_ns for span in llm)
    assert root.end_time_ns >= max(span.end_time_ns for span in llm)

    # the verify stage appends the grading to the same trace
    outcome = Outcome(trajectory.rollout_id, "calc-1", OutcomeKind.cheat, cheat_rules=["grading_tampered"],
                      evidence={"check": "cheat_rules", "grade_seconds": 4.5}, test_log="x" * 20_000 + "FAILED",
                      exit_code=1)
    DatasetWriter(work, data_run_id).append_outcomes([outcome], 0, stage="verify-1234")
    verify_run = tracker.start_stage_run(parent, "run-t", "verify", 0)
    assert log_result_traces(tracker, run_id="run-t", stage="verify", iteration=0,
                             data={"data_run_id": data_run_id, "outcome_stage": "verify-1234"},
                             stage_run=verify_run)["traces_logged"] == 1.0
    trace = client.get_trace(found[0].info.trace_id)
    assert trace.info.tags["lego.outcome"] == "cheat" and trace.info.tags["lego.cheat_rules"] == "grading_tampered"
    verification = next(span for span in trace.data.spans if span.span_type == "EVALUATOR")
    assert verification.outputs["kind"] == "cheat" and verification.outputs["cheat_rules"] == ["grading_tampered"]
    assert verification.outputs["test_log_tail"].endswith("FAILED") and len(verification.outputs["test_log_tail"]) \
        < len(outcome.test_log)
    assert verification.parent_id == root.span_id
    assert verification.end_time_ns - verification.start_time_ns == 4_500_000_000

    # writing the rollout again replaces its trace: still one trace with the same spans
    log_result_traces(tracker, run_id="run-t", stage="rollout", iteration=0, data={"data_run_id": data_run_id},
                      stage_run=stage_run)
    again = client.search_traces(locations=[tracker.experiment_id],
                                 filter_string=f"tags.`lego.rollout_id` = '{trajectory.rollout_id}'")
    assert len(again) == 1 and len(again[0].data.spans) == len(trace.data.spans)


def spans_by_call(spans) -> dict:
    return {span.attributes["lego.call_index"]: span for span in spans}


def test_traces_off_writes_none(tmp_path):
    config, work = make_config(tmp_path, "tracking.traces=false")
    tracker = Tracker(config, work)
    parent = tracker.start_pipeline_run("run-off")
    stage_run = tracker.start_stage_run(parent, "run-off", "rollout", 0)
    assert log_result_traces(tracker, run_id="run-off", stage="rollout", iteration=0,
                             data={"data_run_id": "rollout-x"}, stage_run=stage_run) == {}
    assert tracker.client.search_traces(locations=[tracker.experiment_id]) == []


# ------------------------------------------------------------------------------------------ the pipeline's path


def run_rollout_and_verify(config, work, run_id: str, force: bool = False):
    """The rollout and verify stages of iteration 0 as the flows run them (flows/stages.py), without Prefect."""
    from lego.pipeline.artifacts import StageResult
    from lego.pipeline.attempts import execute_requests
    from lego.pipeline.pipeline_run import PipelineRun
    from lego.pipeline.policy import Policy
    from lego.pipeline.rollout_stage import finish_rollouts, plan_rollouts
    from lego.pipeline.taskset_stage import write_tasks
    from lego.pipeline.verify_stage import run_verify_stage
    from lego.tasksets.load import load_tasks

    tasks = load_tasks("bundled").tasks[:2]
    listing = work.root / "tasks.jsonl"
    write_tasks(listing, tasks)
    task_list = StageResult(stage="taskset", key="tasks", path=str(work.root), outputs={"train_tasks": str(listing)})
    run = PipelineRun(config, work, run_id=run_id, force=force, log=lambda _: None)
    plan = plan_rollouts(run.ctx, task_list, Policy(Path("policy"), 0, "policy-key"), 0)
    execute_requests(run.ctx, plan.tasks, plan.pending, plan.policy, data_run_id=plan.data_run_id, stage="rollout",
                     iteration=0)
    rollout = run.record(finish_rollouts(run.ctx, plan))
    verify = run.record(run_verify_stage(run.ctx, rollout, task_list))
    run.finish()
    tracker = run.tracker
    stage_runs = {r.info.run_name: r for r in tracker.client.search_runs(
        [tracker.experiment_id], f"tags.`lego.run_id` = '{run_id}' and tags.`lego.kind` = 'stage'")}
    return rollout, verify, stage_runs, tracker


def test_pipeline_stages_trace_every_rollout_and_survive_a_failing_mlflow(tmp_path, monkeypatch):
    from mlflow.exceptions import MlflowException
    from mlflow.tracing.client import TracingClient

    config, work = make_config(tmp_path, "pipeline.runner=pipeline_doubles:DoubleRunner",
                               "rollout.samples_per_task=2")
    rollout, verify, stage_runs, tracker = run_rollout_and_verify(config, work, "run-ok")
    ids = json.loads(Path(rollout.outputs["rollout_summary"]).read_text())["rollout_ids"]
    assert len(ids) == 4
    assert stage_runs["rollout/0"].data.metrics["traces_logged"] == 4
    assert stage_runs["verify/0"].data.metrics["traces_logged"] == 4
    traces = tracker.client.search_traces(locations=[tracker.experiment_id],
                                          filter_string="tags.`lego.run_id` = 'run-ok'")
    assert sorted(t.info.tags["lego.rollout_id"] for t in traces) == sorted(ids)
    for trace in traces:
        assert trace.info.trace_id == rollout_trace_id(tracker.experiment_id, trace.info.tags["lego.rollout_id"])
        assert trace.info.tags["lego.outcome"] in ("resolved", "unresolved")
        assert trace.info.trace_metadata["mlflow.sourceRun"] == stage_runs["rollout/0"].info.run_id
        kinds = [span.span_type for span in trace.data.spans]
        assert kinds.count("CHAT_MODEL") == 2 and kinds.count("EVALUATOR") == 1  # the doubles' two calls

    def refuse(self, location, spans):
        raise MlflowException("the tracking store is down")

    monkeypatch.setattr(TracingClient, "log_spans", refuse)
    rollout, verify, stage_runs, _ = run_rollout_and_verify(config, work, "run-down", force=True)
    assert not rollout.cached and not verify.cached and verify.metrics["graded"] == 4
    assert stage_runs["rollout/0"].data.metrics["traces_failed"] == 4
    assert stage_runs["rollout/0"].data.metrics["traces_logged"] == 0
    # the verify stage finds no trace of these (new) rollouts: it tries to write them (4), then the gradings (4)
    assert stage_runs["verify/0"].data.metrics["traces_failed"] == 8


def test_compare_links_each_evaluation_to_its_traces(tmp_path):
    import numpy as np

    from lego.data.synthetic import synthetic_trajectory
    from lego.evaluate.compare import compare_runs

    config, work = make_config(tmp_path)
    tracker = Tracker(config, work)
    parent = tracker.start_pipeline_run("run-e")
    stage_run = tracker.start_stage_run(parent, "run-e", "evaluate", 0)
    tracker.set_tags(stage_run, {"lego.policy_version": 1, "lego.artifact_key": "key-e"})
    tracker.log_metrics(stage_run, {"attempts": 2, "resolved": 1, "resolved_rate": 0.5, "resolved_low": 0.1,
                                    "resolved_high": 0.9})
    trajectories = [synthetic_trajectory(np.random.default_rng(i), f"eval-k.t{i}.0", f"t{i}", tokens_per_segment=64)
                    for i in range(2)]
    DatasetWriter(work, "eval-k").append_trajectories(trajectories, stage="evaluate")
    kinds = (OutcomeKind.resolved, OutcomeKind.unresolved)
    DatasetWriter(work, "eval-k").append_outcomes(
        [Outcome(t.rollout_id, t.task_id, kind) for t, kind in zip(trajectories, kinds, strict=True)], 0,
        stage="evaluate-verify")
    assert log_result_traces(tracker, run_id="run-e", stage="evaluate", iteration=0, data={"data_run_id": "eval-k"},
                             stage_run=stage_run) == {"traces_logged": 4.0, "traces_failed": 0.0}  # 2 rollouts, 2 gradings

    result = compare_runs(tracker, tmp_path / "out")
    (row,) = result["rows"]
    assert row["traces_url"] == (f"http://127.0.0.1:5000/#/experiments/{tracker.experiment_id}/runs/{stage_run}"
                                 "/traces")
    assert row["traces_url"] in result["html"].read_text()
    by_filter = tracker.client.search_traces(locations=[tracker.experiment_id], filter_string=row["traces_filter"])
    by_run = tracker.client.search_traces(locations=[tracker.experiment_id], run_id=row["mlflow_run_id"])
    expected = sorted(t.rollout_id for t in trajectories)
    assert sorted(t.info.tags["lego.rollout_id"] for t in by_filter) == expected
    assert sorted(t.info.tags["lego.rollout_id"] for t in by_run) == expected
    assert sorted(t.info.tags["lego.outcome"] for t in by_run) == ["resolved", "unresolved"]


def test_a_refused_call_keeps_its_request_and_is_an_error_span(tokenizer):
    from lego.track.traces import TraceContext, rollout_trace

    engine = ScriptedEngine(tokenizer, replies=["Let me see."], max_context=400)
    proxy = BackgroundProxy(engine, tokenizer, SamplingConfig(max_tokens=64))
    try:
        session = proxy.open_session()
        first = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix calc.add."}]
        assert httpx.post(f"{session.base_url}/v1/chat/completions", json={"model": "m", "messages": first},
                          timeout=60).status_code == 200
        second = [*first, {"role": "assistant", "content": "Let me see."}, {"role": "user", "content": "word " * 400}]
        refused = httpx.post(f"{session.base_url}/v1/chat/completions", json={"model": "m", "messages": second},
                             timeout=60)
        assert refused.status_code == 400
        segments, calls = session.trajectory_parts()
    finally:
        proxy.close()
    assert calls[1].error and calls[1].reply_json == "" and calls[1].finish_reason == "overlong"
    assert expand_requests(calls)[1].messages == second
    with pytest.raises(RequestRecordError, match="builds on call 0"):
        expand_requests(calls[1:])  # a delta without the call it builds on
    trajectory = Trajectory(rollout_id="r.t.0", task_id="t", harness="mini-swe-agent", policy_version=0,
                            segments=segments, calls=calls)
    spans, info = rollout_trace("7", trajectory, TraceContext(run_id="run", stage="rollout", iteration=0,
                                                              data_run_id="r"))
    refused_span = next(span for span in spans if span.name == "call 1 extend")
    assert refused_span.status.status_code == "ERROR" and "context" in refused_span.status.description
    assert refused_span.inputs["messages"] == second and refused_span.outputs is None
    assert info.trace_id == rollout_trace_id("7", "r.t.0") and info.tags["lego.calls"] == "2"


def test_calls_stored_before_requests_were_kept_still_trace(tmp_path):
    """llm_calls files written before the thread/request/reply columns existed read back with empty fields, and
    their calls are spans that say the request was not recorded."""
    from datetime import UTC, datetime

    import numpy as np
    import pyarrow.parquet as pq

    from lego.data import codec
    from lego.data.schema import SCHEMAS
    from lego.data.synthetic import synthetic_trajectory
    from lego.track.traces import TraceContext, rollout_trace

    trajectory = synthetic_trajectory(np.random.default_rng(0), "old.t.0", "t", tokens_per_segment=32)
    table = codec.llm_calls_table([trajectory], "old", "rollout", datetime.now(UTC))
    old = tmp_path / "llm_calls-old.parquet"
    pq.write_table(table.drop_columns(["thread", "request_json", "reply_json"]), old)
    calls = [codec.call_from_row(row) for row in pq.read_table(old, schema=SCHEMAS["llm_calls"]).to_pylist()]
    assert calls == trajectory.calls and calls[0].request_json == calls[0].thread == ""
    assert expand_requests(calls) == {}
    spans, _ = rollout_trace("1", trajectory, TraceContext(run_id="r", stage="rollout", iteration=0,
                                                           data_run_id="old"))
    llm = [span for span in spans if span.span_type == "CHAT_MODEL"]
    assert len(llm) == len(calls) and all("not recorded" in span.attributes["lego.request"] for span in llm)
    assert {span.attributes["lego.thread"] for span in llm} == {"main"}
