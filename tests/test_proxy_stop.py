"""Stop strings (OpenAI `stop`, Anthropic `stop_sequences`): the reply ends before the stop string, the session
keeps every sampled token, and the next turn extends the stream."""

from __future__ import annotations

import asyncio

import anthropic
import openai
import pytest
from fixtures_model import tiny_model_path  # noqa: F401  (session fixture)
from proxy_doubles import BackgroundProxy

from lego.config import SamplingConfig
from lego.engine.base import SamplingParams


@pytest.fixture(scope="module")
def inner(tiny_model_path):  # noqa: F811
    from lego.engine.transformers_engine import TransformersEngine

    engine = TransformersEngine(tiny_model_path, dtype="float32", max_batch_size=2, batch_wait_ms=1.0)
    yield engine
    engine.close()


def test_transformers_engine_stops_on_the_token_that_completes_a_stop_string(inner, tokenizer):
    plain = asyncio.run(inner.generate([151644, 872, 198, 9707], SamplingParams(max_tokens=64, seed=3)))
    text = tokenizer.decode(plain.token_ids)
    stop = next(ch for ch in text[4:] if ch.isalpha())  # a letter the seeded sample does produce
    stopped = asyncio.run(inner.generate([151644, 872, 198, 9707],
                                         SamplingParams(max_tokens=64, seed=3, stop=(stop,))))
    assert stopped.finish_reason == "stop" and stopped.stop_sequence == stop
    assert stop in tokenizer.decode(stopped.token_ids)
    assert stop not in tokenizer.decode(stopped.token_ids[:-1])
    assert stopped.token_ids == plain.token_ids[: len(stopped.token_ids)]  # same seed: same tokens up to the stop
    assert stopped.routed_experts.shape[0] == 4 + len(stopped.token_ids)


@pytest.fixture()
def scripted(inner, tokenizer):
    from lego.engine.scripted import ScriptedEngine

    script = ["Let me look. <function=execute_bash>ls</function> and then some rambling",
              "Done <stop-here> never shown"]
    engine = ScriptedEngine(inner, tokenizer, script)
    proxy = BackgroundProxy(engine, tokenizer, SamplingConfig(max_tokens=64))
    yield proxy
    proxy.close()


def test_openai_stop_ends_the_reply_and_the_session_keeps_the_sampled_tokens(scripted, tokenizer):
    session = scripted.open_session()
    client = openai.OpenAI(base_url=session.openai_base_url, api_key="unused", max_retries=0)
    messages = [{"role": "system", "content": "You are OpenHands."}, {"role": "user", "content": "List files"}]
    first = client.chat.completions.create(model="p", messages=messages, stop=["</function"])
    assert first.choices[0].message.content == "Let me look. <function=execute_bash>ls"
    assert first.choices[0].finish_reason == "stop"
    segments, calls = session.trajectory_parts()
    sampled = [t for t, m in zip(segments[0].token_ids, segments[0].response_mask, strict=True) if m]
    assert tokenizer.decode(sampled).endswith("</function")  # what was sampled, stop string included
    assert "rambling" not in tokenizer.decode(segments[0].token_ids)

    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "file.txt"}]
    client.chat.completions.create(model="p", messages=messages, stop="<stop-here>")
    segments, calls = session.trajectory_parts()
    assert [call.kind for call in calls] == ["start", "extend"]
    assert len(segments) == 1


def test_anthropic_stop_sequences_report_which_one_fired(scripted):
    session = scripted.open_session()
    client = anthropic.Anthropic(base_url=session.anthropic_base_url, api_key="unused", max_retries=0)
    reply = client.messages.create(model="p", max_tokens=64, stop_sequences=["<function="],
                                   messages=[{"role": "user", "content": "List files"}])
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == "<function="
    assert reply.content[0].text == "Let me look."


def test_bad_stop_is_a_400(scripted):
    session = scripted.open_session()
    client = openai.OpenAI(base_url=session.openai_base_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="stop"):
        client.chat.completions.create(model="p", messages=[{"role": "user", "content": "x"}],
                                       stop=["a", "b", "c", "d", "e"])
