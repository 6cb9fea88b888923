"""A resent history is parsed from its new items alone (lego/proxy/resend.py): the result must be exactly the full
parse's, on real harnesses' captured requests, and any request that differs from a kept one anywhere else (by one
byte) must take the full path."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest

from lego.proxy import anthropic, openai_chat, responses
from lego.proxy.messages import RequestError
from lego.proxy.resend import ResentRequests, messages_layout
from lego.proxy.session import agent_signature

FIXTURES = Path(__file__).parent / "fixtures" / "threads"
ROUTES = {"/v1/messages": anthropic, "/v1/chat/completions": openai_chat, "/v1/responses": responses}


def module_for(path: str):
    return ROUTES[path.split("?")[0]]


def same_parse(resent: ResentRequests, module, raw: bytes) -> bool:
    """Parse `raw` through `resent`, check it against the full parse; whether the shortcut served it."""
    before = resent.shortcuts
    conversation, options = resent.parse(module, raw)
    expected, expected_options = module.parse_request(json.loads(raw))
    assert conversation == expected and options == expected_options
    assert conversation.keys() == expected.keys() and conversation.tools_key() == expected.tools_key()
    assert agent_signature(conversation) == agent_signature(expected)
    return resent.shortcuts > before


@pytest.mark.parametrize("harness", ["claude-code", "codex", "mini-swe-agent", "opencode", "openhands"])
def test_captured_requests_parse_the_same_either_way(harness):
    with lzma.open(FIXTURES / f"{harness}.json.xz", "rt", encoding="utf-8") as handle:
        calls = json.load(handle)["calls"]
    resent = ResentRequests()
    served = [same_parse(resent, module_for(call["path"]), json.dumps(call["body"]).encode()) for call in calls]
    if harness != "codex":  # Responses requests are always parsed whole
        assert any(served)


def chat_body(messages: list[dict], **extra) -> bytes:
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    return json.dumps({"model": "m", "messages": messages, "tools": tools, **extra}).encode()


HISTORY = [{"role": "system", "content": "You are an agent. [brackets] {braces} \"quotes\" \\ done"},
           {"role": "user", "content": "Fix the bug."},
           {"role": "assistant", "content": "", "tool_calls": [
               {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}]}]
OBSERVATION = {"role": "tool", "tool_call_id": "c1", "content": "calc.py\n]}, {\"role\": \"user\"}"}


def test_appended_and_rewritten_items_take_the_shortcut():
    resent = ResentRequests()
    assert not same_parse(resent, openai_chat, chat_body(HISTORY))
    assert same_parse(resent, openai_chat, chat_body([*HISTORY, OBSERVATION]))
    # the last item rewritten (as Claude Code moves its cache marker) and one more appended
    marked = {**OBSERVATION, "content": [{"type": "text", "text": OBSERVATION["content"]}]}
    assert same_parse(resent, openai_chat, chat_body([*HISTORY, marked, {"role": "user", "content": "go on"}]))


def test_a_request_that_differs_by_one_byte_takes_the_full_path():
    first = chat_body(HISTORY)
    later = chat_body([*HISTORY, OBSERVATION])
    # the system message (an item before the last REWRITTEN_ITEMS: an edit of those is parsed again, checked
    # above), a tool's name, another field
    changed_at = [later.index(b"agent."), later.rindex(b'"bash"') + 1, later.index(b'"m"') + 1]
    for position in changed_at:
        edited = bytearray(later)
        edited[position] = ord("X")
        resent = ResentRequests()
        resent.parse(openai_chat, first)
        assert not same_parse(resent, openai_chat, bytes(edited))
    # a field added after the messages: the full path (which refuses what it does not know)
    resent = ResentRequests()
    resent.parse(openai_chat, first)
    assert not same_parse(resent, openai_chat, chat_body([*HISTORY, OBSERVATION], stream=False))
    with pytest.raises(RequestError, match="not a Chat Completions request field"):
        resent.parse(openai_chat, chat_body([*HISTORY, OBSERVATION], temperature_x=1))


def test_invalid_new_items_are_answered_by_the_full_path():
    resent = ResentRequests()
    resent.parse(openai_chat, chat_body(HISTORY))
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}
    with pytest.raises(RequestError, match=r"'messages\[3\]\[0\]'|messages\[3\]"):
        resent.parse(openai_chat, chat_body([*HISTORY, image]))
    trailing_comma = chat_body(HISTORY)[:-1].replace(b"]], \"tools\"", b"]],, \"tools\"")
    with pytest.raises(RequestError, match="not valid JSON"):
        resent.parse(openai_chat, trailing_comma)


def test_the_layout_skips_what_strings_hold():
    raw = chat_body([*HISTORY, OBSERVATION])
    layout = messages_layout(raw)
    assert layout is not None and layout.count == 4
    items = json.loads(raw)["messages"]
    for index, item in enumerate(items):
        start = layout.start(raw, index)
        assert json.loads(b"[" + raw[start:(layout.start(raw, index + 1) if index + 1 < 4 else layout.last_end)]
                          .rstrip(b", ") + b"]") == [item]
    assert raw[layout.close:layout.close + 1] == b"]"
    assert messages_layout(b'{"messages": "text"}') is None
    assert messages_layout(b'{"messages": [{}], "messages": [{}]}') is None
    assert messages_layout(b'{"other": {"messages": [{}]}}') is None
