"""The real openai and anthropic clients against the proxy: the real tiny model, and scripted tool calls."""

from __future__ import annotations

import json

import pytest
from fixtures_model import tiny_model_path  # noqa: F401  (session fixture)
from proxy_doubles import BackgroundProxy, RecordingEngine, ScriptedEngine, assistant_text, check_fidelity

from lego.config import SamplingConfig

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a shell command",
                                         "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                        "required": ["command"]}}}
BASH_ANTHROPIC = {"name": "Bash", "description": "Run a shell command",
                  "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}


@pytest.fixture(scope="module")
def real_proxy(tiny_model_path, tokenizer):  # noqa: F811
    from lego.engine.transformers_engine import TransformersEngine

    inner = TransformersEngine(tiny_model_path, dtype="float32", max_batch_size=4, batch_wait_ms=2.0)
    engine = RecordingEngine(inner)
    background = BackgroundProxy(engine, tokenizer, SamplingConfig(max_tokens=12))
    background.engine = engine
    yield background
    background.close()
    inner.close()


@pytest.fixture()
def scripted_proxy(tokenizer):
    engine = ScriptedEngine(tokenizer)
    background = BackgroundProxy(engine, tokenizer)
    background.engine = engine
    yield background
    background.close()


def fresh_recording(proxy) -> None:
    proxy.engine.prompts.clear(), proxy.engine.results.clear(), proxy.engine.samplings.clear()


def test_real_model_openai_chat_stream_and_not(real_proxy):
    fresh_recording(real_proxy)
    session = real_proxy.open_session()
    import openai

    client = openai.OpenAI(base_url=session.openai_base_url, api_key="unused", max_retries=0)
    messages = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix calc.py"}]
    first = client.chat.completions.create(model="policy", messages=messages, tools=[BASH], max_tokens=8,
                                           temperature=0.0)
    choice = first.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert first.usage.completion_tokens == len(real_proxy.engine.results[0].token_ids) <= 8
    assert real_proxy.engine.samplings[0].temperature == 1.0  # the policy's, not the request's 0.0
    messages += [{"role": "assistant", "content": choice.message.content or ""},
                 {"role": "user", "content": "Please continue."}]
    stream = client.chat.completions.create(model="policy", messages=messages, tools=[BASH], stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage.completion_tokens == len(real_proxy.engine.results[1].token_ids)
    messages.append({"role": "assistant", "content": text})
    messages.append({"role": "user", "content": "Done?"})
    client.chat.completions.create(model="policy", messages=messages, tools=[BASH])
    segments, calls = check_fidelity(session, real_proxy.engine)
    assert [c.kind for c in calls] == ["start", "extend", "extend"]
    assert len(segments) == 1 and segments[0].num_sampled == sum(c.completion_tokens for c in calls)


def test_real_model_anthropic_stream_and_not(real_proxy):
    fresh_recording(real_proxy)
    session = real_proxy.open_session()
    import anthropic

    client = anthropic.Anthropic(base_url=session.anthropic_base_url, api_key="unused", max_retries=0)
    system = [{"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}]
    messages = [{"role": "user", "content": [{"type": "text", "text": "Fix calc.py"}]}]
    first = client.messages.create(model="policy", max_tokens=8000, system=system, tools=[BASH_ANTHROPIC],
                                   messages=messages)
    assert first.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert real_proxy.engine.samplings[0].max_tokens == 12  # clamped to the sampling config
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": "Go on."}]
    with client.messages.stream(model="policy", max_tokens=64000, system=system, tools=[BASH_ANTHROPIC],
                                messages=messages) as stream:
        final = stream.get_final_message()
    assert final.usage.output_tokens == len(real_proxy.engine.results[1].token_ids)
    segments, calls = check_fidelity(session, real_proxy.engine)
    assert [c.kind for c in calls][0] == "start" and all(c.protocol == "anthropic_messages" for c in calls)


def test_real_model_responses_api(real_proxy):
    fresh_recording(real_proxy)
    session = real_proxy.open_session()
    import openai

    client = openai.OpenAI(base_url=session.openai_base_url, api_key="unused", max_retries=0)
    response = client.responses.create(model="policy", instructions="You are Codex.", input="Fix calc.py",
                                       tools=[{"type": "function", "name": "exec_command", "parameters": {
                                           "type": "object", "properties": {"cmd": {"type": "string"}}}}])
    assert response.status == "completed" and response.output
    with client.responses.stream(model="policy", instructions="You are Codex.", input="Fix calc.py") as stream:
        final = stream.get_final_response()
    assert final.status == "completed"
    check_fidelity(session, real_proxy.engine)


def test_openai_client_tool_calls_both_ways(scripted_proxy):
    session, engine = scripted_proxy.open_session(), scripted_proxy.engine
    engine.script(assistant_text("Looking.", [("bash", {"command": "ls"}), ("bash", {"command": "pwd"})]),
                  assistant_text("", [("bash", {"command": "cat calc.py"})]), "All done.")
    import openai

    client = openai.OpenAI(base_url=session.openai_base_url, api_key="unused", max_retries=0)
    messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": "fix"}]
    first = client.chat.completions.create(model="m", messages=messages, tools=[BASH], tool_choice="auto")
    calls = first.choices[0].message.tool_calls
    assert first.choices[0].finish_reason == "tool_calls"
    assert [json.loads(c.function.arguments) for c in calls] == [{"command": "ls"}, {"command": "pwd"}]
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages += [{"role": "tool", "tool_call_id": c.id, "content": "out"} for c in calls]
    stream = list(client.chat.completions.create(model="m", messages=messages, tools=[BASH], stream=True))
    deltas = [c.choices[0].delta for c in stream if c.choices]
    streamed = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert streamed[0].function.name == "bash" and streamed[1].function.arguments == '{"command": "cat calc.py"}'
    assert stream[-1].choices[0].finish_reason == "tool_calls"
    messages += [{"role": "assistant", "content": None, "tool_calls": [
        {"id": streamed[0].id, "type": "function", "function": {"name": "bash", "arguments": '{"command":"cat calc.py"}'}}]},
        {"role": "tool", "tool_call_id": streamed[0].id, "content": "def add(a, b): return a - b"}]
    last = client.chat.completions.create(model="m", messages=messages, tools=[BASH])
    assert last.choices[0].message.content == "All done." and last.choices[0].finish_reason == "stop"
    _, records = check_fidelity(session, engine)
    assert [r.kind for r in records] == ["start", "extend", "extend"]


def test_anthropic_client_tool_use_both_ways_with_thinking(scripted_proxy):
    session, engine = scripted_proxy.open_session(), scripted_proxy.engine
    engine.script("<think>\nI should list files.\n</think>\n\n"
                  + assistant_text("Listing.", [("Bash", {"command": "ls"})]), "Done.")
    import anthropic

    client = anthropic.Anthropic(base_url=session.anthropic_base_url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "fix"}]
    with client.messages.stream(model="m", max_tokens=1000, system="agent", tools=[BASH_ANTHROPIC],
                                messages=messages, extra_body={"thinking": {"type": "adaptive"},
                                                               "context_management": {"edits": []},
                                                               "output_config": {"effort": "high"}}) as stream:
        first = stream.get_final_message()
    assert [b.type for b in first.content] == ["thinking", "text", "tool_use"]
    assert first.content[0].thinking == "I should list files." and first.content[2].input == {"command": "ls"}
    assert first.stop_reason == "tool_use"
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": first.content[2].id,
                                               "content": [{"type": "text", "text": "calc.py"}]}]}]
    second = client.messages.create(model="m", max_tokens=1000, system="agent", tools=[BASH_ANTHROPIC],
                                    messages=messages)
    assert second.content[0].text == "Done." and second.stop_reason == "end_turn"
    _, records = check_fidelity(session, engine)
    assert [r.kind for r in records] == ["start", "extend"]


def test_malformed_tool_calls_come_back_as_text(scripted_proxy):
    session, engine = scripted_proxy.open_session(), scripted_proxy.engine
    broken = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"\n</tool_call>'
    engine.script(broken, '<tool_call>\n{"name": "bash", "arguments": "ls"}\n</tool_call>', "<tool_call>\n{\"na")
    import openai

    client = openai.OpenAI(base_url=session.openai_base_url, api_key="unused", max_retries=0)
    for _ in range(3):
        answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], tools=[BASH])
        assert answer.choices[0].message.tool_calls is None
        assert "<tool_call>" in answer.choices[0].message.content
    assert client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}]).choices
