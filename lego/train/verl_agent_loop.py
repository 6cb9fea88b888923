"""A verl agent loop that runs one Lego rollout (harness in a sandbox, through the proxy) per dataset row.

GPU path: verl's trainer (FSDP/Megatron, vLLM rollout servers, R3 router replay) drives training, and for each
row whose `agent_name` is `lego_harness` it calls `LegoHarnessAgentLoop.run()`. The loop turns verl's server
client into a Lego `Engine` (`VerlServerEngine`), hands the row's task and that engine to a rollout function
`run_rollout(task, engine) -> (Trajectory, reward)`, and converts the trajectory's main segment into verl's
`AgentLoopOutput` (prompt ids, response ids/mask/log-probs, routed experts over the whole sequence, reward).

The rollout function is injected: pass `run_rollout="package.module:function"` in the agent-loop config
(verl passes that file's extra keys to the constructor) or call `set_rollout_function(fn)` in the worker.

Launch (see configs/gpu/verl_r3.yaml for the settings):
    lego data export --run RUN --iteration N --out DIR   # DIR/rl_dataset.parquet: one RL row per task
    python -m verl.trainer.main_ppo --config-path $PWD/configs/gpu --config-name verl_r3 \
        data.train_files=... actor_rollout_ref.model.path=...

Importing this module needs verl (installed on CPU too); the loop itself only runs inside verl's workers.
"""

from __future__ import annotations

import importlib
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from lego.data.export import AGENT_LOOP_NAME
from lego.engine.base import GenerateResult, SamplingParams
from lego.errors import LegoError
from lego.records import Segment, Trajectory
from lego.tasksets.task import Task

AGENT_NAME = AGENT_LOOP_NAME
RunRollout = Callable[[Task, Any], Awaitable[tuple[Trajectory, float | None]]]
_rollout_function: RunRollout | None = None


class AgentLoopError(LegoError):
    """A rollout cannot be turned into verl's agent-loop output."""


def set_rollout_function(function: RunRollout | None) -> None:
    """The rollout every LegoHarnessAgentLoop in this process uses when its config names none."""
    global _rollout_function
    _rollout_function = function


def resolve_rollout_function(spec: str | RunRollout | None) -> RunRollout:
    if callable(spec):
        return spec
    if isinstance(spec, str) and spec:
        module_name, _, attribute = spec.partition(":")
        if not attribute:
            raise AgentLoopError(f"run_rollout={spec!r} must look like 'package.module:function'")
        return getattr(importlib.import_module(module_name), attribute)
    if _rollout_function is None:
        raise AgentLoopError("no rollout function: set run_rollout in the agent-loop config or call "
                             "lego.train.verl_agent_loop.set_rollout_function(fn)")
    return _rollout_function


class VerlServerEngine:
    """A Lego Engine over verl's LLM server client (token ids in, token ids + log-probs + routing out)."""

    def __init__(self, server_manager, max_context: int, eos_token_ids: tuple[int, ...] = (),
                 policy_version: int = 0) -> None:
        self.server_manager = server_manager
        self.max_context = max_context
        self.eos_token_ids = eos_token_ids
        self.policy_version = policy_version

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        params: dict[str, Any] = {"temperature": sampling.temperature, "top_p": sampling.top_p,
                                  "max_tokens": sampling.max_tokens, "logprobs": True,
                                  "stop_token_ids": list(sampling.stop_token_ids)}
        if sampling.seed is not None:
            params["seed"] = sampling.seed
        output = await self.server_manager.generate(request_id=uuid.uuid4().hex, prompt_ids=list(prompt_ids),
                                                    sampling_params=params)
        token_ids = list(output.token_ids)
        if output.log_probs is None or len(output.log_probs) != len(token_ids):
            raise AgentLoopError("verl's server returned no log-prob for some tokens; is rollout.calculate_log_probs on?")
        routed = None
        if output.routed_experts is not None:
            raw = np.asarray(output.routed_experts)
            rows = len(prompt_ids) + len(token_ids)
            routed = np.zeros((rows, *raw.shape[1:]), dtype=np.uint8)  # last sampled token: never fed (zeros)
            routed[: min(rows, raw.shape[0])] = raw[:rows]
        stopped = bool(token_ids) and token_ids[-1] in sampling.stop_token_ids
        return GenerateResult(token_ids=token_ids, logprobs=[float(x) for x in output.log_probs],
                              routed_experts=routed, finish_reason="stop" if stopped else "length",
                              prompt_tokens=len(prompt_ids))

    async def score(self, token_ids: list[int]) -> list[float]:
        raise AgentLoopError("scoring is not served by verl's rollout servers; the trainer computes log-probs")

    def load_checkpoint(self, path: str, policy_version: int) -> None:
        raise AgentLoopError("verl syncs weights into its rollout servers itself; nothing to load here")


def pick_segment(trajectory: Trajectory, index: int = -1) -> Segment:
    segments = trajectory.main_segments
    if not segments:
        raise AgentLoopError(f"rollout {trajectory.rollout_id} has no main-thread segment to train on")
    return segments[index]


def trajectory_to_output(trajectory: Trajectory, reward: float | None, response_length: int | None = None,
                         segment_index: int = -1) -> AgentLoopOutput:
    """One main segment as verl's AgentLoopOutput.

    verl holds one token sequence per sample, so a trajectory whose history was rewritten (several main
    segments) contributes its last segment here (Lego's own trainer trains on every segment). The prompt is
    everything before the first sampled token; the response is the rest (tool/user tokens inside it mask 0).
    Routing covers prompt + response (verl's replay indexes it by absolute position), as int16 in as_dict().
    """
    segment = pick_segment(trajectory, segment_index)
    sampled = np.flatnonzero(segment.response_mask)
    if len(sampled) == 0:
        raise AgentLoopError(f"rollout {trajectory.rollout_id}: its segment has no sampled token")
    start = int(sampled[0])
    end = len(segment.token_ids) if response_length is None else min(len(segment.token_ids), start + response_length)
    tokens = [int(t) for t in segment.token_ids]
    routed = None
    if segment.routed_experts is not None:
        routed = np.asarray(segment.routed_experts[:end])
    return AgentLoopOutput(
        prompt_ids=tokens[:start],
        response_ids=tokens[start:end],
        response_mask=[int(m) for m in segment.response_mask[start:end]],
        response_logprobs=[float(x) for x in segment.logprobs[start:end]],
        routed_experts=routed,
        reward_score=reward,
        num_turns=trajectory.num_turns,
        metrics=AgentLoopMetrics(generate_sequences=float(trajectory.timings.get("rollout_s", 0.0))),
        extra_fields={"rollout_id": trajectory.rollout_id, "task_id": trajectory.task_id,
                      "harness": trajectory.harness, "policy_version": trajectory.policy_version,
                      "termination": str(trajectory.termination), "segments": len(trajectory.main_segments),
                      "outcome": trajectory.metadata.get("outcome", ""),  # the verifier's verdict, where it graded
                      "turn_scores": [], "tool_rewards": []},
    )


def task_from_row(kwargs: dict[str, Any]) -> Task:
    """The Task of a dataset row: extra_info.task (a Task as a dict or JSON string) or extra_info.task_json (what
    `lego data export` writes)."""
    extra = kwargs.get("extra_info") or {}
    raw = (extra.get("task") or extra.get("task_json")) if isinstance(extra, dict) else None
    if raw is None:
        raise AgentLoopError("dataset row has no extra_info.task; export the data with Lego's verl export")
    return Task.model_validate_json(raw) if isinstance(raw, str) else Task.model_validate(raw)


@register(AGENT_NAME)
class LegoHarnessAgentLoop(AgentLoopBase):
    """verl agent loop: one Lego harness rollout per row, returned as verl's AgentLoopOutput."""

    def __init__(self, *args, run_rollout: str | RunRollout | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.run_rollout_spec = run_rollout
        self.response_length = int(self.rollout_config.response_length)
        self.max_context = int(self.rollout_config.prompt_length) + self.response_length

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        run_rollout = resolve_rollout_function(self.run_rollout_spec)
        eos = self.tokenizer.eos_token_id
        engine = VerlServerEngine(self.server_manager, self.max_context, (eos,) if eos is not None else ())
        trajectory, reward = await run_rollout(task_from_row(kwargs), engine)
        return trajectory_to_output(trajectory, reward, self.response_length)
