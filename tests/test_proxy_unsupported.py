"""Nothing is dropped silently: what the proxy cannot serve is refused in the protocol's error shape (naming what),
what it can serve exactly is honoured (a forced tool call, structured output, strict tools: a constraint the
engine enforces; no parallel tool calls: the generation ends with the first complete call; a refusal in history:
the assistant's text), and every request field is accounted for (lego/proxy/fields.py).

Through the real HTTP proxy with the real Qwen3 tokenizer: a scripted engine for the tool calls a tiny random model
cannot write (it checks each constrained reply against the proxy's grammar), and lego's scripted engine (scored by
the real tiny model, applying stop strings as every engine does) where the generation's end matters. The real tiny
model under constraints: tests/test_proxy_constraints.py.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest
from fixtures_model import tiny_model_path  # noqa: F401  (session fixture)
from proxy_doubles import (
    BackgroundProxy,
    RecordingEngine,
    ScriptedEngine,
    background_proxy,
    check_fidelity,
    follows_constraint,
    tool_call_text,
)

from lego.config import SamplingConfig

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a shell command",
                                         "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                        "required": ["command"]}}}
READ = {"type": "function", "function": {"name": "read", "description": "Read a file",
                                         "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}
BASH_ANTHROPIC = {"name": "Bash", "description": "Run a shell command",
                  "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}
READ_ANTHROPIC = {"name": "Read", "description": "Read a file",
                  "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
BASH_RESPONSES = {"type": "function", "name": "exec_command", "description": "Run a command",
                  "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}
READ_RESPONSES = {"type": "function", "name": "read", "description": "Read a file",
                  "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


@pytest.fixture()
def proxy(tokenizer):
    with background_proxy(ScriptedEngine(tokenizer), tokenizer, 128) as background:
        yield background


def openai_error(response: httpx.Response, param: str) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param
    return error["message"]


def anthropic_error(response: httpx.Response) -> str:
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    return body["error"]["message"]


def test_images_audio_and_files_are_refused(proxy):
    session = proxy.open_session()
    url = session.base_url
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    for content in ([{"type": "text", "text": "What is in it?"}, image],
                    [{"type": "tool_result", "tool_use_id": "t1", "content": [image]}],
                    [{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]):
        message = anthropic_error(httpx.post(f"{url}/v1/messages", json={
            "model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": content}]}))
        assert "not support" in message and "text only" in message
    chat = f"{url}/v1/chat/completions"
    for part, param in (({"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                         "messages[0].content[1]"),
                        ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
                         "messages[0].content[1]")):
        message = openai_error(httpx.post(chat, json={"model": "m", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Describe it."}, part]}]}), param)
        assert part["type"] in message
    message = openai_error(httpx.post(f"{url}/v1/responses", json={"model": "m", "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": f"data:,{PNG}"}]}]}),
        "input[0].content[0]")
    assert "input_image" in message
    openai_error(httpx.post(f"{url}/v1/responses", json={"model": "m", "input": [
        {"type": "function_call", "call_id": "c1", "name": "view_image", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_file", "file_id": "f"}]}]}),
        "input[1].output[0]")
    assert not proxy.engine.prompts and session.num_calls == 0  # nothing was answered as if it were served


def test_previous_response_id_and_conversation_are_refused(proxy):
    session = proxy.open_session()
    client = openai.OpenAI(base_url=session.openai_base_url, api_key="unused", max_retries=0)
    proxy.engine.script("Hello.")
    first = client.responses.create(model="m", input="Say hello.")
    assert first.output[0].content[0].text == "Hello."
    for previous in (first.id, "resp_unknown"):  # neither a response it served nor one it never saw is kept
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(model="m", input="And again.", previous_response_id=previous)
        assert caught.value.body["param"] == "previous_response_id"
        assert "whole conversation" in caught.value.body["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="m", input="Hi.", conversation="conv_123")
    assert caught.value.body["param"] == "conversation"
    assert len(proxy.engine.prompts) == 1


def opening_ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def reply_ids(tokenizer, text: str) -> list[int]:
    return opening_ids(tokenizer, text) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]


def test_openai_chat_forced_calls_required_and_named(proxy, tokenizer):
    session, engine = proxy.open_session(), proxy.engine
    client = openai.OpenAI(base_url=session.openai_base_url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "List the files."}]
    # `required`: nothing is written into the prompt; the engine is asked for calls of the request's tools
    engine.script(tool_call_text("bash", {"command": "ls"}))
    first = client.chat.completions.create(model="m", messages=messages, tools=[BASH, READ], tool_choice="required")
    generation_prompt = opening_ids(tokenizer, "<|im_start|>assistant\n")
    assert engine.prompts[0][-len(generation_prompt):] == generation_prompt
    required = engine.samplings[0].constraint
    assert (required.param, required.what) == ("tool_choice", "a tool call")
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls"
    assert (call.function.name, json.loads(call.function.arguments)) == ("bash", {"command": "ls"})
    assert first.usage.completion_tokens == len(engine.results[0].token_ids)  # the whole call is sampled
    # what the grammar allows: calls of the request's tools, arguments following their schemas, nothing else
    assert follows_constraint(tokenizer, required, reply_ids(tokenizer, tool_call_text("read", {})))
    for refused in ("Sure, here you go.", tool_call_text("write", {"path": "x"}), tool_call_text("bash", {"cmd": "ls"}),
                    "Sure.\n" + tool_call_text("bash", {"command": "ls"})):
        assert not follows_constraint(tokenizer, required, reply_ids(tokenizer, refused)), refused
    # a named function, streamed: a call of that function only
    messages += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": "calc.py"}]
    engine.script(tool_call_text("read", {"path": "calc.py"}))
    chunks = list(client.chat.completions.create(model="m", messages=messages, tools=[BASH, READ], stream=True,
                                                 tool_choice={"type": "function", "function": {"name": "read"}}))
    named = engine.samplings[1].constraint
    assert named.what == "a call of read"
    assert not follows_constraint(tokenizer, named, reply_ids(tokenizer, tool_call_text("bash", {"command": "ls"})))
    assert not follows_constraint(tokenizer, named, reply_ids(tokenizer, "\n".join(
        [tool_call_text("read", {"path": "a"}), tool_call_text("read", {"path": "b"})])))  # one call
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert deltas[0].function.name == "read"
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == {"path": "calc.py"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # the harness replays the forced call: the branch is extended, every token of the call sampled (mask 1)
    messages += [{"role": "assistant", "content": None, "tool_calls": [
        {"id": deltas[0].id, "type": "function",
         "function": {"name": "read", "arguments": '{"path": "calc.py"}'}}]},
        {"role": "tool", "tool_call_id": deltas[0].id, "content": "def add(a, b): ..."}]
    engine.script("Done.")
    client.chat.completions.create(model="m", messages=messages, tools=[BASH, READ])
    segments, calls = check_fidelity(session, engine)
    assert [c.kind for c in calls] == ["start", "extend", "extend"]
    assert engine.samplings[2].constraint is None


def test_anthropic_forced_calls_any_and_tool_streamed(proxy, tokenizer):
    session, engine = proxy.open_session(), proxy.engine
    client = anthropic.Anthropic(base_url=session.anthropic_base_url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "Explain `ls`."}]
    engine.script(tool_call_text("Bash", {"command": "ls"}))
    with client.messages.stream(model="m", max_tokens=512, messages=messages, tools=[BASH_ANTHROPIC],
                                tool_choice={"type": "tool", "name": "Bash"}) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    use = final.content[-1]
    assert (use.type, use.name, use.input) == ("tool_use", "Bash", {"command": "ls"})
    assert engine.samplings[0].constraint.what == "a call of Bash"
    engine.script(tool_call_text("Bash", {"command": "pwd"}))
    forced = client.messages.create(model="m", max_tokens=512, messages=messages, tools=[BASH_ANTHROPIC],
                                    tool_choice={"type": "any"})
    assert forced.content[-1].input == {"command": "pwd"} and forced.stop_reason == "tool_use"
    assert engine.samplings[1].constraint.what == "a tool call"
    check_fidelity(session, engine)


def test_responses_forced_call_streamed(proxy, tokenizer):
    session, engine = proxy.open_session(), proxy.engine
    client = openai.OpenAI(base_url=session.openai_base_url, api_key="unused", max_retries=0)
    engine.script(tool_call_text("exec_command", {"cmd": "ls"}))
    events = list(client.responses.create(model="m", input="List the files.", tools=[BASH_RESPONSES],
                                          tool_choice="required", stream=True))
    done = events[-1]
    assert done.type == "response.completed"
    call = done.response.output[-1]
    assert (call.type, call.name, json.loads(call.arguments)) == ("function_call", "exec_command", {"cmd": "ls"})
    check_fidelity(session, engine)


def test_tool_choices_that_cannot_be_honoured_are_refused(proxy):
    url = proxy.open_session().base_url
    chat, messages = f"{url}/v1/chat/completions", [{"role": "user", "content": "x"}]
    openai_error(httpx.post(chat, json={"messages": messages, "tools": [BASH],
                                        "tool_choice": {"type": "function", "function": {"name": "write"}}}),
                 "tool_choice")
    openai_error(httpx.post(chat, json={"messages": messages, "tool_choice": "required"}), "tool_choice")
    openai_error(httpx.post(chat, json={"messages": messages, "tools": [BASH], "tool_choice": {
        "type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": []}}}), "tool_choice")
    openai_error(httpx.post(f"{url}/v1/responses", json={"input": "x", "tools": [BASH_RESPONSES],
                                                         "tool_choice": {"type": "web_search_preview"}}), "tool_choice")
    for choice in ({"type": "tool", "name": "Write"}, {"type": "tool"}, {"type": "sometimes"}):
        anthropic_error(httpx.post(f"{url}/v1/messages", json={
            "model": "m", "max_tokens": 64, "messages": messages, "tools": [BASH_ANTHROPIC], "tool_choice": choice}))
    anthropic_error(httpx.post(f"{url}/v1/messages", json={"model": "m", "max_tokens": 64, "messages": messages,
                                                           "tool_choice": {"type": "any"}}))
    assert not proxy.engine.prompts


@pytest.fixture(scope="module")
def inner(tiny_model_path):  # noqa: F811
    from lego.engine.transformers_engine import TransformersEngine

    engine = TransformersEngine(tiny_model_path, dtype="float32", max_batch_size=4, batch_wait_ms=2.0)
    yield engine
    engine.close()


def test_responses_namespaced_tool_calls_name_their_namespace(proxy):
    """Codex's sub-agent tools come in a `namespace` tool: a call to one names the namespace, or Codex answers
    "unsupported call" (the captured Codex run in tests/fixtures/threads/ spawned its sub-agents this way)."""
    session = proxy.open_session()
    spawn = {"type": "function", "name": "spawn_agent", "description": "Spawn a sub-agent",
             "parameters": {"type": "object", "properties": {"message": {"type": "string"}}}}
    tools = [BASH_RESPONSES, {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents",
                              "tools": [spawn]}]
    call = '<tool_call>\n{"name": "spawn_agent", "arguments": {"message": "Run the tests."}}\n</tool_call>'
    command = '<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "ls"}}\n</tool_call>'
    for stream in (False, True):
        proxy.engine.script(call + "\n" + command)
        response = httpx.post(f"{session.openai_base_url}/responses", timeout=60, json={
            "model": "m", "input": "Test it.", "tools": tools, "stream": stream})
        if stream:
            events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
            output = events[-1]["response"]["output"]
        else:
            output = response.json()["output"]
        calls = [item for item in output if item["type"] == "function_call"]
        assert [(item["name"], item.get("namespace")) for item in calls] == [
            ("spawn_agent", "multi_agent_v1"), ("exec_command", None)]


def test_namespace_is_part_of_its_tools_definition(proxy, tokenizer):
    """A namespace's name and description reach the model: each of its tools names them in its definition."""
    session = proxy.open_session()
    spawn = {"type": "function", "name": "spawn_agent", "description": "Spawn a sub-agent",
             "parameters": {"type": "object", "properties": {}}}
    httpx.post(f"{session.openai_base_url}/responses", timeout=60, json={
        "model": "m", "input": "Test it.", "tools": [BASH_RESPONSES, {
            "type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents", "tools": [spawn]}]})
    prompt = tokenizer.decode(proxy.engine.prompts[-1])
    assert '"name": "spawn_agent", "description": "Spawn a sub-agent", "parameters": {"type": "object", ' \
           '"properties": {}}, "namespace": {"name": "multi_agent_v1", "description": "Sub-agents"}' in prompt


# ---------------------------------------------------------------------------------------------- one tool call


@pytest.fixture()
def stopping(inner, tokenizer):
    """lego's scripted engine: each scripted text cut where the stop strings the proxy asks for end it (as every
    engine cuts them), scored by the real tiny model, and recorded for check_fidelity."""
    from lego.engine.scripted import ScriptedEngine as StoppingEngine

    scripted = StoppingEngine(inner, tokenizer, [])
    engine = RecordingEngine(scripted)
    background = BackgroundProxy(engine, tokenizer, SamplingConfig(max_tokens=128))
    background.engine, background.script = engine, scripted.script
    yield background
    background.close()


def two_calls(first: tuple[str, dict], second: tuple[str, dict], text: str = "Looking.") -> str:
    return f"{text}\n{tool_call_text(*first)}\n{tool_call_text(*second)}"


def test_openai_chat_parallel_tool_calls_false_ends_with_the_first_call(stopping, tokenizer):
    reply = two_calls(("bash", {"command": "ls"}), ("read", {"path": "calc.py"}))
    stopping.script.extend([reply, "Done.", reply])
    engine, messages = stopping.engine, [{"role": "user", "content": "Look around."}]
    session = stopping.open_session()
    client = openai.OpenAI(base_url=session.openai_base_url, api_key="unused", max_retries=0)
    one = client.chat.completions.create(model="m", messages=messages, tools=[BASH, READ], parallel_tool_calls=False)
    message = one.choices[0].message
    assert message.content == "Looking." and one.choices[0].finish_reason == "tool_calls"
    assert [(call.function.name, json.loads(call.function.arguments)) for call in message.tool_calls] == [
        ("bash", {"command": "ls"})]
    assert engine.samplings[0].stop == ("</tool_call>",)
    sampled = tokenizer.decode(engine.results[0].token_ids)
    assert sampled.endswith("</tool_call>") and "read" not in sampled  # the generation ended there
    # the harness replays the call: the branch is extended; the end of turn the model did not write is context
    messages += [{"role": "assistant", "content": message.content, "tool_calls": [message.tool_calls[0].model_dump()]},
                 {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "calc.py"}]
    last = client.chat.completions.create(model="m", messages=messages, tools=[BASH, READ], parallel_tool_calls=False)
    assert last.choices[0].message.content == "Done."
    _, calls = check_fidelity(session, engine)
    assert [call.kind for call in calls] == ["start", "extend"]
    end = len(engine.prompts[0]) + len(engine.results[0].token_ids)
    bridge = tokenizer.encode("<|im_end|>\n", add_special_tokens=False)
    assert engine.prompts[1][end:end + len(bridge)] == bridge
    # as a control, the same reply with parallel calls allowed: both calls, no stop string
    client = openai.OpenAI(base_url=stopping.open_session().openai_base_url, api_key="unused", max_retries=0)
    both = client.chat.completions.create(model="m", messages=messages[:1], tools=[BASH, READ])
    assert [call.function.name for call in both.choices[0].message.tool_calls] == ["bash", "read"]
    assert engine.samplings[2].stop == ()


def test_anthropic_disable_parallel_tool_use_streamed_and_forced(stopping, tokenizer):
    engine = stopping.engine
    session = stopping.open_session()
    client = anthropic.Anthropic(base_url=session.anthropic_base_url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "Look around."}]
    stopping.script.append(two_calls(("Bash", {"command": "ls"}), ("Read", {"path": "calc.py"})))
    with client.messages.stream(model="m", max_tokens=128, messages=messages, tools=[BASH_ANTHROPIC, READ_ANTHROPIC],
                                tool_choice={"type": "auto", "disable_parallel_tool_use": True}) as stream:
        final = stream.get_final_message()
    assert [block.type for block in final.content] == ["text", "tool_use"]
    assert (final.content[1].name, final.content[1].input) == ("Bash", {"command": "ls"})
    assert final.stop_reason == "tool_use" and final.stop_sequence is None  # not a stop sequence of the request
    # forced (`any`): lego's scripted engine writes fixed texts, so it cannot enforce the call: refused, not served
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="m", max_tokens=128, messages=messages, tools=[BASH_ANTHROPIC, READ_ANTHROPIC],
                               tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert "constrained decoding" in refused.value.body["error"]["message"]
    check_fidelity(session, engine)


def test_responses_parallel_tool_calls_false(stopping):
    session = stopping.open_session()
    stopping.script.append(two_calls(("exec_command", {"cmd": "ls"}), ("read", {"path": "calc.py"})))
    body = httpx.post(f"{session.openai_base_url}/responses", timeout=60, json={
        "model": "m", "input": "Look around.", "tools": [BASH_RESPONSES, READ_RESPONSES],
        "parallel_tool_calls": False}).json()
    calls = [item for item in body["output"] if item["type"] == "function_call"]
    assert [(item["name"], json.loads(item["arguments"])) for item in calls] == [("exec_command", {"cmd": "ls"})]
    assert body["parallel_tool_calls"] is False
    check_fidelity(session, stopping.engine)


# ---------------------------------------------------------------------------------------------- refused or served


def test_structured_output_and_strict_tools_are_constraints(proxy, tokenizer):
    """JSON schemas, JSON mode and strict tools are served as constraints the engine enforces, in every protocol."""
    session, engine = proxy.open_session(), proxy.engine
    url = session.base_url
    chat, responses = f"{url}/v1/chat/completions", f"{url}/v1/responses"
    messages = [{"role": "user", "content": "Answer in JSON."}]
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    anthropic_url, base = f"{url}/v1/messages", {"model": "m", "max_tokens": 64, "messages": messages}
    requests = [
        (chat, {"messages": messages, "response_format": {"type": "json_schema", "json_schema": {
            "name": "answer", "schema": schema}}}, "response_format.json_schema.schema"),
        (responses, {"input": "x", "text": {"format": {"type": "json_schema", "name": "answer", "schema": schema}}},
         "text.format.schema"),
        (anthropic_url, {**base, "output_config": {"effort": "high", "format": {"type": "json_schema",
                                                                                 "schema": schema}}},
         "output_config.format.schema"),
        (anthropic_url, {**base, "output_format": {"type": "json_schema", "schema": schema}}, "output_format.schema"),
    ]
    for where, body, param in requests:
        engine.script('{"a": "yes"}')
        response = httpx.post(where, json=body, timeout=60)
        assert response.status_code == 200, response.text
        constraint = engine.samplings[-1].constraint
        assert (constraint.param, constraint.what) == (param, "JSON following the schema")
        assert not follows_constraint(tokenizer, constraint, reply_ids(tokenizer, '{"b": "yes"}'))
        assert not follows_constraint(tokenizer, constraint, reply_ids(tokenizer, 'Sure: {"a": "yes"}'))
    for where, body in ((chat, {"messages": messages, "response_format": {"type": "json_object"}}),
                        (responses, {"input": "x", "text": {"format": {"type": "json_object"}}})):
        engine.script('{"anything": [1, 2]}')
        assert httpx.post(where, json=body, timeout=60).status_code == 200
        assert engine.samplings[-1].constraint.what == "a JSON object"
        assert not follows_constraint(tokenizer, engine.samplings[-1].constraint, reply_ids(tokenizer, "[1, 2]"))
    # strict tools: free text, and every call follows its tool's schema (a tool that is not strict: any object)
    strict_bash = {**BASH, "function": {**BASH["function"], "strict": True}}
    for where, body, (name, key, other) in (
            (chat, {"messages": messages, "tools": [strict_bash, READ]}, ("bash", "command", "read")),
            (responses, {"input": "x", "tools": [{**BASH_RESPONSES, "strict": True}, READ_RESPONSES]},
             ("exec_command", "cmd", "read")),
            (anthropic_url, {**base, "tools": [{**BASH_ANTHROPIC, "strict": True}, READ_ANTHROPIC]},
             ("Bash", "command", "Read"))):
        engine.script("Looking.")
        assert httpx.post(where, json=body, timeout=60).status_code == 200
        constraint = engine.samplings[-1].constraint
        assert (constraint.param, constraint.what) == ("tools", "tool calls following their schemas")
        allowed = "Sure.\n" + tool_call_text(name, {key: "ls"})
        assert follows_constraint(tokenizer, constraint, reply_ids(tokenizer, allowed))
        assert not follows_constraint(tokenizer, constraint, reply_ids(tokenizer, tool_call_text(name, {"x": "ls"})))
        assert follows_constraint(tokenizer, constraint, reply_ids(tokenizer, tool_call_text(other, {"x": 1})))
    served = len(engine.prompts)
    # a schema that is not one, and a format that is not JSON: the protocol's 400
    openai_error(httpx.post(chat, json={"messages": messages, "response_format": {"type": "json_schema", "json_schema": {
        "name": "a", "schema": "object"}}}), "response_format.json_schema.schema")
    openai_error(httpx.post(chat, json={"messages": messages, "response_format": {"type": "grammar"}}),
                 "response_format.type")
    openai_error(httpx.post(responses, json={"input": "x", "text": {"format": {"type": "yaml"}}}), "text.format.type")
    assert "output_format.type" in anthropic_error(httpx.post(anthropic_url, json={
        **base, "output_format": {"type": "regex", "pattern": "a+"}}))
    assert len(engine.prompts) == served
    engine.script("Plain.", "Plain.", "Plain.")
    assert httpx.post(chat, json={"messages": messages, "response_format": {"type": "text"}}).status_code == 200
    assert httpx.post(responses, json={"input": "x", "text": {"format": {"type": "text"},
                                                               "verbosity": "low"}}).status_code == 200
    assert httpx.post(anthropic_url, json={**base, "output_config": {"effort": "low"}}).status_code == 200
    assert len(engine.prompts) == served + 3
    assert all(sampling.constraint is None for sampling in engine.samplings[served:])


def test_refusals_in_history_are_the_assistants_text(proxy, tokenizer):
    """The model's refusal, replayed as a refusal part or field, is what it said: the prompt shows it as its turn."""
    session, said = proxy.open_session(), "I can't help with that."
    shown = f"<|im_start|>assistant\n{said}<|im_end|>"
    before, after = {"role": "user", "content": "Delete everything."}, {"role": "user", "content": "List files."}
    for assistant in ({"role": "assistant", "content": [{"type": "refusal", "refusal": said}]},
                      {"role": "assistant", "content": None, "refusal": said}):
        proxy.engine.script("Listing.")
        response = httpx.post(f"{session.openai_base_url}/chat/completions", timeout=60,
                              json={"model": "m", "messages": [before, assistant, after]})
        assert response.status_code == 200, response.text
        assert shown in tokenizer.decode(proxy.engine.prompts[-1])
    proxy.engine.script("Listing.")
    response = httpx.post(f"{session.openai_base_url}/responses", timeout=60, json={"model": "m", "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": before["content"]}]},
        {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": said}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": after["content"]}]}]})
    assert response.status_code == 200, response.text
    assert shown in tokenizer.decode(proxy.engine.prompts[-1])


def test_hosted_and_server_tools_are_refused(proxy):
    url = proxy.open_session().base_url
    base = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "Search the web."}]}
    for tool in ({"type": "web_search_20250305", "name": "web_search", "max_uses": 8},
                 {"type": "web_fetch_20250910", "name": "web_fetch"},
                 {"type": "code_execution_20250825", "name": "code_execution"},
                 {"type": "computer_20250124", "name": "computer", "display_width_px": 1024,
                  "display_height_px": 768},
                 {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
                 {"type": "bash_20250124", "name": "bash"}):
        message = anthropic_error(httpx.post(f"{url}/v1/messages", json={**base, "tools": [BASH_ANTHROPIC, tool]}))
        assert "tools[1].type" in message and tool["type"] in message
    chat, messages = f"{url}/v1/chat/completions", [{"role": "user", "content": "Patch it."}]
    custom = {"type": "custom", "custom": {"name": "apply_patch", "format": {"type": "text"}}}
    assert "custom" in openai_error(httpx.post(chat, json={"messages": messages, "tools": [BASH, custom]}),
                                    "tools[1].type")
    openai_error(httpx.post(chat, json={"messages": messages, "web_search_options": {}}), "web_search_options")
    for tool in ({"type": "file_search", "vector_store_ids": ["vs_1"]}, {"type": "computer_use_preview"},
                 {"type": "code_interpreter", "container": {"type": "auto"}}, {"type": "image_generation"},
                 {"type": "mcp", "server_label": "docs", "server_url": "https://example.com/mcp"},
                 {"type": "local_shell"}, {"type": "custom", "name": "apply_patch"}):
        message = openai_error(httpx.post(f"{url}/v1/responses", json={"input": "x", "tools": [BASH_RESPONSES, tool]}),
                               "tools[1].type")
        assert tool["type"] in message
    assert not proxy.engine.prompts


def test_codex_web_search_is_not_offered(proxy, tokenizer):
    """Codex sends a hosted `web_search` on every call: served as a server without web search serves it (the model
    is not told of it), never refused, which would stop Codex."""
    session = proxy.open_session()
    proxy.engine.script("Found nothing to search.")
    response = httpx.post(f"{session.openai_base_url}/responses", timeout=60, json={
        "model": "m", "input": "Look it up.", "tools": [BASH_RESPONSES, {"type": "web_search",
                                                                         "external_web_access": True}]})
    assert response.status_code == 200 and response.json()["tools"] == []
    prompt = tokenizer.decode(proxy.engine.prompts[0])
    assert '"name": "exec_command"' in prompt and "web_search" not in prompt


def test_history_the_server_never_wrote_is_refused(proxy):
    url = proxy.open_session().base_url
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Search."}]}
    for item, param in (({"type": "web_search_call", "id": "ws_1", "status": "completed",
                          "action": {"type": "search", "query": "calc"}}, "input[1]"),
                        ({"type": "item_reference", "id": "msg_1"}, "input[1]"),
                        ({"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA"},
                         "input[1].encrypted_content"),
                        ({"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "x"},
                         "input[1]")):
        openai_error(httpx.post(f"{url}/v1/responses", json={"input": [user, item]}), param)
    for block in ({"type": "redacted_thinking", "data": "EmwKAhgB"},
                  {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "calc"}}):
        message = anthropic_error(httpx.post(f"{url}/v1/messages", json={"model": "m", "max_tokens": 64, "messages": [
            {"role": "user", "content": "Search."}, {"role": "assistant", "content": [block]},
            {"role": "user", "content": "Go on."}]}))
        assert "messages[1].content[0]" in message and block["type"] in message
    search = {"type": "search_result", "source": "https://example.com", "title": "Calc",
              "content": [{"type": "text", "text": "add"}]}
    assert "search_result" in anthropic_error(httpx.post(f"{url}/v1/messages", json={
        "model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": [search]}]}))
    openai_error(httpx.post(f"{url}/v1/chat/completions", json={"messages": [
        {"role": "user", "content": "Add."}, {"role": "assistant", "content": None,
                                             "function_call": {"name": "add", "arguments": "{}"}},
        {"role": "user", "content": "Go on."}]}), "messages[1].function_call")
    assert not proxy.engine.prompts


def test_unknown_fields_and_unsupported_options_are_refused(proxy):
    url = proxy.open_session().base_url
    chat, messages = f"{url}/v1/chat/completions", [{"role": "user", "content": "x"}]
    for extra, param in (({"frobnicate": True}, "frobnicate"),
                         ({"stream": True, "stream_options": {"include_usage": True, "extra": 1}},
                          "stream_options.extra"),
                         ({"n": 2}, "n"), ({"logprobs": True}, "logprobs"), ({"top_logprobs": 3}, "top_logprobs"),
                         ({"modalities": ["text", "audio"]}, "modalities"),
                         ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
                         ({"functions": [BASH["function"]]}, "functions"),
                         ({"function_call": "auto"}, "function_call")):
        message = openai_error(httpx.post(chat, json={"messages": messages, **extra}), param)
        assert f"'{param}'" in message
    unknown = httpx.post(chat, json={"messages": messages, "frobnicate": True}).json()["error"]
    assert unknown["code"] == "unknown_parameter" and "lego/proxy/openai_chat.py" in unknown["message"]
    responses = f"{url}/v1/responses"
    for extra, param in (({"frobnicate": 1}, "frobnicate"), ({"background": True}, "background"),
                         ({"prompt": {"id": "pmpt_1"}}, "prompt"),
                         ({"include": ["message.output_text.logprobs"]}, "include"),
                         ({"top_logprobs": 2}, "top_logprobs"),
                         ({"reasoning": {"effort": "high", "frobnicate": 1}}, "reasoning.frobnicate")):
        openai_error(httpx.post(responses, json={"input": "x", **extra}), param)
    base = {"model": "m", "max_tokens": 64, "messages": messages}
    for extra, named in (({"frobnicate": True}, "frobnicate"),
                         ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
                          "context_management.edits[0]"),
                         ({"context_management": {"edits": [{"type": "clear_thinking_20251015",
                                                             "keep": {"type": "thinking_turns", "value": 1}}]}},
                          "context_management.edits[0]"),
                         ({"container": "container_1"}, "container"),
                         ({"mcp_servers": [{"type": "url", "url": "https://example.com/mcp", "name": "docs"}]},
                          "mcp_servers"),
                         ({"thinking": {"type": "sometimes"}}, "thinking.type"),
                         ({"output_config": {"effort": "high", "frobnicate": 1}}, "output_config.frobnicate")):
        assert f"'{named}'" in anthropic_error(httpx.post(f"{url}/v1/messages", json={**base, **extra}))
    assert not proxy.engine.prompts


def test_every_listed_field_is_accepted_and_sampling_stays_the_policys(proxy):
    """The fields each table lists as the policy's or harmless are served (with values real clients send), and the
    engine samples with the policy's configuration whatever the request asks."""
    session = proxy.open_session()
    url, messages = session.base_url, [{"role": "user", "content": "Hi."}]
    chat = {"model": "m", "messages": messages, "temperature": 0.1, "top_p": 0.5, "frequency_penalty": 0.5,
            "presence_penalty": 0.5, "logit_bias": {"100": -100}, "seed": 7, "reasoning_effort": "high",
            "verbosity": "low", "prediction": {"type": "content", "content": "Hello"}, "user": "u",
            "safety_identifier": "s", "metadata": {"run": "1"}, "store": False, "service_tier": "auto",
            "prompt_cache_key": "k", "prompt_cache_retention": "24h", "n": 1, "logprobs": False, "top_logprobs": 0,
            "modalities": ["text"], "response_format": {"type": "text"}, "parallel_tool_calls": True,
            "max_completion_tokens": 32, "stop": ["\n\n"], "stream": False, "tools": [BASH], "tool_choice": "auto"}
    responses = {"model": "m", "input": "Hi.", "instructions": "Be brief.", "temperature": 0.1, "top_p": 0.5,
                 "reasoning": {"effort": "high", "summary": "auto"}, "text": {"format": {"type": "text"},
                                                                            "verbosity": "low"},
                 "include": ["reasoning.encrypted_content"], "truncation": "auto", "max_tool_calls": 3,
                 "store": False, "metadata": {}, "user": "u", "safety_identifier": "s", "client_metadata": {"a": "b"},
                 "service_tier": "auto", "prompt_cache_key": "k", "prompt_cache_retention": "24h",
                 "background": False, "top_logprobs": 0, "max_output_tokens": 32, "parallel_tool_calls": True,
                 "tools": [BASH_RESPONSES], "tool_choice": "auto"}
    messages_api = {"model": "m", "max_tokens": 32, "messages": messages, "system": "Be brief.", "temperature": 0.1,
                    "top_p": 0.5, "top_k": 5, "thinking": {"type": "enabled", "budget_tokens": 1024},
                    "output_config": {"effort": "high"}, "metadata": {"user_id": "u"}, "service_tier": "auto",
                    "cache_control": {"type": "ephemeral"}, "mcp_servers": [], "stop_sequences": ["END"],
                    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
                    "tools": [BASH_ANTHROPIC], "tool_choice": {"type": "auto"}}
    from lego.proxy import anthropic as anthropic_parser
    from lego.proxy import openai_chat
    from lego.proxy import responses as responses_parser
    from lego.proxy.fields import Treatment

    for parser, body in ((openai_chat, chat), (responses_parser, responses), (anthropic_parser, messages_api)):
        # every field its table says is the policy's or harmless is in the body sent here
        listed = {name for name, field in parser.FIELDS.items() if field.treatment in (Treatment.policy,
                                                                                          Treatment.harmless)}
        assert listed - {"stream_options"} <= set(body), listed - set(body)
    for path, body in (("/v1/chat/completions", chat), ("/v1/responses", responses), ("/v1/messages", messages_api)):
        proxy.engine.script("Hello.")
        response = httpx.post(f"{url}{path}", json=body, timeout=60)
        assert response.status_code == 200, f"{path}: {response.text}"
    configured = SamplingConfig(max_tokens=128)
    for sampling in proxy.engine.samplings:
        assert (sampling.temperature, sampling.top_p, sampling.seed) == (configured.temperature, configured.top_p, None)
        assert sampling.max_tokens == 32
