"""Test doubles for the proxy: a scripted engine that emits given replies, and a proxy on a background loop.

The scripted engine stands beside the real TransformersEngine tests: a random tiny model cannot be made to
write a tool call, so tool-call and harness-replay tests script the model's tokens while the real model tests
cover the same server path with sampled tokens.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from lego.config import SamplingConfig
from lego.engine.base import EngineWrapper, GenerateResult, SamplingParams

IM_END = 151645


def tool_call_text(name: str, arguments: dict[str, Any], spaced: bool = True) -> str:
    args = json.dumps(arguments) if spaced else json.dumps(arguments, separators=(",", ":"))
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


def assistant_text(content: str = "", calls: Iterable[tuple[str, dict[str, Any]]] = ()) -> str:
    """What Qwen3 writes for a turn: the text, then each tool call on its own line (as the template renders it)."""
    text = content
    for name, arguments in calls:
        text += ("\n" if text else "") + tool_call_text(name, arguments)
    return text


_GRAMMARS: dict[int, Any] = {}  # id(tokenizer) -> GrammarMasks (reading a vocabulary takes seconds)


def follows_constraint(tokenizer, constraint, tokens: list[int]) -> bool:
    """Whether `tokens` (a whole reply, its stop token included) is a reply the constraint's grammar allows, checked
    with the engines' own grammar code (lego/engine/grammar_mask.py): each token must be one the logits mask allows
    (what an engine samples from) and one the grammar's matcher accepts (the two must agree)."""
    import torch

    from lego.engine.grammar_mask import GrammarMasks

    masks = _GRAMMARS.get(id(tokenizer))
    if masks is None:
        masks = _GRAMMARS[id(tokenizer)] = GrammarMasks(tokenizer, 151936)
    mask = masks.mask(masks.compile(constraint), (IM_END,))
    logits = torch.zeros(151936)
    for token in tokens:
        allowed = bool(torch.isfinite(mask.apply(logits)[token]))
        accepted = mask.matcher.accept_token(token)
        assert allowed == accepted, f"the mask and the matcher disagree on token {token}"
        if not accepted:
            return False
    return mask.complete


class ScriptedEngine:
    """The Engine protocol, answering each generate() with the next scripted reply (text or token ids).

    Log-probs are distinct per sampled token (so tests can tell them apart), routing is a deterministic function
    of (token, position), and every prompt and result is kept for the tests to compare with the proxy's record.
    A constrained request (SamplingParams.constraint) is answered only with a scripted reply its grammar allows:
    the tests script what a constrained model could write, and the double checks the proxy's grammar allows it.
    """

    constrained_decoding = True

    def __init__(self, tokenizer, replies: Iterable[str | list[int]] = (), max_context: int = 32768,
                 layers: int = 2, top_k: int = 2, experts: int = 4, delay_s: float = 0.0) -> None:
        self.tokenizer = tokenizer
        self.replies: deque[str | list[int]] = deque(replies)
        self.max_context = max_context
        self.eos_token_ids: tuple[int, ...] = (IM_END,)
        self.policy_version = 0
        self.layers, self.top_k, self.experts = layers, top_k, experts
        self.delay_s = delay_s
        self.prompts: list[list[int]] = []
        self.results: list[GenerateResult] = []
        self.samplings: list[SamplingParams] = []
        self._counter = 0

    def script(self, *replies: str | list[int]) -> None:
        self.replies.extend(replies)

    def routing(self, ids: list[int]) -> np.ndarray:
        positions = np.arange(len(ids))[:, None, None]
        layer = np.arange(self.layers)[None, :, None]
        slot = np.arange(self.top_k)[None, None, :]
        return ((np.asarray(ids)[:, None, None] + positions + layer * 3 + slot) % self.experts).astype(np.uint8)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        reply = self.replies.popleft() if self.replies else "ok"
        if isinstance(reply, str):
            tokens = self.tokenizer.encode(reply, add_special_tokens=False) + [IM_END]
        else:
            tokens = list(reply)
        if sampling.constraint is not None:
            assert follows_constraint(self.tokenizer, sampling.constraint, tokens), (
                f"the scripted reply {reply!r} is not one {sampling.constraint.what} allows")
        finish = "stop"
        if len(tokens) > sampling.max_tokens:
            tokens, finish = tokens[: sampling.max_tokens], "length"
        logprobs = []
        for _ in tokens:
            self._counter += 1
            logprobs.append(-0.001 * self._counter)
        result = GenerateResult(token_ids=tokens, logprobs=logprobs,
                                routed_experts=self.routing(list(prompt_ids) + tokens), finish_reason=finish,
                                prompt_tokens=len(prompt_ids))
        self.prompts.append(list(prompt_ids))
        self.samplings.append(sampling)
        self.results.append(result)
        return result

    async def score(self, token_ids: list[int]) -> list[float]:
        return [0.0] * len(token_ids)

    def load_checkpoint(self, path: str, policy_version: int) -> None:
        self.policy_version = policy_version


class BackgroundProxy:
    """A ProxyServer running on its own event loop thread, so sync clients (openai, anthropic) can call it."""

    def __init__(self, engine, tokenizer, sampling: SamplingConfig | None = None) -> None:
        from lego.proxy import ProxyServer

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = ProxyServer(engine, tokenizer, sampling or SamplingConfig(max_tokens=256))
        self.run(self.server.start())

    def run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=300)

    def open_session(self, label: str = ""):
        return self.server.open_session(label)

    def close(self) -> None:
        self.run(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


class RecordingEngine(EngineWrapper):
    """Wraps a real engine and keeps every prompt and result, to compare with the proxy's record."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.prompts: list[list[int]] = []
        self.results: list[GenerateResult] = []
        self.samplings: list[SamplingParams] = []

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        result = await self.inner.generate(prompt_ids, sampling)
        self.prompts.append(list(prompt_ids))
        self.samplings.append(sampling)
        self.results.append(result)
        return result


def check_fidelity(session, engine) -> tuple[list, list]:
    """The proxy's record against what the engine did (engine: ScriptedEngine or RecordingEngine)."""
    segments, calls = session.trajectory_parts()
    served = [call for call in calls if call.error is None]
    assert len(served) == len(engine.results)
    for call, prompt, result in zip(served, engine.prompts, engine.results, strict=True):
        segment = segments[call.segment_index]
        n, k = len(prompt), len(result.token_ids)
        assert segment.token_ids[:n].tolist() == prompt
        assert segment.token_ids[n:n + k].tolist() == result.token_ids
        assert segment.response_mask[n:n + k].tolist() == [1] * k
        np.testing.assert_array_equal(segment.logprobs[n:n + k], np.asarray(result.logprobs, dtype=np.float32))
        np.testing.assert_array_equal(segment.routed_experts[n:n + k], result.routed_experts[n:n + k])
        assert call.prompt_tokens == n and call.completion_tokens == k
    # mask 1 exactly on sampled tokens: each sampled token once, nothing else
    assert sum(s.num_sampled for s in segments) == sum(len(r.token_ids) for r in engine.results)
    for segment in segments:
        assert not segment.logprobs[segment.response_mask == 0].any()
        assert segment.token_ids.dtype == np.int32 and segment.response_mask.dtype == np.uint8
        assert segment.routed_experts.dtype == np.uint8 and segment.routed_experts.shape[1:] == (2, 2)
    main_calls = [(c, i) for i, c in enumerate(served) if c.kind != "subagent"]
    last, index = main_calls[-1]
    final = segments[last.segment_index]
    assert final.thread == "main"
    assert final.token_ids.tolist() == engine.prompts[index] + engine.results[index].token_ids
    return segments, calls


@contextmanager
def background_proxy(engine, tokenizer, max_tokens: int) -> Iterator[BackgroundProxy]:
    """A proxy in a background thread over `engine` (reachable as `.engine`), replies capped at `max_tokens`."""
    background = BackgroundProxy(engine, tokenizer, SamplingConfig(max_tokens=max_tokens))
    background.engine = engine
    try:
        yield background
    finally:
        background.close()


@pytest.fixture()
def proxy(tokenizer):
    """A proxy over a ScriptedEngine, replies capped at 32 tokens."""
    with background_proxy(ScriptedEngine(tokenizer), tokenizer, 32) as background:
        yield background
