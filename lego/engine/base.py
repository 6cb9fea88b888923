"""The Engine protocol: token ids in, token ids + log-probs + routed experts out, whole or as they are sampled.

`generate` answers once the generation ends; `stream` yields the sampled tokens in chunks as the engine produces
them, the last chunk carrying the whole result, so a server can send a long reply as it is written while the
record it keeps is the same as `generate`'s. `generate_streaming` drives either form for a caller that wants the
chunks (an engine without `stream`, such as a test double, answers in one chunk).

`prompt_ids` is any sequence of ints: the proxy passes a snapshot of its session's stream, a flat `array("i")`
(copying 16k ints into a list costs more than the rest of a call). An engine copies what it keeps.

`SamplingParams.constraint` (lego/engine/constraints.py) asks for constrained decoding: every sampled token is one
the constraint's grammar allows. An engine that enforces it says so with `constrained_decoding = True`; a caller
must not hand a constraint to one that does not (the proxy refuses such a request with the protocol's 400).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from lego.engine.constraints import Constraint
from lego.errors import ModelError


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
    # The grammar every sampled token must follow (None: unconstrained); only for engines with constrained_decoding.
    constraint: Constraint | None = None


@dataclass
class GenerateResult:
    token_ids: list[int]
    # log-prob of each sampled token under the temperature-1 policy, masked by the constraint's grammar and
    # renormalised when there is one (the distribution the token was drawn from, before temperature and top-p)
    logprobs: list[float]
    # uint8 [prompt_len + len(token_ids), layers, top_k]: routing of every prompt and generated token
    # (the last generated token's routing is computed too). None for dense models.
    routed_experts: np.ndarray | None
    finish_reason: str  # "stop" (a stop token was sampled, included in token_ids) | "length"
    prompt_tokens: int = 0
    stop_sequence: str | None = None  # the stop string that ended generation, if one did
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class TokenChunk:
    """A piece of a generation, as the engine produces it: the tokens sampled since the previous chunk. The last
    chunk of a generation carries the whole `result` (every token, log-probs, routing, finish reason); the tokens
    of all chunks put together are exactly `result.token_ids`."""

    token_ids: list[int]
    result: GenerateResult | None = None


def stop_string_in(text: str, stops: tuple[str, ...]) -> str | None:
    """The first of `stops` that occurs in `text`, if any (how every engine applies SamplingParams.stop)."""
    return next((stop for stop in stops if stop and stop in text), None)


@runtime_checkable
class Engine(Protocol):
    """A policy that samples and scores token ids. Implementations: transformers, vLLM, scripted."""

    policy_version: int
    max_context: int
    eos_token_ids: tuple[int, ...]
    constrained_decoding: bool  # it enforces SamplingParams.constraint
    keep_warm: bool  # lego.engine.pool keeps it between stages and loads the next policy into it

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult: ...

    def stream(self, prompt_ids: list[int], sampling: SamplingParams) -> AsyncIterator[TokenChunk]:
        """The same generation as `generate`, as chunks of tokens while they are sampled (see `TokenChunk`)."""
        ...

    async def score(self, token_ids: list[int]) -> list[float]:
        """Per-token log-probs (position 0 gets 0.0: nothing predicts it)."""
        ...

    def load_checkpoint(self, path: str, policy_version: int) -> None: ...


async def generate_streaming(engine, prompt_ids: list[int], sampling: SamplingParams,
                             on_tokens: Callable[[list[int]], Awaitable[None]]) -> GenerateResult:
    """Generate with `engine`, awaiting `on_tokens(ids)` with the tokens sampled since the last call, as they come;
    returns the whole result. The engine's stream is read by a task of its own, so chunks that arrive while
    `on_tokens` is busy (a slow client, an engine faster than the network) are handed on together. An engine without
    `stream` is asked with `generate` and its tokens come at once."""
    stream = getattr(engine, "stream", None)
    if stream is None:
        result = await engine.generate(prompt_ids, sampling)
        if result.token_ids:
            await on_tokens(list(result.token_ids))
        return result
    # What the reader has handed over and the consumer not taken yet, and the future the consumer waits on when
    # nothing is there: a list and one wake-up per wait, not an asyncio.Queue put and get per chunk (a chunk is a
    # token or a few: 2% of a streamed call's instructions went to the queue).
    arrived: list[TokenChunk | BaseException] = []
    waiting: list[asyncio.Future] = []

    def hand_over(item: TokenChunk | BaseException) -> None:
        arrived.append(item)
        if waiting:
            waiter = waiting.pop()
            if not waiter.done():
                waiter.set_result(None)

    async def read() -> None:
        chunks = stream(prompt_ids, sampling)
        try:
            async for chunk in chunks:
                hand_over(chunk)
                if chunk.result is not None:
                    return
            raise ModelError("the engine's stream ended without a result; its last chunk must carry the "
                             "GenerateResult")
        except BaseException as exc:  # raised to the caller (an engine's own cancellation too)
            hand_over(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            close = getattr(chunks, "aclose", None)
            if close is not None:  # a reader stopped early (client gone, cancelled) ends the engine's generation
                await close()

    loop = asyncio.get_running_loop()
    reader = asyncio.create_task(read())
    sent: list[int] = []
    try:
        while True:
            if not arrived:
                waiter = loop.create_future()
                waiting.append(waiter)
                await waiter
            items = arrived[:]
            arrived.clear()
            tokens: list[int] = []
            final: GenerateResult | None = None
            failure: BaseException | None = None
            for item in items:
                if isinstance(item, BaseException):
                    failure = item
                    break
                tokens.extend(item.token_ids)
                final = item.result if item.result is not None else final
            if tokens:  # what was sampled before a failure is still handed on
                sent.extend(tokens)
                await on_tokens(tokens)
            if failure is not None:
                raise failure
            if final is not None:
                break
    finally:
        if not reader.done():
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
    if list(final.token_ids) != sent:
        raise ModelError(f"the engine streamed {len(sent)} tokens but its result holds {len(final.token_ids)} "
                         "different ones; a stream's chunks must add up to the result's token_ids")
    return final


class EngineWrapper:
    """An engine around an `inner` one: forwards the policy's identity, scoring and checkpoint loads to it;
    subclasses say how to generate. Its `stream` answers with `generate` in one chunk, so a wrapper that changes
    how generation is served (counting, recording, holding) is never bypassed; a wrapper that can pass the inner
    engine's chunks through overrides `stream` too."""

    keep_warm = False  # made for one use around an engine that may itself be kept (lego.engine.pool)

    def __init__(self, inner) -> None:
        self.inner = inner

    async def stream(self, prompt_ids: list[int], sampling: SamplingParams) -> AsyncIterator[TokenChunk]:
        result = await self.generate(prompt_ids, sampling)
        yield TokenChunk(list(result.token_ids), result)

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    @property
    def max_context(self) -> int:
        return self.inner.max_context

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.inner.eos_token_ids

    @property
    def constrained_decoding(self) -> bool:
        """The inner engine's: a wrapper that generates otherwise than through it says False."""
        return bool(getattr(self.inner, "constrained_decoding", False))

    async def score(self, token_ids: list[int]) -> list[float]:
        return await self.inner.score(token_ids)

    def load_checkpoint(self, path: str, policy_version: int) -> None:
        self.inner.load_checkpoint(path, policy_version)
