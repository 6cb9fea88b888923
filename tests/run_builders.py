"""Pipeline runs crafted the way the pipeline leaves them, for the tests that read runs back (`lego status`,
`lego ui`): trajectories, outcomes and train steps through the real writer, the dataset stage's real computation
(advantages from the catalog), verify and evaluation metrics from the stages' own functions, and a manifest; only
the train step's numbers are written by hand (a real step needs a model).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from lego import records
from lego.config import LegoConfig, load_config
from lego.data.codec import EvalResult, TrainStep
from lego.data.writer import DatasetWriter
from lego.evaluate.report import summarize_outcomes
from lego.pipeline.artifacts import StageContext, StageResult
from lego.pipeline.dataset_stage import run_dataset_stage
from lego.pipeline.diagnosis import TOOL_CALL_TOKEN, TURN_START_TOKEN
from lego.pipeline.manifest import RunManifest, save_manifest
from lego.pipeline.verify_stage import outcome_metrics
from lego.workdir import WorkDir

Kind = records.OutcomeKind
R, U, C, INFRA = Kind.resolved, Kind.unresolved, Kind.cheat, Kind.infra_error
MIXED = [R, U, R, U]  # a GRPO group with reward variance
TASKS = ("task-a", "task-b", "task-c")
EVAL_TASKS = ("eval-a", "eval-b")
SAMPLES = 4
EVAL_SAMPLES = 2
IM_END, TOOL_CALL_END, TOOL_RESPONSE, TOOL_RESPONSE_END = 151645, 151658, 151665, 151666
ROUTING_LAYERS, ROUTING_TOP_K, EXPERTS = 2, 2, 8
HARNESS = "mini-swe-agent"
PAST = datetime.now(UTC) - timedelta(hours=1)


def crafted_config(work_dir: Path, *overrides: str) -> LegoConfig:
    """The test config the crafted runs record: 2 iterations, an evaluation after each, no warm start or filter."""
    return load_config("test", [f"project.work_dir={work_dir}", "pipeline.iterations=2",
                                f"rollout.samples_per_task={SAMPLES}", f"eval.samples_per_task={EVAL_SAMPLES}",
                                "eval.every=1", "eval.at_start=false", "warmstart.enabled=false",
                                "filter.enabled=false", "eval.splits=[eval]", *overrides])


def routing(tokens: int, salt: int = 0) -> np.ndarray:
    """Routed experts [tokens, layers, top_k] as the engine records them: distinct experts per token and layer."""
    rows = np.arange(tokens, dtype=np.int64)[:, None, None] + salt
    layers = np.arange(ROUTING_LAYERS, dtype=np.int64)[None, :, None]
    picks = np.arange(ROUTING_TOP_K, dtype=np.int64)[None, None, :]
    return ((rows * 3 + layers * 5 + picks) % EXPERTS).astype(np.uint8)


def segment(replies: list[bool], *, routed: bool = False,
            reason: records.SegmentReason = records.SegmentReason.start, thread: str = "main") -> records.Segment:
    """A conversation as the proxy records it: the first prompt, then per reply its turn header (mask 0), the
    sampled reply (mask 1: a `<tool_call>` block when it calls a tool) and the tool's response (mask 0)."""
    tokens: list[int] = []
    mask: list[int] = []

    def add(ids: list[int], sampled: int) -> None:
        tokens.extend(ids)
        mask.extend([sampled] * len(ids))

    add([TURN_START_TOKEN, 8948, 198, 2610, 525, 264, IM_END, 198, TURN_START_TOKEN, 872, 198, 7981, IM_END, 198], 0)
    for calls in replies:
        add([TURN_START_TOKEN, 77091, 198], 0)
        body = [TOOL_CALL_TOKEN, 515, 1, 606, 788, TOOL_CALL_END] if calls else [40, 1513, 13]
        add([40, 686, 1779, 13, *body, IM_END], 1)
        add([198, TURN_START_TOKEN, 872, 198, TOOL_RESPONSE, 2016, TOOL_RESPONSE_END, IM_END, 198], 0)
    ids = np.asarray(tokens, dtype=np.int32)
    response = np.asarray(mask, dtype=np.uint8)
    logprobs = np.where(response == 1, -0.25, 0.0).astype(np.float32)
    return records.Segment(token_ids=ids, response_mask=response, logprobs=logprobs,
                           routed_experts=routing(len(ids)) if routed else None, reason=reason, thread=thread)


def _call(index: int, segment_index: int, kind: str) -> records.LLMCall:
    return records.LLMCall(call_index=index, protocol="openai_chat", started_at=1_800_000_000.0 + index,
                           latency_s=0.2, prompt_tokens=20, completion_tokens=8, finish_reason="stop",
                           segment_index=segment_index, kind=kind)


def trajectory(rollout_id: str, task_id: str, iteration: int, sample: int, calls_tools: bool, *,
               routed: bool = False, rewrite: bool = False, subagent: bool = False) -> records.Trajectory:
    """`rewrite`: the harness then rewrites its history (a second main segment); `subagent`: a sub-agent's call
    (a segment of its own thread)."""
    replies = [calls_tools, calls_tools, False]  # the last reply ends the run without a call in either case
    segments = [segment(replies, routed=routed)]
    calls = [_call(i, 0, "extend" if i else "start") for i in range(len(replies))]
    if rewrite:
        segments.append(segment([False], routed=routed, reason=records.SegmentReason.rewrite))
        calls.append(_call(len(calls), len(segments) - 1, "rewrite"))
    if subagent:
        segments.append(segment([True], routed=routed, reason=records.SegmentReason.subagent, thread="subagent:1"))
        calls.append(_call(len(calls), len(segments) - 1, "subagent"))
    return records.Trajectory(rollout_id=rollout_id, task_id=task_id, harness=HARNESS, policy_version=iteration,
                              iteration=iteration, sample_index=sample, segments=segments, calls=calls,
                              termination=records.TerminationReason.completed,
                              harness_log=f"harness log of {rollout_id}")


@dataclass
class Iteration:
    """What one RL iteration of a crafted run shows; the defaults are a healthy iteration."""

    kinds: dict[str, list[Kind]] = field(default_factory=lambda: {task: MIXED for task in TASKS})
    tool_calls: bool = True
    pearson: float = 0.99998
    learning_rate: float = 1e-4
    eval_kinds: list[Kind] = field(default_factory=lambda: [R, U])  # per eval task, EVAL_SAMPLES each
    evaluate: bool = True
    routed: bool = False  # segments carry routed experts (an MoE policy)
    rewrite: bool = False  # every rollout rewrites its history once
    subagent: bool = False  # every rollout makes a sub-agent call
    loss: float = 0.1


def _stage(stage: str, iteration: int | None, key: str, work: WorkDir, **fields) -> StageResult:
    return StageResult(stage=stage, iteration=iteration, key=key, path=str(work.artifacts / stage / key),
                       created_at=(PAST + timedelta(minutes=1)).isoformat(), **fields)


def store_rollouts(work: WorkDir, data_run_id: str, iteration: int, spec: Iteration,
                   stage: str = "rollout") -> list[records.Trajectory]:
    trajectories = [trajectory(f"{data_run_id}-{task}-{sample}", task, iteration, sample, spec.tool_calls,
                               routed=spec.routed, rewrite=spec.rewrite, subagent=spec.subagent)
                    for task in spec.kinds for sample in range(len(spec.kinds[task]))]
    DatasetWriter(work, data_run_id).append_trajectories(trajectories, stage=stage)
    return trajectories


def grade(work: WorkDir, data_run_id: str, iteration: int, trajectories: list[records.Trajectory],
          kinds: list[Kind], outcome_stage: str) -> list[records.Outcome]:
    """Outcomes of `trajectories` (one kind each, in order) through the real writer."""
    outcomes = [records.Outcome(t.rollout_id, t.task_id, kind, cheat_rules=["tests_modified"] if kind == C else [],
                                test_log=f"test log of {t.rollout_id}")
                for t, kind in zip(trajectories, kinds, strict=True)]
    DatasetWriter(work, data_run_id).append_outcomes(outcomes, iteration, stage=outcome_stage)
    return outcomes


def train_data_run_id(result: StageResult) -> str:
    """Where the train stage writes its steps (lego/pipeline/train_stage.py: `train-` and its key's start)."""
    return f"train-{Path(result.path).name[:16]}"


def craft_run(work: WorkDir, config: LegoConfig, run_id: str, iterations: list[Iteration], *,
              status: str = "completed", summary: dict | None = None, stages_after: int | None = None,
              live: Iteration | None = None, mlflow_run_id: str | None = None) -> RunManifest:
    """A run whose manifest records `iterations`; `stages_after`: keep only the first N stage results (a run
    still in progress); `live`: the rollouts of the next iteration, stored but not recorded (its rollout stage
    is in progress)."""
    ctx = StageContext(config=config, work=work, run_id=run_id, runner=None, log=lambda message: None)
    manifest = RunManifest(run_id=run_id, created_at=PAST.isoformat(), status=status,
                           config=config.model_dump(mode="json"), summary=summary or {},
                           mlflow_run_id=mlflow_run_id)
    manifest.record(_stage("taskset", None, f"{run_id}-tasks", work,
                           metrics={"train_tasks": len(TASKS), "eval_tasks": len(EVAL_TASKS)}))
    for index, spec in enumerate(iterations):
        data_run_id = f"rollout-{run_id}-{index}"
        rollouts = store_rollouts(work, data_run_id, index, spec)
        manifest.record(_stage("rollout", index, f"{run_id}-rollout-{index}", work,
                               metrics={"rollouts": len(rollouts)},
                               data={"data_run_id": data_run_id, "stage": "rollout", "policy_version": index}))
        outcome_stage = f"verify-{run_id[-6:]}{index}"
        outcomes = grade(work, data_run_id, index, rollouts, [k for task in spec.kinds for k in spec.kinds[task]],
                         outcome_stage)
        verify = _stage("verify", index, f"{run_id}-verify-{index}", work, metrics=outcome_metrics(outcomes),
                        data={"data_run_id": data_run_id, "outcome_stage": outcome_stage})
        manifest.record(verify)
        dataset = run_dataset_stage(ctx, verify)  # the real advantages, from the catalog
        manifest.record(dataset.model_copy(update={"created_at": verify.created_at}))
        metrics = {"trained": 1.0, "optimizer_steps": 2.0, "logprob_pearson": spec.pearson,
                   "kl_to_inference": 1e-9, "learning_rate": spec.learning_rate, "entropy": 0.5,
                   "groups": float(dataset.metrics["groups_in_loss"]),
                   "groups_with_signal": dataset.metrics["groups_with_signal"], "loss": spec.loss}
        train = _stage("train", index, f"{run_id}-train-{index}", work, metrics=metrics)
        tokens = sum(int(len(s.token_ids)) for t in rollouts for s in t.segments)
        DatasetWriter(work, train_data_run_id(train)).append_train_steps(
            [TrainStep(step=2, policy_version=index + 1, loss=spec.loss, num_sequences=len(rollouts),
                       num_tokens=tokens, duration_s=1.0, metrics=metrics)], index)
        manifest.record(train)
        if spec.evaluate:
            eval_run = f"eval-{run_id}-{index}"
            eval_spec = Iteration(kinds={task: [kind] * EVAL_SAMPLES for task, kind in
                                         zip(EVAL_TASKS, spec.eval_kinds, strict=True)})
            evaluated = store_rollouts(work, eval_run, index, eval_spec, stage="evaluate")
            eval_outcomes = grade(work, eval_run, index, evaluated,
                                  [eval_spec.kinds[t.task_id][0] for t in evaluated], "evaluate-verify")
            report = summarize_outcomes(eval_outcomes, harness=HARNESS, policy_version=index + 1)
            DatasetWriter(work, eval_run).append_eval_results(
                [EvalResult(o.task_id, HARNESS, index + 1, o.kind, o.rollout_id) for o in eval_outcomes], index)
            manifest.record(_stage("evaluate", index, f"{run_id}-evaluate-{index}", work, metrics=report.metrics(),
                                   data={"data_run_id": eval_run, "policy_version": index + 1,
                                         "harness": HARNESS}))
    if stages_after is not None:
        manifest.stages = dict(list(manifest.stages.items())[:stages_after])
    # What the recorded stages wrote was written before they were recorded, as in a real run.
    written = (PAST + timedelta(seconds=30)).timestamp()
    for directory in [*work.data.glob("*/*/iter=*"), *work.artifacts.glob("*/*")]:
        os.utime(directory, (written, written))
    if live is not None:
        store_rollouts(work, f"rollout-{run_id}-{len(iterations)}", len(iterations), live)
    save_manifest(work, manifest)
    return manifest
