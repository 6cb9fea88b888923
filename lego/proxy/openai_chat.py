"""OpenAI Chat Completions: request -> Conversation, Completion -> JSON or SSE chunks.

Reasoning (`<think>`) is returned in `reasoning_content` (vLLM's field); `content` holds the rest. Tool calls come
back as `tool_calls` with the model's own argument JSON. `stop` strings end the reply: the text returned
ends before the stop string, while the session keeps every sampled token (the stop string's included).
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

PROTOCOL = "openai_chat"
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool",
         "function": "tool"}


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def parse_tools(raw: Any, param: str = "tools") -> list[dict[str, Any]]:
    if raw is None:
        return []
    expect(raw, list, param)
    tools = []
    for i, tool in enumerate(raw):
        expect(tool, dict, f"{param}[{i}]")
        if tool.get("type", "function") != "function":
            continue
        function = expect(tool.get("function"), dict, f"{param}[{i}].function")
        tools.append(function_tool(function.get("name"), function.get("description"), function.get("parameters"),
                                   f"{param}[{i}].function"))
    return tools


def parse_messages(raw: Any) -> list[ChatMessage]:
    expect(raw, list, "messages")
    if not raw:
        raise RequestError("'messages' must not be empty", param="messages")
    messages = []
    for i, item in enumerate(raw):
        param = f"messages[{i}]"
        expect(item, dict, param)
        role = ROLES.get(expect(item.get("role"), str, f"{param}.role"))
        if role is None:
            raise RequestError(f"'{param}.role' must be one of {', '.join(ROLES)}", param=f"{param}.role")
        message = ChatMessage(role=role, content=text_of(item.get("content"), f"{param}.content"))
        if role == "assistant":
            for j, call in enumerate(item.get("tool_calls") or []):
                expect(call, dict, f"{param}.tool_calls[{j}]")
                function = expect(call.get("function"), dict, f"{param}.tool_calls[{j}].function")
                message.tool_calls.append(ToolCall(
                    name=expect(function.get("name"), str, f"{param}.tool_calls[{j}].function.name"),
                    arguments=arguments_text(function.get("arguments"), f"{param}.tool_calls[{j}].function.arguments"),
                    id=str(call.get("id", ""))))
            reasoning = item.get("reasoning_content")
            message.reasoning = reasoning if isinstance(reasoning, str) else None
        if role == "tool":
            message.tool_call_id = str(item.get("tool_call_id", ""))
        messages.append(message)
    return messages


def parse_request(body: dict[str, Any]) -> tuple[Conversation, dict[str, Any]]:
    conversation = Conversation(parse_messages(body.get("messages")), parse_tools(body.get("tools")))
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        expect(max_tokens, int, "max_tokens")
        if max_tokens < 1:
            raise RequestError("'max_tokens' must be at least 1", param="max_tokens")
    stream = bool(expect(body.get("stream", False), bool, "stream"))
    stream_options = body.get("stream_options") or {}
    expect(stream_options, dict, "stream_options")
    tool_choice = body.get("tool_choice", "auto")
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(item, str) for item in stop) or len(stop) > 4:
        raise RequestError("'stop' must be a string or a list of up to 4 strings", param="stop")
    options = {
        "model": str(body.get("model") or ""),
        "stream": stream,
        "include_usage": bool(stream_options.get("include_usage", False)),
        "max_tokens": max_tokens,
        "stop": tuple(item for item in stop if item),
        "parse_tools": bool(conversation.tools) and tool_choice != "none",
    }
    return conversation, options


def _tool_calls(completion: Completion) -> list[dict[str, Any]]:
    return [{"id": f"call_{secrets.token_hex(12)}", "type": "function",
             "function": {"name": call.name, "arguments": call.arguments}}
            for call in completion.reply.tool_calls]


def _finish_reason(completion: Completion) -> str:
    if completion.reply.tool_calls:
        return "tool_calls"
    return "length" if completion.finish_reason == "length" else "stop"


def _usage(completion: Completion) -> dict[str, int]:
    return {"prompt_tokens": completion.prompt_tokens, "completion_tokens": completion.completion_tokens,
            "total_tokens": completion.prompt_tokens + completion.completion_tokens}


def response_body(completion: Completion, options: dict[str, Any], model: str) -> dict[str, Any]:
    reply = completion.reply
    calls = _tool_calls(completion)
    message: dict[str, Any] = {"role": "assistant", "content": reply.content if (reply.content or not calls) else None}
    if calls:
        message["tool_calls"] = calls
    if reply.reasoning is not None:
        message["reasoning_content"] = reply.reasoning
    return {"id": f"chatcmpl-{secrets.token_hex(12)}", "object": "chat.completion", "created": int(time.time()),
            "model": options["model"] or model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": _finish_reason(completion)}],
            "usage": _usage(completion)}


def stream_chunks(completion: Completion, options: dict[str, Any], model: str) -> list[bytes]:
    """The SSE lines of a streamed answer (the whole reply is known when streaming starts)."""
    base = {"id": f"chatcmpl-{secrets.token_hex(12)}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": options["model"] or model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        body = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        return f"data: {json.dumps(body)}\n\n".encode()

    reply = completion.reply
    lines = [chunk({"role": "assistant", "content": ""})]
    if reply.reasoning:
        lines.append(chunk({"reasoning_content": reply.reasoning}))
    if reply.content:
        lines.append(chunk({"content": reply.content}))
    for index, call in enumerate(_tool_calls(completion)):
        lines.append(chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                            "function": {"name": call["function"]["name"], "arguments": ""}}]}))
        lines.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": call["function"]["arguments"]}}]}))
    lines.append(chunk({}, _finish_reason(completion)))
    if options["include_usage"]:
        lines.append(f"data: {json.dumps({**base, 'choices': [], 'usage': _usage(completion)})}\n\n".encode())
    lines.append(b"data: [DONE]\n\n")
    return lines
