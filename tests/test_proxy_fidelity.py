"""Token fidelity: multi-turn sessions that replay what real harnesses send (from harness-captures/ bodies).

Each test plays a harness against the proxy over HTTP, with the harness's own request shapes and history quirks,
and checks the proxy's record against what the engine actually did: every call's prompt is the prefix of one
segment, followed by exactly the sampled tokens with mask 1 and the engine's log-probs and routing; mask 1 is on
nothing else; the main thread's last segment is the last main prompt plus its reply.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import httpx
import pytest
from proxy_doubles import BackgroundProxy, ScriptedEngine, assistant_text, check_fidelity

CAPTURES = Path("/work/shared/notes/harness-captures")


def capture(name: str) -> dict:
    body = json.loads((CAPTURES / f"body_{name}.json").read_text())["body"]
    body["tools"] = [tool for tool in body.get("tools", []) if isinstance(tool, dict)]
    return body


@pytest.fixture()
def proxy(tokenizer):
    engine = ScriptedEngine(tokenizer)
    background = BackgroundProxy(engine, tokenizer)
    background.engine = engine
    yield background
    background.close()


def post(session, path: str, body: dict) -> httpx.Response:
    response = httpx.post(f"{session.base_url}{path}", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response


def sse_events(response: httpx.Response) -> list[dict]:
    return [json.loads(line[6:]) for line in response.text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def kinds(calls) -> list[str]:
    return [call.kind for call in calls]


def test_mini_swe_agent_drops_a_bad_reply(proxy):
    """mini replays arguments byte-identically and drops a malformed reply, appending a format-error message."""
    body = capture("mini_toolcall")
    session, engine = proxy.open_session(), proxy.engine
    messages = body["messages"][:2]
    engine.script(assistant_text("I'll look.", [("bash", {"command": "ls"})]),
                  "I am not sure what to do.",  # no tool call: mini's FormatError
                  assistant_text("", [("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})]))
    request = {"model": "stub-model", "messages": messages, "tools": body["tools"]}
    answer = post(session, "/v1/chat/completions", request).json()["choices"][0]["message"]
    call = answer["tool_calls"][0]
    messages += [{"content": answer["content"], "role": "assistant", "tool_calls": [
        {"function": {"arguments": call["function"]["arguments"], "name": "bash"}, "id": call["id"], "type": "function"}]},
        {"content": '{\n  "returncode": 0,\n  "output": "calc.py\\n"\n}', "tool_call_id": call["id"], "role": "tool"}]
    bad = post(session, "/v1/chat/completions", {**request, "messages": messages}).json()["choices"][0]
    assert bad["finish_reason"] == "stop" and "tool_calls" not in bad["message"]
    messages.append({"role": "user", "content": "Format error: please always call the bash tool."})
    final = post(session, "/v1/chat/completions", {**request, "messages": messages}).json()
    assert final["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "bash"
    segments, calls = check_fidelity(session, engine)
    assert kinds(calls) == ["start", "extend", "rewrite"]
    # the bad reply stays, sampled, in the closed segment; the continuing segment never contains it
    bad_tokens = engine.results[1].token_ids
    closed, continuing = segments[calls[1].segment_index], segments[calls[2].segment_index]
    assert closed.token_ids[-len(bad_tokens):].tolist() == bad_tokens
    assert continuing.reason == "rewrite" and continuing.thread == "main"
    text = proxy.server.renderer.decode(continuing.token_ids.tolist())
    assert "I am not sure" not in text and "Format error" in text


def test_opencode_reserializes_arguments_and_runs_a_title_subagent(proxy):
    """OpenCode: a title request first (no tools), then main calls whose tool JSON comes back compact."""
    body = capture("opencode")
    session, engine = proxy.open_session(), proxy.engine
    engine.script("Fix calc bug",  # title
                  assistant_text("I'll fix the bug.", [("bash", {"command": "sed -i 's/-/+/' calc.py"})]),
                  "Fixed the bug.")
    title = {"model": "stub-model", "max_tokens": 32000, "stream": True, "stream_options": {"include_usage": True},
             "messages": [{"role": "system", "content": "You are a title generator. You output ONLY a thread title."},
                          {"role": "user", "content": "Generate a title for this conversation:\n"},
                          body["messages"][1]]}
    events = sse_events(post(session, "/v1/chat/completions", title))
    assert events[-1]["usage"]["completion_tokens"] == len(engine.results[0].token_ids)
    messages = body["messages"][:2]
    request = {**{k: v for k, v in body.items() if k != "messages"}, "messages": messages}
    events = sse_events(post(session, "/v1/chat/completions", request))
    call = next(e["choices"][0]["delta"]["tool_calls"][0] for e in events
                if e["choices"] and "tool_calls" in e["choices"][0]["delta"])
    arguments = "".join(e["choices"][0]["delta"]["tool_calls"][0]["function"].get("arguments", "")
                        for e in events if e["choices"] and "tool_calls" in e["choices"][0]["delta"])
    assert arguments == '{"command": "sed -i \'s/-/+/\' calc.py"}'
    compact = json.dumps(json.loads(arguments), separators=(",", ":"))
    messages += [{"role": "assistant", "content": "I'll fix the bug.", "tool_calls": [
        {"id": call["id"], "type": "function", "function": {"name": "bash", "arguments": compact}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": "all tests passed\n"}]
    post(session, "/v1/chat/completions", {**request, "messages": messages})
    segments, calls = check_fidelity(session, engine)
    assert kinds(calls) == ["subagent", "start", "extend"]
    assert [s.thread for s in segments] == ["subagent:0", "main"]
    assert segments[0].reason == "subagent"
    # the stream holds the model's spaced JSON, not the harness's compact re-serialization
    text = proxy.server.renderer.decode(segments[1].token_ids.tolist())
    assert '{"command": "sed' in text and compact not in text


def test_openhands_list_content_and_ignored_temperature(proxy):
    body = capture("openhands062")
    session, engine = proxy.open_session(), proxy.engine
    engine.script(assistant_text("I'll fix the bug.", [("execute_bash", {"command": "ls", "security_risk": "LOW"})]),
                  assistant_text("", [("finish", {"message": "done"})]))
    messages = body["messages"][:3]
    request = {"messages": messages, "model": "stub-model", "temperature": 0.0, "top_p": 1.0, "tools": body["tools"]}
    answer = post(session, "/v1/chat/completions", request).json()["choices"][0]["message"]
    call = answer["tool_calls"][0]
    messages += [{"content": [{"type": "text", "text": answer["content"]}], "role": "assistant", "tool_calls": [call]},
                 {"content": [{"type": "text", "text": "calc.py\n[The command completed with exit code 0.]"}],
                  "role": "tool", "tool_call_id": call["id"], "name": "execute_bash"}]
    post(session, "/v1/chat/completions", {**request, "messages": messages})
    _, calls = check_fidelity(session, engine)
    assert kinds(calls) == ["start", "extend"]
    assert all(s.temperature == proxy.server.sampling.temperature for s in engine.samplings)


def claude_request(body: dict, messages: list) -> dict:
    request = {k: v for k, v in body.items() if k != "messages"}
    return {**request, "messages": messages}


def move_cache_marker(messages: list) -> None:
    """Claude Code moves the cache_control marker to the newest message between calls."""
    for message in messages:
        if isinstance(message["content"], list):
            for block in message["content"]:
                block.pop("cache_control", None)
    last = messages[-1]["content"]
    if isinstance(last, list):
        last[-1]["cache_control"] = {"type": "ephemeral"}


def test_claude_code_cache_markers_subagents_and_compaction(proxy):
    body = capture("claude_code")
    session, engine = proxy.open_session(), proxy.engine
    engine.script(
        assistant_text("I'll fix the bug.", [("Bash", {"command": "sed -i 's/-/+/' calc.py"})]),
        "Summarise: fix calc",  # a sub-agent with its own system prompt, interleaved
        assistant_text("Now the tests.", [("Bash", {"command": "python3 test_calc.py"})]),
        "Fixed.",
        "Continuing after compaction.",
    )
    messages = copy.deepcopy(body["messages"][:2])  # the user turn and the mid-conversation system entry
    response = post(session, "/v1/messages?beta=true", claude_request(body, messages))
    events = sse_events(response)
    assert [e["type"] for e in events][:2] == ["message_start", "ping"] and events[-1]["type"] == "message_stop"
    tool = next(e["content_block"] for e in events if e["type"] == "content_block_start"
                and e["content_block"]["type"] == "tool_use")
    partial = "".join(e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta"
                      and e["delta"]["type"] == "input_json_delta")
    messages += [{"role": "assistant", "content": [{"type": "text", "text": "I'll fix the bug."},
                                                    {"type": "tool_use", "id": tool["id"], "name": "Bash",
                                                     "input": json.loads(partial)}]},
                 {"role": "user", "content": [{"tool_use_id": tool["id"], "type": "tool_result",
                                               "content": "ok", "is_error": False}]}]
    move_cache_marker(messages)
    sub = {"model": "haiku", "max_tokens": 512, "stream": True,
           "system": [{"type": "text", "text": "You summarise conversations."}],
           "messages": [{"role": "user", "content": "Summarise: fix the bug in calc.py"}]}
    post(session, "/v1/messages", sub)
    response = post(session, "/v1/messages?beta=true", claude_request(body, messages))
    tool = next(e["content_block"] for e in sse_events(response) if e["type"] == "content_block_start"
                and e["content_block"]["type"] == "tool_use")
    messages += [{"role": "assistant", "content": [{"type": "text", "text": "Now the tests.",
                                                    "cache_control": {"type": "ephemeral"}},
                                                   {"type": "tool_use", "id": tool["id"], "name": "Bash",
                                                    "input": {"command": "python3 test_calc.py"}}]},
                 {"role": "user", "content": [{"tool_use_id": tool["id"], "type": "tool_result",
                                               "content": "all tests passed", "is_error": False}]}]
    move_cache_marker(messages)
    post(session, "/v1/messages?beta=true", claude_request(body, messages))
    # compaction: same system prompt, history replaced by a summary
    compacted = [{"role": "user", "content": [{"type": "text", "text": "Summary: calc.py was fixed and tested."}]}]
    post(session, "/v1/messages?beta=true", claude_request(body, compacted))
    segments, calls = check_fidelity(session, engine)
    assert kinds(calls) == ["start", "subagent", "extend", "extend", "rewrite"]
    main = [s for s in segments if s.thread == "main"]
    assert [s.reason for s in main] == ["start", "rewrite"]
    # compaction kept the common prefix (tools + system turn) and nothing after it
    header = calls[4].prompt_tokens - calls[4].new_prompt_tokens
    assert header > 0 and main[1].token_ids[:header].tolist() == main[0].token_ids[:header].tolist()


# What Claude Code 2.1.197 puts in a fork's first request after the inherited history (its cli's fork agent).
FORK_STARTED = "Fork started \u2014 processing in background"  # the fork's answer to the call that launched it
FORK_DIRECTIVE = ("<fork-boilerplate>\nYou are a worker fork. The transcript above is the parent's history \u2014 "
                  "inherited reference, not your situation. Execute ONE directive, then stop.\n</fork-boilerplate>\n\n"
                  "Your directive: Run python3 test_calc.py and report its output.")
ASYNC_LAUNCHED = ("Async agent launched successfully.\nagentId: a1b2c3 (internal ID - do not mention to user.)\n"
                  "The agent is working in the background. You will be notified automatically when it completes.")


def claude_tool_use(response: httpx.Response) -> dict:
    """The streamed reply's tool_use block, as Claude Code replays it."""
    events = sse_events(response)
    tool = next(e["content_block"] for e in events if e["type"] == "content_block_start"
                and e["content_block"]["type"] == "tool_use")
    partial = "".join(e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta"
                      and e["delta"]["type"] == "input_json_delta")
    return {"type": "tool_use", "id": tool["id"], "name": tool["name"], "input": json.loads(partial)}


def tool_result(tool_use: dict, content) -> dict:
    return {"type": "tool_result", "tool_use_id": tool_use["id"], "content": content, "is_error": False}


def test_claude_code_fork_launched_by_a_reply_without_text_is_a_subagent(proxy):
    """Claude Code's fork sub-agent (CLAUDE_CODE_FORK_SUBAGENT=1, `Agent(subagent_type: "fork")`) in the shape 2.1.197
    sends: the main agent's system prompt and exact tools, its whole history, a copy of the launching reply, and a
    user turn answering that call with the fork's directive. Its billing header adds `cc_is_subagent=true;`. A
    launching reply without text replays key for key, so the fork holds all of the main branch, sampled reply
    included: only the header says it is another agent. It is a sub-agent of its own, and the main thread's last
    segment is the one the main agent's last call sampled in."""
    body = capture("claude_code")
    session, engine = proxy.open_session(), proxy.engine
    fork_arguments = {"description": "Run the tests", "subagent_type": "fork",
                      "prompt": "Run python3 test_calc.py and report its output."}
    engine.script(assistant_text("", [("Agent", fork_arguments)]),
                  assistant_text("", [("Bash", {"command": "python3 test_calc.py"})]),
                  "The fork is running the tests.",
                  "Ran python3 test_calc.py: all tests passed.")
    main = copy.deepcopy(body["messages"][:2])  # the user turn and the mid-conversation system entry
    launch = claude_tool_use(post(session, "/v1/messages?beta=true", claude_request(body, main)))
    launching_reply = {"role": "assistant", "content": [launch]}  # no text block: the model wrote only the call
    fork_body = copy.deepcopy(body)
    header = fork_body["system"][0]
    assert header["text"].startswith("x-anthropic-billing-header: cc_version=")  # the capture's own header
    header["text"] += " cc_is_subagent=true;"
    fork = [*copy.deepcopy(main), copy.deepcopy(launching_reply),
            {"role": "user", "content": [tool_result(launch, [{"type": "text", "text": FORK_STARTED}]),
                                         {"type": "text", "text": FORK_DIRECTIVE}]}]
    move_cache_marker(fork)
    fork_call = claude_tool_use(post(session, "/v1/messages?beta=true", claude_request(fork_body, fork)))
    main += [launching_reply, {"role": "user", "content": [tool_result(launch, ASYNC_LAUNCHED)]}]
    move_cache_marker(main)
    post(session, "/v1/messages?beta=true", claude_request(body, main))
    fork += [{"role": "assistant", "content": [fork_call]},
             {"role": "user", "content": [tool_result(fork_call, "all tests passed")]}]
    move_cache_marker(fork)
    post(session, "/v1/messages?beta=true", claude_request(fork_body, fork))
    segments, calls = check_fidelity(session, engine)
    assert kinds(calls) == ["start", "subagent", "extend", "subagent"]
    assert [s.thread for s in segments] == ["main", "subagent:1"]
    assert [s.reason for s in segments] == ["start", "subagent"]
    assert calls[1].segment_index == calls[3].segment_index == 1  # the fork's calls: one conversation, one segment
    assert calls[2].segment_index == 0  # the main agent's last call sampled in the last main segment


def test_codex_responses_items_and_event_sequence(proxy):
    body = capture("codex")
    session, engine = proxy.open_session(), proxy.engine
    engine.script(assistant_text("I'll fix the bug.", [("exec_command", {"cmd": "sed -i 's/-/+/' calc.py"})]),
                  "Fixed the bug.")
    body["tools"] += [{"type": "namespace", "name": "multi_agent_v1", "tools": [
        {"type": "function", "name": "spawn_agent", "description": "spawn", "parameters": {"type": "object"}}]},
        {"type": "web_search", "external_web_access": True}]
    items = body["input"][:4]
    request = {**{k: v for k, v in body.items() if k != "input"}, "input": items}
    events = sse_events(post(session, "/v1/responses", request))
    types = [e["type"] for e in events]
    assert types == ["response.created", "response.in_progress",
                     "response.output_item.added", "response.content_part.added", "response.output_text.delta",
                     "response.output_text.done", "response.content_part.done", "response.output_item.done",
                     "response.output_item.added", "response.function_call_arguments.delta",
                     "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    output = events[-1]["response"]["output"]
    call = output[1]
    items = items + [{**output[0], "id": output[0]["id"]}, call,
                     {"type": "function_call_output", "call_id": call["call_id"], "output": "Output:\nok\n"}]
    events = sse_events(post(session, "/v1/responses", {**request, "input": items}))
    assert events[-1]["type"] == "response.completed"
    _, calls = check_fidelity(session, engine)
    assert kinds(calls) == ["start", "extend"]


def test_incremental_render_equals_full_render(proxy, tokenizer):
    """With replies the template would write itself, the session's stream is the full template's tokens."""
    body = capture("mini_toolcall")
    session, engine = proxy.open_session(), proxy.engine
    messages = body["messages"][:2]
    for turn in range(3):
        engine.script(assistant_text(f"Step {turn}.", [("bash", {"command": f"echo {turn}"})]))
        answer = post(session, "/v1/chat/completions",
                      {"model": "m", "messages": messages, "tools": body["tools"]}).json()["choices"][0]["message"]
        messages += [{"role": "assistant", "content": answer["content"], "tool_calls": answer["tool_calls"]},
                     {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": f"out {turn}"},
                     {"role": "tool", "tool_call_id": "extra", "content": "second result"}]
        full = tokenizer.apply_chat_template(messages[:-3], tools=body["tools"], add_generation_prompt=True,
                                             tokenize=True, return_dict=True)["input_ids"]
        assert engine.prompts[-1] == list(full)
    messages.append({"role": "user", "content": "and a user turn"})
    engine.script("done")
    post(session, "/v1/chat/completions", {"model": "m", "messages": messages, "tools": body["tools"]})
    full = tokenizer.apply_chat_template(messages, tools=body["tools"], add_generation_prompt=True, tokenize=True,
                                         return_dict=True)["input_ids"]
    assert engine.prompts[-1] == list(full)
    _, calls = check_fidelity(session, engine)
    assert kinds(calls) == ["start", "extend", "extend", "extend"]


def test_retokenizing_the_final_conversation_differs_from_what_was_sampled(proxy, tokenizer):
    """Thinking the template strips, spaced JSON the harness compacts, and a token split the tokenizer would
    merge: re-rendering the final messages loses all three; the proxy's record keeps the sampled tokens."""
    body = capture("opencode")
    session, engine = proxy.open_session(), proxy.engine
    hel, lo = tokenizer.encode("hel", add_special_tokens=False), tokenizer.encode("lo", add_special_tokens=False)
    first = (tokenizer.encode("<think>\nLet me look.\n</think>\n\n", add_special_tokens=False)
             + tokenizer.encode(assistant_text("I'll run ls.", [("bash", {"command": "ls"})]),
                                add_special_tokens=False) + [151645])
    engine.script(first, hel + lo + [151645])
    messages = body["messages"][:2]
    request = {"model": "m", "messages": messages, "tools": body["tools"]}
    answer = post(session, "/v1/chat/completions", request).json()["choices"][0]["message"]
    assert answer["reasoning_content"] == "Let me look."
    messages += [{"role": "assistant", "content": answer["content"], "tool_calls": [
        {**answer["tool_calls"][0], "function": {"name": "bash", "arguments": '{"command":"ls"}'}}]},
        {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": "calc.py"}]
    reply = post(session, "/v1/chat/completions", {**request, "messages": messages}).json()
    messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
    segments, _ = check_fidelity(session, engine)
    recorded = segments[-1].token_ids.tolist()
    assert recorded == engine.prompts[-1] + engine.results[-1].token_ids
    retokenized = tokenizer.apply_chat_template(messages, tools=body["tools"], tokenize=True,
                                                return_dict=True)["input_ids"]
    assert list(retokenized) != recorded
    sampled = [t for t, m in zip(recorded, segments[-1].response_mask.tolist(), strict=True) if m]
    assert sampled == engine.results[0].token_ids + engine.results[1].token_ids


def test_a_reply_replayed_with_other_whitespace_and_json_spacing_extends_the_branch(proxy):
    """A harness that strips or pads the model's text and re-spaces its tool-call JSON when it replays the reply
    resends the same message: the branch is extended with the tokens the model sampled. Changing a word is another
    message: the prompt is rendered from it (a rewrite)."""
    body = capture("mini_toolcall")
    session, engine = proxy.open_session(), proxy.engine
    engine.script(assistant_text("  I'll look\n\nat the files.", [("bash", {"command": "ls -la", "n": 2})]),
                  assistant_text("Now\tthe tests.", [("bash", {"command": "pytest"})]),
                  "Done.")
    messages = body["messages"][:2]
    request = {"model": "m", "messages": messages, "tools": body["tools"]}
    for content, replayed_arguments in (("I'll look at the files.", '{"n":2,  "command": "ls -la"}'),
                                        ("Now the tests.  ", '{\n  "command": "pytest"\n}')):
        answer = post(session, "/v1/chat/completions", request).json()["choices"][0]["message"]
        call = answer["tool_calls"][0]
        assert answer["content"].split() == content.split() and answer["content"] != content
        messages = [*messages, {"role": "assistant", "content": content, "tool_calls": [
            {**call, "function": {"name": "bash", "arguments": replayed_arguments}}]},
            {"role": "tool", "tool_call_id": call["id"], "content": "ok"}]
        request = {**request, "messages": messages}
    post(session, "/v1/chat/completions", request)
    segments, calls = check_fidelity(session, engine)
    assert kinds(calls) == ["start", "extend", "extend"] and len(segments) == 1

    engine.script("Again.")
    messages[-2] = {**messages[-2], "content": "Now the other tests."}
    post(session, "/v1/chat/completions", {**request, "messages": messages})
    _, calls = check_fidelity(session, engine)
    assert kinds(calls)[-1] == "rewrite"
