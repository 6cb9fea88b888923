"""One conversation model for all three protocols, and the content keys that recognise known messages.

Every protocol's request (OpenAI chat, Anthropic messages, OpenAI Responses) becomes a `Conversation`: a list of
`ChatMessage` (role system | user | assistant | tool, string content) and tools in OpenAI function format, which is
what the model's chat template takes. A message's `key()` is what the session matches on: it ignores what
harnesses change when they replay history (cache_control markers, whitespace, compact vs spaced tool-call JSON,
thinking blocks they may or may not echo, tool-call ids), and keeps everything the model would see differently.
"""

from __future__ import annotations

import hashlib
import json
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


def normalize_text(text: str) -> str:
    """Whitespace-insensitive form of a text: harnesses re-indent, strip or pad what they replay."""
    return " ".join(text.split())


def canonical_arguments(arguments: Any) -> str:
    """Tool-call arguments compared by value: `{"a": 1}` and `{"a":1}` are the same call."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return normalize_text(arguments)
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
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

    def key(self) -> str:
        parts = [self.role, normalize_text(self.content)]
        for call in self.tool_calls:
            parts.append(f"{call.name}({canonical_arguments(call.arguments)})")
        return hashlib.blake2b("\x1f".join(parts).encode(), digest_size=16).hexdigest()

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

    def tools_key(self) -> str:
        return hashlib.blake2b(json.dumps(self.tools, sort_keys=True).encode(), digest_size=16).hexdigest()

    def keys(self) -> list[str]:
        """The tools (they render into the first turn) and then every message, as match keys."""
        return [f"tools:{self.tools_key()}", *(message.key() for message in self.messages)]

    def system_text(self) -> str:
        """The leading system messages: what tells the main thread from a sub-agent or a title request."""
        texts = []
        for message in self.messages:
            if message.role != "system":
                break
            texts.append(message.content)
        return normalize_text("\n".join(texts))

    def template_messages(self, known: int = 0) -> list[dict[str, Any]]:
        return [m.to_template(keep_reasoning=i >= known) for i, m in enumerate(self.messages)]


# ---------------------------------------------------------------------------------------------- validation


def expect(value: Any, kind: type | tuple[type, ...], param: str) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise RequestError(f"'{param}' must be {names}, got {type(value).__name__}", param=param)
    return value


def text_of(content: Any, param: str) -> str:
    """Text of a content field: a string, None, or a list of parts/blocks (text kept, images noted)."""
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
        elif kind in ("image", "image_url", "input_image", "document", "input_file"):
            texts.append(f"[{kind} omitted]")
        # other part types (refusal, cache markers, ...) carry nothing the model reads
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
