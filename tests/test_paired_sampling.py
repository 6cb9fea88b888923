"""Paired sampling (lego.rollout.requests): each attempt samples from a seed named by its round, task and sample, so
the evaluation after RL draws the random numbers its counterpart before RL drew, and a policy that gave what was
drawn more probability draws it again."""

from __future__ import annotations

import pytest
import torch
from fixtures_model import tiny_model_path  # noqa: F401  (session fixture)
from proxy_doubles import BackgroundProxy, RecordingEngine

from lego.config import SamplingConfig
from lego.engine.base import SamplingParams
from lego.engine.transformers_engine import sample_token
from lego.rollout.requests import EVALUATION_ROUND, rollout_requests, round_seed
from lego.tasksets.load import load_tasks


def test_each_attempt_has_its_own_seed_and_a_round_repeats_them():
    tasks = list(load_tasks("bundled", limit=3).tasks)
    first = rollout_requests("run-a", tasks, 4, round_seed(0, 0))
    assert len({request.seed for request in first}) == 12
    again = rollout_requests("run-b", tasks, 4, round_seed(0, 0))  # another stage's data run, the same round
    assert [request.seed for request in again] == [request.seed for request in first]
    for other in (round_seed(0, 1), round_seed(1, 0), round_seed(0, EVALUATION_ROUND)):
        assert not {r.seed for r in rollout_requests("run-a", tasks, 4, other)} & {r.seed for r in first}
    assert {request.seed for request in rollout_requests("run-a", tasks, 4)} == {None}


def test_a_drawn_token_is_drawn_again_when_the_policy_gives_it_more_probability():
    """The engines sample by an exponential race, so with one seed a raised token keeps winning: what pairing needs."""
    generator = torch.Generator().manual_seed(0)
    sampling = SamplingParams(temperature=1.0, seed=0)
    for trial in range(300):
        logits = torch.randn(4096, generator=generator) * 3
        drawn = sample_token(logits, sampling, torch.Generator().manual_seed(trial))
        raised = logits.clone()
        raised[drawn] += 0.3
        lowered_others = logits - 0.2
        lowered_others[drawn] = logits[drawn]
        for better in (raised, lowered_others):
            assert sample_token(better, sampling, torch.Generator().manual_seed(trial)) == drawn


@pytest.fixture(scope="module")
def seeded_proxy(tiny_model_path, tokenizer):  # noqa: F811
    from lego.engine.transformers_engine import TransformersEngine

    inner = TransformersEngine(tiny_model_path, dtype="float32", max_batch_size=4, batch_wait_ms=2.0)
    background = BackgroundProxy(RecordingEngine(inner), tokenizer, SamplingConfig(max_tokens=16))
    yield background
    background.close()
    inner.close()


def two_turns(proxy: BackgroundProxy, seed: int | None) -> list[str]:
    import openai

    session = proxy.server.open_session(seed=seed)
    client = openai.OpenAI(base_url=session.openai_base_url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "Fix the bug in calc.py."}]
    replies = []
    for _ in range(2):
        # the request's own seed is the harness's: ignored, like its other sampling settings
        reply = client.chat.completions.create(model="policy", messages=messages, seed=7)
        replies.append(reply.choices[0].message.content or "")
        messages += [{"role": "assistant", "content": replies[-1]}, {"role": "user", "content": "Go on."}]
    return replies


def test_sessions_with_one_seed_sample_the_same_tokens_call_by_call(seeded_proxy):
    first, again = two_turns(seeded_proxy, 11), two_turns(seeded_proxy, 11)
    assert first == again
    assert first[0] != first[1]  # each call of a session draws from its own seed
    others = [two_turns(seeded_proxy, seed) for seed in (12, 13)]
    assert all(other[0] != first[0] for other in others)
    assert seeded_proxy.server.engine.samplings[-1].seed not in (None, 7)
    two_turns(seeded_proxy, None)  # a session without a seed: the engine's own random stream, whatever was asked
    assert seeded_proxy.server.engine.samplings[-1].seed is None
