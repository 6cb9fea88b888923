"""One conversation model for all three protocols, and the content keys that recognise known messages.

Every protocol's request (OpenAI chat, Anthropic messages, OpenAI Responses) becomes a `Conversation`: a list of
`ChatMessage` (role system | user | assistant | tool, string content) and tools in OpenAI function format, which is
what the model's chat template takes. A message's `key()` is what the session matches on: it ignores what
harnesses change when they replay history (cache_control markers, whitespace, compact vs spaced tool-call JSON,
thinking blocks they may or may not echo, tool-call ids), and keeps everything the model would see differently.

Every call replays the whole history, and a harness's system prompt and tools can be 80 KB: a message's key is made
once per message and compared by its text before anything is normalized (`MessageKey`); the tools' key and the
normalized system text are computed once per process for each distinct value (the next request's equal strings and
tool lists find them).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from lego.errors import LegoError


class RequestError(LegoError):
    """A request the proxy cannot serve; the server answers it in the protocol's error shape."""

    def __init__(self, message: str, status: int = 400, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.kind = kind
        self.param = param
        self.code = code


class ContextOverflowError(RequestError):
    """The prompt (plus the tokens it may sample) does not fit the engine's context: the session is overlong."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=400, kind="invalid_request_error", code="context_length_exceeded")


LONG_TEXT = 2048  # system texts at least this long have their normalized form kept per process
TOOLS_KEYS_KEPT = 16  # distinct tool lists whose key a process keeps


_ids = random.Random()  # seeded from the system's randomness once (again in a forked child): unique, not secret
os.register_at_fork(after_in_child=_ids.seed)


def new_id(prefix: str) -> str:
    """A fresh id for a reply, a message or a tool call: `prefix` and 24 hex digits (96 random bits). Not from
    `secrets`: its system call per id is a measurable part of a call's cost."""
    return f"{prefix}{_ids.getrandbits(96):024x}"


def normalize_text(text: str) -> str:
    """Whitespace-insensitive form of a text: harnesses re-indent, strip or pad what they replay."""
    return " ".join(text.split())


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def text_digest(text: str) -> str:
    """Digest of a text's whitespace-insensitive form."""
    return _digest(normalize_text(text))


@functools.lru_cache(maxsize=64)
def _normalized_long_text(text: str) -> str:
    return normalize_text(text)


_tools_keys: deque[tuple[list[dict[str, Any]], str]] = deque(maxlen=TOOLS_KEYS_KEPT)


def tools_key(tools: list[dict[str, Any]]) -> str:
    """Key of a tool list by value. Every call of a session sends its tool list again: one equal to a recent one
    (compared by value, far cheaper than serializing it) gets that one's key."""
    for known, key in _tools_keys:
        if len(known) == len(tools) and known == tools:
            return key
    key = _digest(json.dumps(tools, sort_keys=True))
    _tools_keys.append((copy.deepcopy(tools), key))  # a copy: the caller's list may change later
    return key


def canonical_arguments(arguments: Any) -> str:
    """Tool-call arguments compared by value: `{"a": 1}` and `{"a":1}` are the same call."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return normalize_text(arguments)
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@functools.lru_cache(maxsize=2048)
def _message_digest(role: str, content: str, calls: tuple[tuple[str, str], ...]) -> str:
    parts = [role, text_digest(content)]
    for name, arguments in calls:
        parts.append(f"{name}({canonical_arguments(arguments)})")
    return _digest("\x1f".join(parts))


class MessageKey:
    """A message's match key: two keys are equal when the messages' roles are, their texts are up to whitespace, and
    their tool calls are (names, and arguments by value). Equality is settled on the messages' own texts first: a
    harness resends what it sent, so equal texts are the usual case, and nothing is normalized for it. Only keys
    whose texts differ (or a hash) need the whitespace-insensitive digest, computed then and kept. Normalizing and
    digesting every new message up front cost more than tokenizing it (a 1.5 KB tool result's ~300 words split
    into strings only to be joined again)."""

    __slots__ = ("role", "content", "calls", "_digest")

    def __init__(self, role: str, content: str, calls: tuple[tuple[str, str], ...] = ()) -> None:
        self.role, self.content, self.calls = role, content, calls
        self._digest: str | None = None

    def digest(self) -> str:
        """The whitespace-insensitive digest (role, normalized text, canonical tool calls)."""
        if self._digest is None:
            self._digest = _message_digest(self.role, self.content, self.calls)
        return self._digest

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not MessageKey:
            return NotImplemented
        if self.role != other.role or len(self.calls) != len(other.calls):
            return False
        if self.content == other.content and self.calls == other.calls:
            return True
        return self.digest() == other.digest()

    def __hash__(self) -> int:
        return hash(self.digest())

    def __repr__(self) -> str:
        return f"MessageKey({self.role!r}, {self.content[:40]!r}{'...' if len(self.content) > 40 else ''}, " \
               f"{len(self.calls)} calls)"


MatchKey = str | MessageKey  # a conversation's keys: its tools' key (a string), then each message's


# Not frozen (nothing changes one once built): a frozen dataclass costs three times as much to build, and every call
# builds several of these and of the reply's events.
@dataclass(slots=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as the model wrote it or as the harness replayed it
    id: str = ""


@dataclass
class ChatMessage:
    role: str  # system | user | assistant | tool
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning: str | None = None  # assistant thinking the harness replayed (Anthropic thinking, reasoning_content)
    tool_call_id: str = ""
    _key: MessageKey | None = field(default=None, init=False, repr=False, compare=False)

    def key(self) -> MessageKey:
        """The match key (see `MessageKey`), made once: a message is not changed after it is read."""
        if self._key is None:
            self._key = MessageKey(self.role, self.content,
                                   tuple([(call.name, call.arguments) for call in self.tool_calls]))
        return self._key

    def to_template(self, keep_reasoning: bool = True) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {"type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                for call in self.tool_calls
            ]
        if self.role == "assistant":
            if not keep_reasoning:
                # Rendered only to locate a boundary: no <think> block, whatever the template's rules.
                message["reasoning_content"] = ""
            elif self.reasoning is not None:
                message["reasoning_content"] = self.reasoning
        return message


@dataclass
class Conversation:
    messages: list[ChatMessage]
    tools: list[dict[str, Any]]  # [{"type": "function", "function": {name, description, parameters}}]
    _keys: list[MatchKey] | None = field(default=None, init=False, repr=False, compare=False)
    _tools_key: str | None = field(default=None, init=False, repr=False, compare=False)
    _system_text: str | None = field(default=None, init=False, repr=False, compare=False)
    # what the session derives from the system text and the tools alone (its agent signature), kept with them
    signature: str | None = field(default=None, init=False, repr=False, compare=False)

    def tools_key(self) -> str:
        if self._tools_key is None:
            self._tools_key = tools_key(self.tools)
        return self._tools_key

    def keys(self) -> list[MatchKey]:
        """The tools (they render into the first turn) and then every message, as match keys (computed once)."""
        if self._keys is None:
            self._keys = [f"tools:{self.tools_key()}", *(message.key() for message in self.messages)]
        return list(self._keys)  # the caller's own list: a session extends it

    def system_text(self) -> str:
        """The leading system messages: what tells the main thread from a sub-agent or a title request."""
        if self._system_text is None:
            texts = []
            for message in self.messages:
                if message.role != "system":
                    break
                texts.append(message.content)
            text = "\n".join(texts)
            self._system_text = _normalized_long_text(text) if len(text) >= LONG_TEXT else normalize_text(text)
        return self._system_text

    def extended(self, keep: int, messages: list[ChatMessage]) -> Conversation:
        """This conversation's first `keep` messages (the very objects: they are not changed once read) followed by
        `messages`, with the same tools (the same list). What depends only on the tools and the leading system
        messages is carried over when those are kept whole."""
        conversation = Conversation([*self.messages[:keep], *messages], self.tools)
        conversation._tools_key = self._tools_key
        system = 0
        while system < len(self.messages) and self.messages[system].role == "system":
            system += 1
        if keep > system:  # a kept non-system message ends the leading system run: the same objects in both
            conversation._system_text = self._system_text
            conversation.signature = self.signature
        if self._keys is not None:
            conversation._keys = [*self._keys[: 1 + keep], *(message.key() for message in messages)]
        return conversation

    def template_messages(self, known: int = 0) -> list[dict[str, Any]]:
        return [m.to_template(keep_reasoning=i >= known) for i, m in enumerate(self.messages)]


# ---------------------------------------------------------------------------------------------- validation


def expect(value: Any, kind: type | tuple[type, ...], param: str) -> Any:
    if type(value) is kind:  # the common case first: exactly the type asked for
        return value
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise RequestError(f"'{param}' must be {names}, got {type(value).__name__}", param=param)
    return value


def text_of(content: Any, param: str) -> str:
    """Text of a content field: a string, None, or a list of parts/blocks (text kept, and an assistant's refusal as
    the text it is; images, audio, files and unknown parts refused: the policy reads text only, and dropping them
    would answer a request the model never saw)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"'{param}' must be a string or a list of content parts", param=param)
    texts = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
            continue
        expect(part, dict, f"{param}[{i}]")
        kind = part.get("type", "text")
        if kind in ("text", "input_text", "output_text", "summary_text", "reasoning_text"):
            texts.append(expect(part.get("text", ""), str, f"{param}[{i}].text"))
        elif kind == "refusal":  # what the model said when it declined (OpenAI chat and Responses)
            texts.append(expect(part.get("refusal", ""), str, f"{param}[{i}].refusal"))
        elif kind in ("image", "image_url", "input_image", "document", "input_file", "file", "input_audio"):
            raise RequestError(f"'{param}[{i}]' is a {kind} part, which this server does not support: the policy "
                               "model reads text only; send the content as text", param=f"{param}[{i}]")
        else:
            raise RequestError(f"'{param}[{i}]' is a {kind!r} part, which this server does not support: it reads "
                               "text parts only; send the content as text", param=f"{param}[{i}]")
    return "\n".join(texts)


def function_tool(name: Any, description: Any, parameters: Any, param: str) -> dict[str, Any]:
    expect(name, str, f"{param}.name")
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = expect(description, str, f"{param}.description")
    function["parameters"] = parameters if isinstance(parameters, dict) else {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


def arguments_text(arguments: Any, param: str) -> str:
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        return arguments
    if isinstance(arguments, dict):
        return json.dumps(arguments, ensure_ascii=False)
    raise RequestError(f"'{param}' must be a JSON string or object", param=param)
