"""The engines' incremental form: tokens come as they are sampled, and add up to what `generate` returns.

On the real tiny Qwen3-MoE. The transformers engine's model thread is held after its first sampled token until the
test lets it go: the first chunk is in the test's hands while the generation has not ended.
"""
# ruff: noqa: F811  (pytest fixtures imported from fixtures_model are parameters here)

from __future__ import annotations

import asyncio
import threading

import numpy as np
from fixtures_model import fp32_engine, tiny_model_path, tiny_tokenizer  # noqa: F401

from lego.engine.base import EngineWrapper, SamplingParams, TokenChunk, generate_streaming

PROMPT = [151644, 872, 198, 9707, 11, 1879, 0, 151645, 198, 151644, 77091, 198]


async def collect(stream) -> list[TokenChunk]:
    return [chunk async for chunk in stream]


def test_transformers_engine_streams_its_tokens_before_the_generation_ends(fp32_engine):
    engine = fp32_engine
    sampling = SamplingParams(max_tokens=12, seed=5)
    whole = asyncio.run(engine.generate(PROMPT, sampling))
    held, first_sampled = threading.Event(), threading.Event()
    sample = engine._sample_into

    def sample_then_hold(row, logits) -> None:
        first = row.job.on_token is not None and not row.tokens  # the streamed row's first token
        if first:
            # set before sampling delivers the token: the event loop may read it before this thread runs again
            first_sampled.set()
        sample(row, logits)
        if first:
            held.wait(60)

    async def scenario() -> tuple[TokenChunk, list[TokenChunk]]:
        stream = engine.stream(PROMPT, sampling)
        first = await anext(stream)
        try:
            assert first_sampled.is_set() and not held.is_set()  # the model thread is still on token one
        finally:
            held.set()
        return first, await collect(stream)

    engine._sample_into = sample_then_hold
    try:
        first, rest = asyncio.run(scenario())
    finally:
        del engine._sample_into
    assert first.token_ids == whole.token_ids[:1] and first.result is None
    assert rest[-1].result is not None and all(chunk.result is None for chunk in rest[:-1])
    streamed = first.token_ids + [token for chunk in rest for token in chunk.token_ids]
    result = rest[-1].result
    assert streamed == result.token_ids == whole.token_ids  # same seed: the same generation
    np.testing.assert_allclose(result.logprobs, whole.logprobs, atol=1e-5)
    np.testing.assert_array_equal(result.routed_experts, whole.routed_experts)
    assert result.finish_reason == whole.finish_reason


def test_a_stream_left_early_ends_the_engines_generation(fp32_engine):
    async def scenario():
        stream = fp32_engine.stream(PROMPT, SamplingParams(max_tokens=400, seed=1, stop_token_ids=()))
        await anext(stream)
        await stream.aclose()  # the client went away
        # the engine is free again: a later request is served (the abandoned row stopped at its next step)
        return await fp32_engine.generate(PROMPT, SamplingParams(max_tokens=3, seed=2))

    before = fp32_engine.stats["decode_steps"]
    assert len(asyncio.run(scenario()).token_ids) == 3
    assert fp32_engine.stats["decode_steps"] - before < 400


def test_scripted_engine_streams_its_script_scored_by_the_real_model(fp32_engine, tiny_tokenizer):
    from lego.engine.scripted import ScriptedEngine

    streaming = ScriptedEngine(fp32_engine, tiny_tokenizer, ["Let me look at the code."])
    whole = ScriptedEngine(fp32_engine, tiny_tokenizer, ["Let me look at the code."])
    params = SamplingParams(max_tokens=64, stop_token_ids=(151645,))
    chunks = asyncio.run(collect(streaming.stream(PROMPT, params)))
    expected = asyncio.run(whole.generate(PROMPT, params))
    assert [len(chunk.token_ids) for chunk in chunks[:-1]] == [1] * (len(chunks) - 1)  # one token at a time
    assert [t for chunk in chunks for t in chunk.token_ids] == chunks[-1].result.token_ids == expected.token_ids
    np.testing.assert_allclose(chunks[-1].result.logprobs, expected.logprobs, atol=1e-6)


def test_generate_streaming_hands_on_chunks_and_returns_the_result(fp32_engine):
    received: list[list[int]] = []

    async def on_tokens(ids: list[int]) -> None:
        received.append(ids)

    class Counting(EngineWrapper):  # a wrapper that only overrides generate: its stream goes through it
        calls = 0

        async def generate(self, prompt_ids, sampling):
            Counting.calls += 1
            return await self.inner.generate(prompt_ids, sampling)

    sampling = SamplingParams(max_tokens=6, seed=9)
    result = asyncio.run(generate_streaming(fp32_engine, PROMPT, sampling, on_tokens))
    assert [t for ids in received for t in ids] == result.token_ids and len(result.token_ids) == 6
    received.clear()
    wrapped = asyncio.run(generate_streaming(Counting(fp32_engine), PROMPT, sampling, on_tokens))
    assert Counting.calls == 1 and received == [wrapped.token_ids] and wrapped.token_ids == result.token_ids


def test_generate_streaming_batches_what_arrives_while_the_reader_is_busy_and_ends_cleanly():
    """Beside the real engine: a scripted stream shows the hand-over itself. Chunks that arrive while `on_tokens` is
    still busy come in one call; tokens sampled before a failure are handed on, then the failure is raised; a
    consumer cancelled while it waits closes the engine's stream."""
    from lego.engine.base import GenerateResult

    class Scripted:
        def __init__(self, steps):
            self.steps, self.closed = steps, False

        async def stream(self, prompt_ids, sampling):
            try:
                for step in self.steps:
                    if isinstance(step, float):
                        await asyncio.sleep(step)
                    elif isinstance(step, Exception):
                        raise step
                    else:
                        yield step
            finally:
                self.closed = True

    def chunk(ids, last=False, all_ids=()):
        result = GenerateResult(token_ids=list(all_ids), logprobs=[0.0] * len(all_ids), routed_experts=None,
                                finish_reason="stop", prompt_tokens=1) if last else None
        return TokenChunk(ids, result)

    async def run(engine, slow=0.0, received=None):
        received = [] if received is None else received

        async def on_tokens(ids):
            received.append(list(ids))
            await asyncio.sleep(slow)
        result = await generate_streaming(engine, [1], SamplingParams(), on_tokens)
        return received, result

    # the first chunk alone; the next three arrive while on_tokens sleeps, and come together
    steps = [chunk([1]), 0.01, chunk([2]), chunk([3]), chunk([4], True, [1, 2, 3, 4])]
    received, result = asyncio.run(run(Scripted(steps), slow=0.05))
    assert received == [[1], [2, 3, 4]] and result.token_ids == [1, 2, 3, 4]
    # a failure after tokens: they are handed on, then the failure is the caller's
    failing, handed = Scripted([chunk([5]), 0.01, chunk([6]), RuntimeError("engine died")]), []
    try:
        asyncio.run(run(failing, received=handed))
        raise AssertionError("the engine's failure must reach the caller")
    except RuntimeError as exc:
        assert "engine died" in str(exc)
    assert handed == [[5], [6]] and failing.closed

    # a consumer cancelled while waiting for tokens ends the engine's stream
    async def cancel_while_waiting():
        engine = Scripted([chunk([7]), 30.0, chunk([8], True, [7, 8])])
        task = asyncio.ensure_future(run(engine))
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return engine.closed
    assert asyncio.run(cancel_while_waiting())
