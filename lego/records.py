"""The records that flow between stages: what one rollout produced and how it was graded.

Token-heavy records are dataclasses over numpy arrays (one dataclass out of each rollout, as in
verl's agent loop); the data layer stores them as compact Parquet columns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
from pydantic import BaseModel

from lego.errors import LegoError


class TerminationReason(StrEnum):
    completed = "completed"
    max_turns = "max_turns"
    timeout = "timeout"
    overlong = "overlong"
    # The harness crashed after the model was served a reply, with the engine and proxy healthy: the model's
    # own output provoked it (malformed tool calls, a reply the harness cannot parse). The policy's failure.
    harness_crash = "harness_crash"
    # The harness crashed before any model reply, or with an engine/proxy error: infrastructure (retried).
    harness_failed = "harness_failed"
    patch_too_large = "patch_too_large"  # the diff is over verify.max_patch_bytes: not transferred, not graded
    diff_broken = "diff_broken"  # the agent's working tree made taking the diff fail (it works on the pristine tree)
    env_setup_failed = "env_setup_failed"


class OutcomeKind(StrEnum):
    resolved = "resolved"
    unresolved = "unresolved"
    cheat = "cheat"
    agent_timeout = "agent_timeout"
    overlong = "overlong"
    infra_error = "infra_error"


# Reward per outcome; None means "excluded from the loss and from group statistics".
REWARD: dict[OutcomeKind, float | None] = {
    OutcomeKind.resolved: 1.0,
    OutcomeKind.unresolved: 0.0,
    OutcomeKind.cheat: 0.0,
    OutcomeKind.agent_timeout: 0.0,
    OutcomeKind.overlong: 0.0,
    OutcomeKind.infra_error: None,
}


class SegmentReason(StrEnum):
    start = "start"  # the first call of a thread
    rewrite = "rewrite"  # the harness rewrote history (compaction, edited turns): a new segment
    subagent = "subagent"  # a call of another agent than the main one (lego/proxy/session.py says how threads are told apart)


@dataclass
class Segment:
    """One contiguous token stream: prompt tokens (mask 0) and sampled tokens (mask 1), in order."""

    token_ids: np.ndarray  # int32 [T]
    response_mask: np.ndarray  # uint8 [T]: 1 exactly on tokens the engine sampled
    logprobs: np.ndarray  # float32 [T]: the engine's log-prob of each sampled token, 0 elsewhere
    routed_experts: np.ndarray | None  # uint8 [T, layers, top_k], or None for a dense model
    reason: SegmentReason = SegmentReason.start
    thread: str = "main"  # "main" or "subagent:<key>"

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.response_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"segment arrays disagree: {n} tokens, {len(self.response_mask)} mask, {len(self.logprobs)} logprobs"
            )
        if self.routed_experts is not None and self.routed_experts.shape[0] != n:
            raise ValueError(f"routed_experts has {self.routed_experts.shape[0]} rows for {n} tokens")

    @property
    def num_tokens(self) -> int:
        return int(len(self.token_ids))

    @property
    def num_sampled(self) -> int:
        return int(self.response_mask.sum())


@dataclass
class LLMCall:
    """One request the harness made through the proxy.

    `request_json` holds what the harness asked, in OpenAI chat form (the proxy's parsed conversation: every
    protocol's request becomes one), stored as what it adds to an earlier call of the same thread, so a long
    conversation costs its length once, not once per call: `{"base": <call_index or -1>, "keep": <n>,
    "messages": [...], "tools": [...]}` means the first `keep` messages of call `base`'s request, then `messages`;
    `tools` is absent when it equals call `base`'s. `expand_requests` rebuilds every call's whole request.
    `reply_json` is the reply as the assistant message the harness received (empty when the call failed)."""

    call_index: int
    protocol: str  # openai_chat | anthropic_messages | openai_responses
    started_at: float
    latency_s: float
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    segment_index: int
    kind: str  # extend | start | rewrite | subagent
    new_prompt_tokens: int = 0  # tokens rendered for this call (the rest came from the session's stream)
    stream: bool = False
    error: str | None = None
    thread: str = ""  # "main" or "subagent:<n>", as the segment's thread ("" in records from before it was kept)
    request_json: str = ""  # "" in records from before requests were kept
    reply_json: str = ""


class RequestRecordError(LegoError):
    """A call's stored request cannot be rebuilt (a damaged record or a base call that is missing)."""


class ChatRequest(BaseModel):
    """One call's whole request: OpenAI chat messages and tools."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]


def expand_requests(calls: list[LLMCall]) -> dict[int, ChatRequest]:
    """Every call's whole request (by call index), rebuilt from the stored deltas (see LLMCall); calls recorded
    before requests were kept are left out."""
    out: dict[int, ChatRequest] = {}
    for call in sorted(calls, key=lambda c: c.call_index):
        if not call.request_json:
            continue
        try:
            delta = json.loads(call.request_json)
            base, keep = int(delta["base"]), int(delta["keep"])
            messages = list(delta["messages"])
        except (ValueError, KeyError, TypeError) as exc:
            raise RequestRecordError(f"call {call.call_index}: its request_json is not a request delta ({exc}): the "
                                     "rollout's llm_calls record is damaged; rerun its stage with --force to record "
                                     "it again") from None
        if base >= 0 and base not in out:
            raise RequestRecordError(f"call {call.call_index} builds on call {base}, which is not among the calls "
                                     "given; pass all of the rollout's calls")
        earlier = out[base] if base >= 0 else ChatRequest(messages=[], tools=[])
        tools = delta["tools"] if "tools" in delta else earlier.tools
        out[call.call_index] = ChatRequest(messages=earlier.messages[:keep] + messages, tools=tools)
    return out


@dataclass
class Trajectory:
    rollout_id: str
    task_id: str
    harness: str
    policy_version: int
    iteration: int = 0
    sample_index: int = 0
    segments: list[Segment] = field(default_factory=list)
    calls: list[LLMCall] = field(default_factory=list)
    final_diff: str = ""
    termination: TerminationReason = TerminationReason.completed
    timings: dict[str, float] = field(default_factory=dict)
    harness_log: str = ""
    error: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def main_segments(self) -> list[Segment]:
        return [segment for segment in self.segments if segment.thread == "main"]

    @property
    def num_turns(self) -> int:
        return sum(1 for call in self.calls if call.kind != "subagent")


@dataclass
class Outcome:
    rollout_id: str
    task_id: str
    kind: OutcomeKind
    cheat_rules: list[str] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)
    test_log: str = ""
    exit_code: int | None = None
    attempts: int = 1

    @property
    def reward(self) -> float | None:
        return REWARD[self.kind]

    @property
    def is_cheat(self) -> bool:
        return self.kind == OutcomeKind.cheat
