"""OpenAI Responses (Codex): request -> Conversation, Completion -> JSON or the SSE event sequence Codex needs.

Input items: `message` (developer -> system), `function_call`, `function_call_output`, `reasoning`; consecutive
assistant-side items (reasoning, assistant message, function calls) form one assistant turn. Tools: `function`
tools are kept, a `namespace` tool's function tools are flattened into the list, other kinds (web_search, ...)
are dropped. The stream always ends with `response.completed` (Codex retries a stream without it), also for a
reply cut off by max_output_tokens (its tokens are recorded with finish reason `length`).
"""

from __future__ import annotations

import json
import secrets
import time
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

PROTOCOL = "openai_responses"
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def parse_tools(raw: Any, param: str = "tools") -> list[dict[str, Any]]:
    if raw is None:
        return []
    expect(raw, list, param)
    tools = []
    for i, tool in enumerate(raw):
        expect(tool, dict, f"{param}[{i}]")
        kind = tool.get("type")
        if kind == "function":
            tools.append(function_tool(tool.get("name"), tool.get("description"), tool.get("parameters"),
                                       f"{param}[{i}]"))
        elif kind == "namespace" and isinstance(tool.get("tools"), list):
            tools.extend(parse_tools(tool["tools"], f"{param}[{i}].tools"))
    return tools


def parse_input(raw: Any, instructions: Any) -> list[ChatMessage]:
    messages: list[ChatMessage] = []
    if instructions:
        messages.append(ChatMessage(role="system", content=expect(instructions, str, "instructions")))
    if isinstance(raw, str):
        return [*messages, ChatMessage(role="user", content=raw)]
    expect(raw, list, "input")
    if not raw:
        raise RequestError("'input' must not be empty", param="input")
    turn: ChatMessage | None = None  # the assistant turn being assembled

    def assistant() -> ChatMessage:
        nonlocal turn
        if turn is None:
            turn = ChatMessage(role="assistant")
            messages.append(turn)
        return turn

    for i, item in enumerate(raw):
        param = f"input[{i}]"
        expect(item, dict, param)
        kind = item.get("type", "message")
        if kind == "message":
            role = ROLES.get(expect(item.get("role"), str, f"{param}.role"))
            if role is None:
                raise RequestError(f"'{param}.role' must be one of {', '.join(ROLES)}", param=f"{param}.role")
            text = text_of(item.get("content"), f"{param}.content")
            if role == "assistant":
                message = assistant()
                message.content = f"{message.content}\n{text}" if message.content else text
            else:
                turn = None
                messages.append(ChatMessage(role=role, content=text))
        elif kind == "function_call":
            assistant().tool_calls.append(ToolCall(
                name=expect(item.get("name"), str, f"{param}.name"),
                arguments=arguments_text(item.get("arguments"), f"{param}.arguments"),
                id=str(item.get("call_id", ""))))
        elif kind == "reasoning":
            parts = (item.get("summary") or []) + (item.get("content") or [])
            text = text_of(parts, f"{param}.summary")
            if text:
                message = assistant()
                message.reasoning = f"{message.reasoning}\n{text}" if message.reasoning else text
        elif kind == "function_call_output":
            turn = None
            output = item.get("output")
            messages.append(ChatMessage(role="tool", content=text_of(output, f"{param}.output"),
                                        tool_call_id=str(item.get("call_id", ""))))
        # other item kinds (web_search_call, compaction markers, ...) carry nothing the template can render
    return messages


def parse_request(body: dict[str, Any]) -> tuple[Conversation, dict[str, Any]]:
    conversation = Conversation(parse_input(body.get("input"), body.get("instructions")),
                                parse_tools(body.get("tools")))
    max_tokens = body.get("max_output_tokens")
    if max_tokens is not None:
        expect(max_tokens, int, "max_output_tokens")
        if max_tokens < 1:
            raise RequestError("'max_output_tokens' must be at least 1", param="max_output_tokens")
    options = {
        "model": str(body.get("model") or ""),
        "stream": bool(expect(body.get("stream", False), bool, "stream")),
        "max_tokens": max_tokens,
        "parse_tools": bool(conversation.tools) and body.get("tool_choice", "auto") != "none",
    }
    return conversation, options


def output_items(completion: Completion) -> list[dict[str, Any]]:
    reply = completion.reply
    items: list[dict[str, Any]] = []
    if reply.reasoning:
        items.append({"type": "reasoning", "id": f"rs_{secrets.token_hex(12)}",
                      "summary": [{"type": "summary_text", "text": reply.reasoning}]})
    if reply.content or not reply.tool_calls:
        items.append({"type": "message", "id": f"msg_{secrets.token_hex(12)}", "status": "completed",
                      "role": "assistant",
                      "content": [{"type": "output_text", "text": reply.content, "annotations": []}]})
    for call in reply.tool_calls:
        items.append({"type": "function_call", "id": f"fc_{secrets.token_hex(12)}",
                      "call_id": f"call_{secrets.token_hex(12)}", "name": call.name, "arguments": call.arguments,
                      "status": "completed"})
    return items


def _usage(completion: Completion) -> dict[str, Any]:
    return {"input_tokens": completion.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": completion.prompt_tokens + completion.completion_tokens}


def response_body(completion: Completion, options: dict[str, Any], model: str,
                  items: list[dict[str, Any]] | None = None, response_id: str | None = None) -> dict[str, Any]:
    return {"id": response_id or f"resp_{secrets.token_hex(12)}", "object": "response",
            "created_at": int(time.time()), "status": "completed", "model": options["model"] or model,
            "output": output_items(completion) if items is None else items, "parallel_tool_calls": True,
            "tool_choice": "auto", "tools": [], "usage": _usage(completion)}


def stream_events(completion: Completion, options: dict[str, Any], model: str) -> list[bytes]:
    lines: list[bytes] = []

    def event(kind: str, data: dict[str, Any]) -> None:
        body = {"type": kind, **data, "sequence_number": len(lines)}
        lines.append(f"event: {kind}\ndata: {json.dumps(body)}\n\n".encode())

    items = output_items(completion)
    final = response_body(completion, options, model, items)
    started = {**final, "status": "in_progress", "output": []}
    event("response.created", {"response": started})
    event("response.in_progress", {"response": started})
    for index, item in enumerate(items):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            event("response.output_item.added", {"output_index": index,
                                                 "item": {**item, "status": "in_progress", "content": []}})
            ref = {"item_id": item["id"], "output_index": index, "content_index": 0}
            event("response.content_part.added", {**ref, "part": {"type": "output_text", "text": "", "annotations": []}})
            if text:
                event("response.output_text.delta", {**ref, "delta": text})
            event("response.output_text.done", {**ref, "text": text})
            event("response.content_part.done", {**ref, "part": item["content"][0]})
        elif item["type"] == "function_call":
            event("response.output_item.added", {"output_index": index,
                                                 "item": {**item, "arguments": "", "status": "in_progress"}})
            ref = {"item_id": item["id"], "output_index": index}
            event("response.function_call_arguments.delta", {**ref, "delta": item["arguments"]})
            event("response.function_call_arguments.done", {**ref, "arguments": item["arguments"]})
        else:  # reasoning
            event("response.output_item.added", {"output_index": index, "item": {**item, "summary": []}})
            ref = {"item_id": item["id"], "output_index": index, "summary_index": 0}
            text = item["summary"][0]["text"]
            event("response.reasoning_summary_part.added", {**ref, "part": {"type": "summary_text", "text": ""}})
            event("response.reasoning_summary_text.delta", {**ref, "delta": text})
            event("response.reasoning_summary_text.done", {**ref, "text": text})
            event("response.reasoning_summary_part.done", {**ref, "part": item["summary"][0]})
        event("response.output_item.done", {"output_index": index, "item": item})
    event("response.completed", {"response": final})
    return lines


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}

