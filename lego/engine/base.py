"""The Engine protocol: token ids in, token ids + log-probs + routed experts out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    # Stop strings (OpenAI `stop`, Anthropic `stop_sequences`): generation ends on the token that completes one;
    # that token and the ones before it stay in token_ids (they were sampled).
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass
class GenerateResult:
    token_ids: list[int]
    logprobs: list[float]  # log-prob of each sampled token under the sampling distribution's model
    # uint8 [prompt_len + len(token_ids), layers, top_k]: routing of every prompt and generated token
    # (the last generated token's routing is computed too). None for dense models.
    routed_experts: np.ndarray | None
    finish_reason: str  # "stop" (a stop token was sampled, included in token_ids) | "length"
    prompt_tokens: int = 0
    stop_sequence: str | None = None  # the stop string that ended generation, if one did
    timings: dict[str, float] = field(default_factory=dict)


def stop_string_in(text: str, stops: tuple[str, ...]) -> str | None:
    """The first of `stops` that occurs in `text`, if any (how every engine applies SamplingParams.stop)."""
    return next((stop for stop in stops if stop and stop in text), None)


@runtime_checkable
class Engine(Protocol):
    """A policy that samples and scores token ids. Implementations: transformers, vLLM, scripted."""

    policy_version: int
    max_context: int
    eos_token_ids: tuple[int, ...]

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult: ...

    async def score(self, token_ids: list[int]) -> list[float]:
        """Per-token log-probs (position 0 gets 0.0: nothing predicts it)."""
        ...

    def load_checkpoint(self, path: str, policy_version: int) -> None: ...


class EngineWrapper:
    """An engine around an `inner` one: forwards the policy's identity, scoring and checkpoint loads to it;
    subclasses say how to generate."""

    def __init__(self, inner) -> None:
        self.inner = inner

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    @property
    def max_context(self) -> int:
        return self.inner.max_context

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.inner.eos_token_ids

    async def score(self, token_ids: list[int]) -> list[float]:
        return await self.inner.score(token_ids)

    def load_checkpoint(self, path: str, policy_version: int) -> None:
        self.inner.load_checkpoint(path, policy_version)
