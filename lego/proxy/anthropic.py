"""Anthropic Messages: request -> Conversation, Completion -> JSON or SSE events.

`system` (a string or text blocks) comes first; `role: system` entries inside `messages` (Claude Code's
mid-conversation system) stay where they are. A user message's `tool_result` blocks become tool turns and its text
blocks a user turn, in block order. `<think>` reasoning comes back as a `thinking` block (empty signature) and
`<tool_call>`s as `tool_use` blocks. cache_control, thinking, context_management, output_config, metadata and
other unknown keys are accepted and ignored.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from lego.proxy.messages import (
    ChatMessage,
    Conversation,
    RequestError,
    ToolCall,
    arguments_text,
    expect,
    function_tool,
    text_of,
)
from lego.proxy.session import Completion

PROTOCOL = "anthropic_messages"
ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 500: "api_error"}


def error_body(message: str, status: int) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


def _blocks(content: Any, param: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    expect(content, list, param)
    for i, block in enumerate(content):
        expect(block, dict, f"{param}[{i}]")
    return content


def parse_messages(raw: Any, system: Any) -> list[ChatMessage]:
    messages: list[ChatMessage] = []
    if system is not None and system != "" and system != []:
        messages.append(ChatMessage(role="system", content=text_of(system, "system")))
    expect(raw, list, "messages")
    if not raw:
        raise RequestError("'messages' must not be empty", param="messages")
    for i, item in enumerate(raw):
        param = f"messages[{i}]"
        expect(item, dict, param)
        role = expect(item.get("role"), str, f"{param}.role")
        blocks = _blocks(item.get("content", ""), f"{param}.content")
        if role == "system":
            messages.append(ChatMessage(role="system", content=text_of(blocks, f"{param}.content")))
        elif role == "assistant":
            texts, thinking, calls = [], [], []
            for j, block in enumerate(blocks):
                kind = block.get("type")
                if kind == "text":
                    texts.append(expect(block.get("text", ""), str, f"{param}.content[{j}].text"))
                elif kind == "thinking":
                    thinking.append(str(block.get("thinking", "")))
                elif kind == "tool_use":
                    calls.append(ToolCall(name=expect(block.get("name"), str, f"{param}.content[{j}].name"),
                                          arguments=arguments_text(block.get("input"), f"{param}.content[{j}].input"),
                                          id=str(block.get("id", ""))))
            messages.append(ChatMessage(role="assistant", content="\n".join(texts), tool_calls=calls,
                                        reasoning="\n".join(thinking) if thinking else None))
        elif role == "user":
            texts: list[dict[str, Any]] = []
            for j, block in enumerate(blocks):
                if block.get("type") == "tool_result":
                    if texts:
                        messages.append(ChatMessage(role="user", content=text_of(texts, f"{param}.content")))
                        texts = []
                    messages.append(ChatMessage(role="tool", content=text_of(block.get("content"),
                                                                             f"{param}.content[{j}].content"),
                                                tool_call_id=str(block.get("tool_use_id", ""))))
                else:
                    texts.append(block)
            if texts or not blocks:
                messages.append(ChatMessage(role="user", content=text_of(texts, f"{param}.content")))
        else:
            raise RequestError(f"'{param}.role' must be user, assistant or system", param=f"{param}.role")
    return messages


def parse_tools(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    expect(raw, list, "tools")
    tools = []
    for i, tool in enumerate(raw):
        expect(tool, dict, f"tools[{i}]")
        if "input_schema" not in tool and tool.get("type") not in (None, "custom"):
            continue  # server tools (web_search_20250305, ...) have no schema the model can call
        tools.append(function_tool(tool.get("name"), tool.get("description"), tool.get("input_schema"), f"tools[{i}]"))
    return tools


def parse_request(body: dict[str, Any]) -> tuple[Conversation, dict[str, Any]]:
    conversation = Conversation(parse_messages(body.get("messages"), body.get("system")), parse_tools(body.get("tools")))
    max_tokens = body.get("max_tokens")
    if max_tokens is not None:
        expect(max_tokens, int, "max_tokens")
        if max_tokens < 1:
            raise RequestError("'max_tokens' must be at least 1", param="max_tokens")
    tool_choice = body.get("tool_choice") or {}
    stop_sequences = body.get("stop_sequences") or []
    if not isinstance(stop_sequences, list) or not all(isinstance(item, str) for item in stop_sequences):
        raise RequestError("'stop_sequences' must be a list of strings", param="stop_sequences")
    options = {
        "model": str(body.get("model") or ""),
        "stream": bool(expect(body.get("stream", False), bool, "stream")),
        "max_tokens": max_tokens,
        "stop": tuple(item for item in stop_sequences if item),
        "parse_tools": bool(conversation.tools) and not (isinstance(tool_choice, dict) and tool_choice.get("type") == "none"),
    }
    return conversation, options


def _content(completion: Completion) -> list[dict[str, Any]]:
    reply = completion.reply
    blocks: list[dict[str, Any]] = []
    if reply.reasoning:
        blocks.append({"type": "thinking", "thinking": reply.reasoning, "signature": ""})
    if reply.content or not reply.tool_calls:
        blocks.append({"type": "text", "text": reply.content})
    for call in reply.tool_calls:
        blocks.append({"type": "tool_use", "id": f"toolu_{secrets.token_hex(12)}", "name": call.name,
                       "input": json.loads(call.arguments), "_raw": call.arguments})
    return blocks


def _stop_reason(completion: Completion) -> str:
    if completion.reply.tool_calls:
        return "tool_use"
    if completion.stop_sequence:
        return "stop_sequence"
    return "max_tokens" if completion.finish_reason == "length" else "end_turn"


def _usage(completion: Completion, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": completion.prompt_tokens, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def response_body(completion: Completion, options: dict[str, Any], model: str) -> dict[str, Any]:
    content = [{k: v for k, v in block.items() if k != "_raw"} for block in _content(completion)]
    return {"id": f"msg_{secrets.token_hex(12)}", "type": "message", "role": "assistant",
            "model": options["model"] or model, "content": content, "stop_reason": _stop_reason(completion),
            "stop_sequence": completion.stop_sequence, "usage": _usage(completion, completion.completion_tokens)}


def stream_events(completion: Completion, options: dict[str, Any], model: str) -> list[bytes]:
    def event(kind: str, data: dict[str, Any]) -> bytes:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()

    message = {"id": f"msg_{secrets.token_hex(12)}", "type": "message", "role": "assistant",
               "model": options["model"] or model, "content": [], "stop_reason": None, "stop_sequence": None,
               "usage": _usage(completion, 1)}
    lines = [event("message_start", {"message": message}), event("ping", {})]
    for index, block in enumerate(_content(completion)):
        if block["type"] == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": block["thinking"]},
                      {"type": "signature_delta", "signature": ""}]
        elif block["type"] == "text":
            start = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": block["text"]}] if block["text"] else []
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": block["_raw"]}]
        lines.append(event("content_block_start", {"index": index, "content_block": start}))
        lines.extend(event("content_block_delta", {"index": index, "delta": delta}) for delta in deltas)
        lines.append(event("content_block_stop", {"index": index}))
    stop = {"stop_reason": _stop_reason(completion), "stop_sequence": completion.stop_sequence}
    lines.append(event("message_delta", {"delta": stop,
                                         "usage": {"output_tokens": completion.completion_tokens}}))
    lines.append(event("message_stop", {}))
    return lines
