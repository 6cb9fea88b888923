"""What each call asked and what it answered, kept as JSON beside the call's token record (`LLMCall.request_json`,
`LLMCall.reply_json`; the format is described on LLMCall, and `lego.records.expand_requests` reads it back).

A harness replays its whole history on every call, so a request is stored as what it adds to the previous request
of the same thread (the longest run of leading messages equal to that request's, then the rest): a rollout's
requests cost their conversation's length once, not once per call. Messages are compared whole (role, text, tool
calls with their ids, reasoning), not by the session's match keys, which ignore whitespace and ids: the stored
request is exactly the one the harness sent, as parsed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from lego.proxy.messages import ChatMessage, Conversation

try:  # several times faster than json for a call's new messages (prefect depends on it)
    from orjson import dumps as _fast_dumps
except ImportError:  # pragma: no cover - json alone is correct, only slower
    _fast_dumps = None


def message_dict(message: ChatMessage) -> dict[str, Any]:
    """A message in OpenAI chat form (what MLflow's trace viewer renders as a chat)."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [{**({"id": call.id} if call.id else {}), "type": "function",
                              "function": {"name": call.name, "arguments": call.arguments}}
                             for call in message.tool_calls]
    if message.reasoning is not None:
        out["reasoning_content"] = message.reasoning
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    return out


def _dumps(value: dict[str, Any]) -> str:
    """JSON text of messages (strings and small integers only: no floats, whose spelling orjson could change):
    orjson's compact form, or json's where orjson refuses a string (a lone surrogate). Readers parse it back."""
    if _fast_dumps is not None:
        try:
            return _fast_dumps(value).decode()
        except TypeError:  # orjson.JSONEncodeError: a string that is not valid UTF-8
            pass
    return json.dumps(value, ensure_ascii=False)


def reply_json(message: ChatMessage) -> str:
    return _dumps(message_dict(message))


@dataclass
class _Sent:
    call_index: int
    messages: list[ChatMessage]
    tools: list[dict[str, Any]]


class RequestLog:
    """Encodes a session's requests as deltas; one per session, called under the session's lock."""

    def __init__(self) -> None:
        self._last: dict[int, _Sent] = {}  # thread order -> its latest recorded request

    def encode(self, thread: int, call_index: int, conversation: Conversation) -> str:
        last = self._last.get(thread)
        keep = 0
        if last is not None:
            # a resent history's messages are the previous request's own objects (lego/proxy/resend.py): the list
            # comparison (in C, each element by identity first) settles the usual case at once
            shared = min(len(conversation.messages), len(last.messages))
            if conversation.messages[:shared] == last.messages[:shared]:
                keep = shared
            else:
                for ours, theirs in zip(conversation.messages, last.messages, strict=False):
                    if ours is not theirs and ours != theirs:
                        break
                    keep += 1
        delta: dict[str, Any] = {"base": last.call_index if last is not None else -1, "keep": keep,
                                 "messages": [message_dict(m) for m in conversation.messages[keep:]]}
        if last is None or (conversation.tools is not last.tools and conversation.tools != last.tools):
            delta["tools"] = conversation.tools
        self._last[thread] = _Sent(call_index, conversation.messages, conversation.tools)
        # tools are any JSON a harness sent (floats, huge integers): json writes them as it read them
        return json.dumps(delta, ensure_ascii=False) if "tools" in delta else _dumps(delta)
