"""OpenAI Chat Completions: request -> Conversation, Completion -> JSON or SSE chunks.

Reasoning (`<think>`) is returned in `reasoning_content` (vLLM's field); `content` holds the rest. Tool calls come
back as `tool_calls` with the model's own argument JSON. `stop` strings end the reply: the text returned
ends before the stop string, while the session keeps every sampled token (the stop string's included).

Every request field is listed in `FIELDS` with how it is treated (see lego/proxy/fields.py); an unknown one is
refused (400, code `unknown_parameter`). Honoured: messages, max_tokens / max_completion_tokens, stop, stream,
stream_options.include_usage, function tools, `tool_choice` (`required` or a named function forces a tool call,
`none` leaves the reply's text unparsed) and `parallel_tool_calls: false` (the generation ends with the first
complete tool call; see `Session.complete`); structured output (`response_format` json_schema or json_object: the
reply is JSON following the schema, or any JSON object) and strict tools (`strict: true`: every call follows its
tool's schema); a forced call, structured output and strict tools are constrained decoding, enforced by the engine
(lego/engine/constraints.py; an engine that cannot, or a schema it cannot compile, gets a 400); `n`, `logprobs`,
`modalities` for the values this server serves (1, false, text). An assistant's `refusal` (field or content part) in
replayed history is what the model said: it is rendered as the assistant's text. The policy's own, whatever the
request says: temperature, top_p, frequency/presence penalties, logit_bias, seed, reasoning_effort (OpenHands sends
it) and verbosity. Harmless: model (echoed), user, safety_identifier, metadata, store, service_tier,
prompt_cache_key, prompt_cache_retention, stream_options.include_obfuscation, and `prediction` (predicted output
only speeds up generation; the reply is what the model samples either way).
Refused (400, naming what): image, audio and file parts (the policy reads text only), audio output; n > 1; log-probs
in the reply; custom and hosted tools (`web_search_options`, tools whose type is not function); the deprecated
`functions` / `function_call` (send `tools` / `tool_choice`).
Not rendered, and why that is harmless: a message's `name` (the chat template has no participant names; OpenHands
sends the tool's name on tool messages, which the call they answer already names) and tool-call ids.
"""

from __future__ import annotations

import time
from typing import Any

from lego.proxy.fields import check_fields, checked, harmless, honoured, option_object, policy, unsupported
from lego.proxy.messages import (
    ChatMessage,
    Conversation,
    RequestError,
    ToolCall,
    arguments_text,
    expect,
    function_tool,
    new_id,
    text_of,
)
from lego.proxy.session import Completion, JsonOutput, ToolChoice

PROTOCOL = "openai_chat"
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool",
         "function": "tool"}
MODULE = "openai_chat"

FIELDS = {
    "model": harmless("echoed in the reply: one policy is served whatever the name"),
    "messages": honoured("rendered with the policy's chat template"),
    "max_tokens": honoured("caps the reply below the configured maximum"),
    "max_completion_tokens": honoured("caps the reply below the configured maximum"),
    "stop": honoured("ends the reply; the session keeps every sampled token"),
    "stream": honoured("SSE chunks as the engine samples"),
    "stream_options": honoured("include_usage adds the usage chunk"),
    "tools": checked("function tools are rendered (strict: their calls follow their schemas); custom and hosted "
                     "tools are refused"),
    "tool_choice": checked("none, auto, required and a named function are honoured"),
    "parallel_tool_calls": honoured("false ends the generation with the first complete tool call"),
    "n": checked("one choice is served"),
    "response_format": checked("text, json_object and json_schema (the engine enforces the schema) are served"),
    "logprobs": checked("false is served; log-probs in the reply are refused"),
    "top_logprobs": checked("0 is served"),
    "modalities": checked("text is served; audio is refused"),
    "audio": checked("audio output: refused"),
    "functions": checked("deprecated: refused (send tools)"),
    "function_call": checked("deprecated: refused (send tool_choice)"),
    "web_search_options": checked("hosted web search: refused"),
    "temperature": policy("the policy's sampling"),
    "top_p": policy("the policy's sampling"),
    "frequency_penalty": policy("the policy's sampling"),
    "presence_penalty": policy("the policy's sampling"),
    "logit_bias": policy("the policy's sampling"),
    "seed": policy("the policy's sampling"),
    "reasoning_effort": policy("how much the policy reasons is its own"),
    "verbosity": policy("how much the policy writes is its own"),
    "prediction": harmless("predicted output only speeds generation up; the reply is what the model samples"),
    "user": harmless("the end user's id, for the provider's abuse tracking"),
    "safety_identifier": harmless("the end user's id, for the provider's abuse tracking"),
    "metadata": harmless("tags for the provider's dashboard"),
    "store": harmless("keeps the completion for the provider's dashboard; nothing reads it back here"),
    "service_tier": harmless("scheduling priority"),
    "prompt_cache_key": harmless("prompt caching: the session reuses a prompt's known tokens anyway"),
    "prompt_cache_retention": harmless("prompt caching: the session reuses a prompt's known tokens anyway"),
}
STREAM_OPTIONS_FIELDS = {
    "include_usage": honoured("adds the usage chunk"),
    "include_obfuscation": harmless("random padding of stream events"),
}


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def parse_tools(raw: Any, param: str = "tools", strict: set[str] | None = None) -> list[dict[str, Any]]:
    """The function tools; `strict`, when given, gets the names of those with `strict: true`."""
    if raw is None:
        return []
    expect(raw, list, param)
    tools = []
    for i, tool in enumerate(raw):
        expect(tool, dict, f"{param}[{i}]")
        kind = tool.get("type", "function")
        if kind != "function":
            raise unsupported(f"{param}[{i}].type", f"is {kind!r}, not a function tool",
                              "send function tools (a JSON schema for the arguments)")
        function = expect(tool.get("function"), dict, f"{param}[{i}].function")
        tools.append(function_tool(function.get("name"), function.get("description"), function.get("parameters"),
                                   f"{param}[{i}].function"))
        if strict is not None and expect(function.get("strict") or False, bool, f"{param}[{i}].function.strict"):
            strict.add(function["name"])
    return tools


def parse_messages(raw: Any, ends: list[int] | None = None) -> list[ChatMessage]:
    expect(raw, list, "messages")
    if not raw:
        raise RequestError("'messages' must not be empty", param="messages")
    return parse_items(raw, ends=ends)


def parse_items(raw: list[Any], start: int = 0, ends: list[int] | None = None) -> list[ChatMessage]:
    """The messages of `raw`, items `start`, `start + 1`, ... of a request's `messages` (each read on its own: a
    resent request's new items are read alone, lego/proxy/resend.py). `ends`, when given, gets how many messages
    there are after each item."""
    messages = []
    for i, item in enumerate(raw, start):
        param = f"messages[{i}]"
        expect(item, dict, param)
        role = ROLES.get(expect(item.get("role"), str, f"{param}.role"))
        if role is None:
            raise RequestError(f"'{param}.role' must be one of {', '.join(ROLES)}", param=f"{param}.role")
        message = ChatMessage(role=role, content=text_of(item.get("content"), f"{param}.content"))
        if item.get("audio") is not None:
            raise unsupported(f"{param}.audio", "is audio", "send the content as text: the policy reads text only")
        if item.get("function_call") is not None:
            raise unsupported(f"{param}.function_call", "is a deprecated function call", "replay it as tool_calls")
        if role == "assistant":
            refusal = item.get("refusal")
            if refusal is not None:  # what the model said when it declined: the model sees it as its text
                refusal = expect(refusal, str, f"{param}.refusal")
                message.content = f"{message.content}\n{refusal}" if message.content else refusal
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
        if ends is not None:
            ends.append(len(messages))
    return messages


NAMED_CHOICE = '{"type": "function", "function": {"name": ...}}'


def parse_tool_choice(raw: Any, tools: list[dict[str, Any]], parallel: bool = True,
                      named_form: str = NAMED_CHOICE) -> tuple[bool, ToolChoice | None]:
    """(whether the reply is read for tool calls, how its tool calls are constrained: None when they are not).
    `named_form`: how the protocol names one function, for the error message (Responses calls in here too)."""
    if raw is None or raw == "auto":
        return bool(tools), None if parallel or not tools else ToolChoice(required=False, parallel=False)
    if raw == "none":
        return False, None
    if raw == "required":
        choice = ToolChoice(parallel=parallel)
    elif isinstance(raw, dict) and raw.get("type") == "function":
        function = expect(raw.get("function"), dict, "tool_choice.function")
        choice = ToolChoice(expect(function.get("name"), str, "tool_choice.function.name"), parallel=parallel)
    else:
        raise RequestError(f"'tool_choice' must be none, auto, required or {named_form} (allowed_tools, hosted and "
                           "custom tools are not supported)", param="tool_choice")
    if not tools:
        raise RequestError("'tool_choice' requires a tool call but the request has no tools", param="tool_choice")
    if choice.name is not None and choice.name not in {tool["function"]["name"] for tool in tools}:
        raise RequestError(f"'tool_choice' names {choice.name!r}, which is not one of the request's tools",
                           param="tool_choice")
    return True, choice


def check_options(body: dict[str, Any]) -> None:
    """Every field known (`FIELDS`), and refused where the proxy cannot do what it asks."""
    check_fields(body, FIELDS, "Chat Completions request", MODULE)
    if body.get("n") not in (None, 1):
        raise unsupported("n", f"asks for {body['n']!r} choices", "ask for one (n: 1) and call again for more")
    if body.get("logprobs") or body.get("top_logprobs"):
        param = "logprobs" if body.get("logprobs") else "top_logprobs"
        raise unsupported(param, "asks for log-probs in the reply", "leave it out: the session records every "
                          "sampled token's log-prob for training")
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise unsupported("modalities", f"is {modalities!r}", "ask for text only: the policy writes text")
    for param, instead in (("audio", "leave it out: the policy writes text"),
                           ("functions", "send them as tools"),
                           ("function_call", "send it as tool_choice"),
                           ("web_search_options", "give the harness a search tool of its own")):
        if body.get(param) is not None:
            raise unsupported(param, "is set", instead)


def parse_request(body: dict[str, Any], ends: list[int] | None = None) -> tuple[Conversation, dict[str, Any]]:
    """The conversation and the options of a request. `ends`, when given, gets how many messages the conversation
    has after each item of the request's `messages` (lego/proxy/resend.py)."""
    check_options(body)
    strict: set[str] = set()
    conversation = Conversation(parse_messages(body.get("messages"), ends), parse_tools(body.get("tools"),
                                                                                        strict=strict))
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        expect(max_tokens, int, "max_tokens")
        if max_tokens < 1:
            raise RequestError("'max_tokens' must be at least 1", param="max_tokens")
    stream = bool(expect(body.get("stream", False), bool, "stream"))
    stream_options = option_object(body, "stream_options", STREAM_OPTIONS_FIELDS, "stream_options", MODULE)
    parallel = body.get("parallel_tool_calls")
    parallel = True if parallel is None else expect(parallel, bool, "parallel_tool_calls")
    parse_tools_flag, tool_choice = parse_tool_choice(body.get("tool_choice"), conversation.tools, parallel)
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
        "parse_tools": parse_tools_flag,
        "tool_choice": tool_choice,
        "strict_tools": frozenset(strict),
        "json_output": json_output(body.get("response_format")),
    }
    return conversation, options


def json_output(response_format: Any) -> JsonOutput | None:
    """The structured output `response_format` asks for (None: text)."""
    if response_format is None:
        return None
    kind = expect(response_format, dict, "response_format").get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return JsonOutput(None, "response_format")
    if kind == "json_schema":
        spec = expect(response_format.get("json_schema"), dict, "response_format.json_schema")
        return JsonOutput.of(spec.get("schema"), "response_format.json_schema.schema")
    raise RequestError(f"'response_format.type' is {kind!r}; it must be text, json_object or json_schema",
                       param="response_format.type")


def _tool_calls(completion: Completion) -> list[dict[str, Any]]:
    return [{"id": new_id("call_"), "type": "function",
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
    return {"id": new_id("chatcmpl-"), "object": "chat.completion", "created": int(time.time()),
            "model": options["model"] or model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": _finish_reason(completion)}],
            "usage": _usage(completion)}
