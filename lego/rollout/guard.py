"""The turn guard: a session's engine that serves `limit` generations and trips instead of serving the next."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from lego.engine.base import EngineWrapper, GenerateResult, SamplingParams, TokenChunk
from lego.errors import LegoError


class TurnLimitReached(LegoError):
    """The harness asked for more turns than rollout allows (harness.max_turns)."""


class TurnGuard(EngineWrapper):
    def __init__(self, inner, limit: int) -> None:
        super().__init__(inner)
        self.limit = limit
        self.calls = 0
        self.tripped = asyncio.Event()
        self.released = asyncio.Event()

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        await self.admit()
        return await self.inner.generate(prompt_ids, sampling)

    async def stream(self, prompt_ids: list[int], sampling: SamplingParams) -> AsyncIterator[TokenChunk]:
        """Counted like `generate`; the inner engine's chunks pass through as they come."""
        await self.admit()
        inner_stream = getattr(self.inner, "stream", None)
        if inner_stream is None:
            result = await self.inner.generate(prompt_ids, sampling)
            yield TokenChunk(list(result.token_ids), result)
            return
        async for chunk in inner_stream(prompt_ids, sampling):
            yield chunk

    async def admit(self) -> None:
        """Count one generation; past the limit, trip and never serve it."""
        self.calls += 1
        if self.calls > self.limit:
            self.tripped.set()
            # Hold the answer until the harness is gone: it must not see an error and retry in the meantime.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.released.wait(), 30)
            raise TurnLimitReached(f"turn limit of {self.limit} calls reached")
