"""TransformersEngine, ScriptedEngine and make_engine on the real tiny Qwen3-MoE (vLLM: test_vllm_engine.py)."""
# ruff: noqa: F811  (pytest fixtures imported from fixtures_model are parameters here)

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from fixtures_model import fp32_engine, plain_model, tiny_model_path, tiny_tokenizer  # noqa: F401

from lego.engine.base import Engine, SamplingParams
from lego.engine.checkpoint import moe_routers
from lego.train.replay import record_routing

PROMPT = [151644, 872, 198, 9707, 11, 1879, 0, 151645, 198, 151644, 77091, 198]


def run(coroutine):
    return asyncio.run(coroutine)


def reference_logprobs(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].numpy()


def reference_routing(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad(), record_routing(model) as chosen:
        model(input_ids=torch.tensor([ids]))
    return torch.stack(chosen, dim=1).numpy()  # [tokens, layers, top_k]


def test_engine_satisfies_protocol(fp32_engine):
    assert isinstance(fp32_engine, Engine)
    assert fp32_engine.policy_version == 0
    assert 151645 in fp32_engine.eos_token_ids


def test_max_tokens_and_greedy_is_argmax(fp32_engine, plain_model):
    result = run(fp32_engine.generate(PROMPT, SamplingParams(temperature=0, max_tokens=7)))
    assert len(result.token_ids) == 7 and result.finish_reason == "length"
    ids = PROMPT + result.token_ids
    with torch.no_grad():
        logits = plain_model(input_ids=torch.tensor([ids])).logits[0]
    greedy = logits[len(PROMPT) - 1:-1].argmax(-1).tolist()
    assert result.token_ids == greedy


def test_stop_token_is_included_and_ends_generation(fp32_engine):
    free = run(fp32_engine.generate(PROMPT, SamplingParams(max_tokens=12, seed=5)))
    index = next(i for i, token in enumerate(free.token_ids) if i >= 2 and token not in free.token_ids[:i])
    stop = free.token_ids[index]
    stopped = run(fp32_engine.generate(PROMPT, SamplingParams(max_tokens=12, seed=5, stop_token_ids=(stop,))))
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[: index + 1]
    assert stopped.routed_experts.shape[0] == len(PROMPT) + index + 1


def test_seed_makes_sampling_deterministic_and_temperature_matters(fp32_engine):
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=7)
    first = run(fp32_engine.generate(PROMPT, params))
    second = run(fp32_engine.generate(PROMPT, params))
    assert first.token_ids == second.token_ids
    others = [run(fp32_engine.generate(PROMPT, SamplingParams(temperature=1.0, max_tokens=16, seed=s))).token_ids
              for s in (1, 2)]
    assert any(tokens != first.token_ids for tokens in others)


def test_tiny_top_p_samples_the_most_likely_token(fp32_engine):
    greedy = run(fp32_engine.generate(PROMPT, SamplingParams(temperature=0, max_tokens=8)))
    nucleus = run(fp32_engine.generate(PROMPT, SamplingParams(temperature=1.5, top_p=1e-6, max_tokens=8, seed=3)))
    assert nucleus.token_ids == greedy.token_ids


def test_logprobs_are_temperature_one_and_match_a_scoring_forward(fp32_engine, plain_model):
    result = run(fp32_engine.generate(PROMPT, SamplingParams(temperature=0.7, top_p=0.9, max_tokens=20, seed=1)))
    expected = reference_logprobs(plain_model, PROMPT + result.token_ids)[len(PROMPT) - 1:]
    np.testing.assert_allclose(result.logprobs, expected, atol=1e-4)
    scored = run(fp32_engine.score(PROMPT + result.token_ids))
    assert scored[0] == 0.0 and len(scored) == len(PROMPT) + len(result.token_ids)
    np.testing.assert_allclose(scored[len(PROMPT):], result.logprobs, atol=1e-4)
    # Scoring only the reply (the LM head over its positions alone) gives the same values and the same routing.
    ids = PROMPT + result.token_ids
    whole, whole_routing = run(fp32_engine.score_with_routing(ids))
    tail, tail_routing = run(fp32_engine.score_with_routing(ids, first=len(PROMPT)))
    assert len(tail) == len(result.token_ids)
    np.testing.assert_allclose(tail, whole[len(PROMPT):], atol=1e-5)
    np.testing.assert_array_equal(tail_routing, whole_routing)
    assert run(fp32_engine.score_with_routing(ids, first=len(ids)))[0] == []
    with pytest.raises(ValueError, match="outside"):
        run(fp32_engine.score_with_routing(ids, first=len(ids) + 1))


def test_routing_covers_prompt_and_generated_tokens_and_matches_the_routers(fp32_engine, plain_model):
    result = run(fp32_engine.generate(PROMPT, SamplingParams(temperature=1.0, max_tokens=15, seed=2)))
    routers = moe_routers(plain_model)
    shape = (len(PROMPT) + len(result.token_ids), len(routers), routers[0].top_k)
    assert result.routed_experts.shape == shape and result.routed_experts.dtype == np.uint8
    expected = reference_routing(plain_model, PROMPT + result.token_ids)
    np.testing.assert_array_equal(np.sort(result.routed_experts, -1), np.sort(expected, -1))


def test_concurrent_requests_are_batched_and_leave_the_loop_free(fp32_engine, plain_model):
    async def scenario():
        ticks_while_busy = 0
        prompts = [PROMPT[: 4 + i] for i in range(6)]
        tasks = [asyncio.create_task(fp32_engine.generate(p, SamplingParams(max_tokens=10 + 3 * i, seed=i)))
                 for i, p in enumerate(prompts)]
        while not all(task.done() for task in tasks):
            ticks_while_busy += 1
            await asyncio.sleep(0.002)
        return prompts, [task.result() for task in tasks], ticks_while_busy

    batches_before = fp32_engine.stats["batches"]
    prompts, results, ticks = run(scenario())
    assert ticks >= 3  # the event loop kept running other coroutines while the model worked
    assert fp32_engine.stats["batches"] - batches_before < len(prompts)  # some requests shared a batch
    for i, (prompt, result) in enumerate(zip(prompts, results, strict=True)):
        assert len(result.token_ids) == 10 + 3 * i
        expected = reference_logprobs(plain_model, prompt + result.token_ids)[len(prompt) - 1:]
        np.testing.assert_allclose(result.logprobs, expected, atol=1e-4)
        assert result.routed_experts.shape[0] == len(prompt) + len(result.token_ids)


def test_bf16_engine_is_close_to_fp32(tiny_model_path, plain_model):
    from lego.engine.transformers_engine import TransformersEngine

    engine = TransformersEngine(tiny_model_path)  # bfloat16 by default
    try:
        assert engine.model.dtype == torch.bfloat16
        result = run(engine.generate(PROMPT, SamplingParams(max_tokens=12, seed=0)))
    finally:
        engine.close()
    expected = reference_logprobs(plain_model, PROMPT + result.token_ids)[len(PROMPT) - 1:]
    assert np.abs(np.array(result.logprobs) - expected).max() < 0.1


def test_scripted_engine_emits_the_script_with_real_logprobs(fp32_engine, tiny_tokenizer, plain_model):
    from lego.engine.scripted import DEFAULT_FINAL_TEXT, ScriptedEngine

    engine = ScriptedEngine(fp32_engine, tiny_tokenizer, ["Let me look at the code.", "THOUGHT: run tests"])
    params = SamplingParams(max_tokens=64, stop_token_ids=(151645,))
    texts = []
    for _ in range(3):
        result = run(engine.generate(PROMPT, params))
        assert result.finish_reason == "stop" and result.token_ids[-1] == 151645
        texts.append(tiny_tokenizer.decode(result.token_ids[:-1]))
        expected = reference_logprobs(plain_model, PROMPT + result.token_ids)[len(PROMPT) - 1:]
        np.testing.assert_allclose(result.logprobs, expected, atol=1e-4)
        assert result.routed_experts.shape[0] == len(PROMPT) + len(result.token_ids)
    assert texts == ["Let me look at the code.", "THOUGHT: run tests", DEFAULT_FINAL_TEXT]


def test_make_engine_picks_by_kind(lego_config, tiny_model_path):
    from lego.engine.factory import make_engine
    from lego.engine.scripted import ScriptedEngine
    from lego.engine.transformers_engine import TransformersEngine

    config = lego_config.model_copy(deep=True)
    config.engine.kind = "scripted"
    engine = make_engine(config, tiny_model_path, script=["hi"])
    try:
        assert isinstance(engine, ScriptedEngine) and isinstance(engine.inner, TransformersEngine)
    finally:
        engine.inner.close()


def test_vllm_engine_generates_with_routing(tiny_model_path):
    """vLLM's own routed-experts capture (GPU); tests/test_vllm_engine.py covers the engine and its CPU capture."""
    from lego.engine.vllm_engine import VLLMEngine, vllm_available

    if not torch.cuda.is_available() or not vllm_available():
        pytest.skip("vLLM's routed-experts capture needs a CUDA device and vLLM's GPU build")

    engine = VLLMEngine(tiny_model_path, dtype="bfloat16", max_context=2048, enforce_eager=True)
    result = run(engine.generate(PROMPT, SamplingParams(max_tokens=8, seed=0)))
    assert len(result.token_ids) == 8 and len(result.logprobs) == 8
    assert result.routed_experts.shape[0] == len(PROMPT) + 8
