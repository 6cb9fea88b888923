"""What a client asks of an engine that enforces constraints, and the checks on what the proxy recorded: shared by
the transformers engine's tests (tests/test_proxy_constraints.py) and vLLM's (tests/test_vllm_engine.py)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import numpy as np

# Bounded schemas: a random model writes any string the grammar allows, and only a bounded one is sure to end
# within the token budget.
BASH_SCHEMA = {"type": "object", "properties": {"command": {"type": "string", "maxLength": 6}}, "required": ["command"]}
READ_SCHEMA = {"type": "object", "properties": {"path": {"type": "string", "enum": ["a.py", "calc.py"]}},
               "required": ["path"]}
BASH = {"type": "function", "function": {"name": "bash", "description": "Run a command", "parameters": BASH_SCHEMA}}
READ = {"type": "function", "function": {"name": "read", "description": "Read a file", "parameters": READ_SCHEMA}}
SCHEMAS = {"bash": BASH_SCHEMA, "read": READ_SCHEMA}
ANSWER = {"type": "object", "properties": {"ok": {"type": "boolean"}, "count": {"type": "integer", "minimum": 0,
                                                                                  "maximum": 9},
                                           "verdict": {"enum": ["pass", "fail"]}},
          "required": ["ok", "count", "verdict"]}
MESSAGES = [{"role": "user", "content": "List the files."}]


def check_recorded(session, engine) -> tuple[list[int], list[int], list[float]]:
    """The session's one call: its segment holds a prompt (mask 0) and exactly the tokens and log-probs the engine
    sampled for it (mask 1). Returns (prompt, tokens, log-probs)."""
    segments, calls = session.trajectory_parts()
    assert len(segments) == 1 and len(calls) == 1 and calls[0].error is None
    segment, n = segments[0], calls[0].prompt_tokens
    prompt, tokens = segment.token_ids[:n].tolist(), segment.token_ids[n:].tolist()
    served = [(list(p), r) for p, r in zip(engine.prompts, engine.results, strict=True)
              if list(p) == prompt and r.token_ids == tokens]
    assert served, "the recorded tokens are not a generation the engine made"
    result = served[0][1]
    assert segment.response_mask.tolist() == [0] * n + [1] * len(tokens)
    np.testing.assert_array_equal(segment.logprobs[n:], np.asarray(result.logprobs, dtype=np.float32))
    assert calls[0].completion_tokens == len(tokens)
    return prompt, tokens, list(result.logprobs)


def valid_calls(calls: list[tuple[str, str]], names: set[str]) -> None:
    assert calls
    for name, arguments in calls:
        assert name in names
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def named_call(session) -> None:
    import openai  # the clients import in seconds: inside the tests, not at every worker's collection

    client = openai.OpenAI(base_url=session.openai_base_url, api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model="m", messages=MESSAGES, tools=[BASH, READ],
                                           tool_choice={"type": "function", "function": {"name": "read"}})
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    valid_calls([(call.function.name, call.function.arguments) for call in choice.message.tool_calls], {"read"})


def required_calls(session, parallel: bool) -> None:
    import openai

    client = openai.OpenAI(base_url=session.openai_base_url, api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model="m", messages=MESSAGES, tools=[BASH, READ], tool_choice="required",
                                           parallel_tool_calls=parallel)
    calls = reply.choices[0].message.tool_calls or []
    assert reply.choices[0].finish_reason == "tool_calls" and (parallel or len(calls) == 1)
    valid_calls([(call.function.name, call.function.arguments) for call in calls], {"bash", "read"})


def any_call_streamed(session) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=session.anthropic_base_url, api_key="unused", max_retries=0)
    tools = [{"name": tool["function"]["name"], "input_schema": tool["function"]["parameters"]} for tool in (BASH, READ)]
    with client.messages.stream(model="m", max_tokens=160, messages=MESSAGES, tool_choice={"type": "any"},
                                tools=tools) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    valid_calls([(block.name, json.dumps(block.input)) for block in final.content if block.type == "tool_use"],
                {"bash", "read"})


def json_answer(session) -> None:
    import openai

    client = openai.OpenAI(base_url=session.openai_base_url, api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model="m", messages=MESSAGES, response_format={
        "type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}})
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), ANSWER)


def json_answer_streamed(session) -> None:
    import openai

    client = openai.OpenAI(base_url=session.openai_base_url, api_key="unused", max_retries=0)
    events = list(client.responses.create(model="m", input="Judge it.", stream=True, text={
        "format": {"type": "json_schema", "name": "answer", "schema": ANSWER}}))
    assert events[-1].type == "response.completed"
    jsonschema.validate(json.loads(events[-1].response.output_text), ANSWER)


def ask_at_once(constrained, asks: list) -> list:
    """Each ask in a session of its own, all at once (the engine samples them as one batch); their sessions."""
    sessions = [constrained.open_session() for _ in asks]
    with ThreadPoolExecutor(len(asks)) as pool:
        for done in [pool.submit(ask, session) for ask, session in zip(asks, sessions, strict=True)]:
            done.result()
    for session in sessions:
        check_recorded(session, constrained.engine)
    return sessions


def masked_logprobs_check(constrained, session, tokenizer, unmasked_score) -> None:
    """A named call's sampled log-probs against the unmasked policy's (`unmasked_score(ids)`: a reference engine's
    scores). Renormalised over the tokens the grammar allows, a sampled token's log-prob is at least its log-prob
    under the unmasked policy: higher where the grammar ruled tokens out, 0 where it allowed one token only."""
    prompt, tokens, logprobs = check_recorded(session, constrained.engine)
    unmasked = np.asarray(unmasked_score(prompt + tokens)[len(prompt):])
    masked = np.asarray(logprobs)
    opening = len(tokenizer.encode('<tool_call>\n{"name": "read", "arguments":', add_special_tokens=False))
    assert (masked[:opening] == 0.0).all()  # the call's opening: the only tokens allowed
    assert (masked >= unmasked - 1e-4).all() and (masked > unmasked + 1e-3).any() and masked.max() <= 0.0


def refused_schema(constrained) -> None:
    """A schema the grammar library cannot compile: the protocol's 400 naming the parameter, nothing sampled, and
    the failed call on the record."""
    session = constrained.open_session()
    served = len(constrained.engine.results)
    response = httpx.post(f"{session.openai_base_url}/chat/completions", timeout=60, json={
        "model": "m", "messages": MESSAGES, "response_format": {"type": "json_schema", "json_schema": {
            "name": "a", "schema": {"type": "string", "pattern": "(?<=a)b"}}}})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "response_format.json_schema.schema" and error["code"] == "unsupported_parameter"
    assert "cannot enforce" in error["message"] and "Lookbehind" in error["message"]
    assert len(constrained.engine.results) == served and session.trajectory_parts()[1][0].error
