"""OpenAI Responses (Codex): request -> Conversation, Completion -> JSON or the SSE event sequence Codex needs.

Input items: `message` (developer -> system), `function_call`, `function_call_output`, `reasoning`; consecutive
assistant-side items (reasoning, assistant message, function calls) form one assistant turn. Tools: `function`
tools are kept; a `namespace` tool's function tools are listed with the rest, each naming its namespace (and the
namespace's description) in its definition, and a call to one names its namespace in the reply. The stream always
ends with `response.completed` (Codex retries a stream without it), also for a reply cut off by max_output_tokens
(its tokens are recorded with finish reason `length`).

Every request field is listed in `FIELDS` with how it is treated (see lego/proxy/fields.py); an unknown one is
refused (400, code `unknown_parameter`). Honoured: input, instructions, max_output_tokens, stream, function and
namespace tools, `tool_choice` (`required` or a named function forces a tool call, `none` leaves the reply's text
unparsed) and `parallel_tool_calls: false` (the generation ends with the first complete tool call; see
`Session.complete`), structured output (`text.format` json_schema or json_object) and strict tools (`strict: true`),
enforced by the engine as constrained decoding (lego/engine/constraints.py; an engine that cannot, or a schema it
cannot compile, gets a 400); an assistant's `refusal` part in replayed history is rendered as its text. The policy's own,
whatever the request says: temperature, top_p, reasoning.effort and text.verbosity. Harmless: model (echoed), store
(this server keeps nothing, and refuses what would need it), include (`reasoning.encrypted_content`: reasoning comes
back as its summary text, which Codex replays), reasoning.summary, metadata, user, safety_identifier,
prompt_cache_key, prompt_cache_retention, service_tier, client_metadata (Codex's turn bookkeeping), max_tool_calls
(it counts hosted tool calls, and none are run), `truncation` (an overlong prompt is answered with the
context-length error either way, never cut silently), stream_options.include_obfuscation.
Codex's `web_search` tool (`{"type": "web_search", "external_web_access": ...}`, on every call) is not offered to the
model, and why that is harmless: it is a hosted tool, which the server runs when the model calls it, and this
server runs no web search; refusing it would stop Codex, which sends it by default. So the request is served as a
server without web search serves it: the model's prompt lists the function tools only (exactly the tokens the
session records, so training sees what the model saw) and no call to it can be sampled; Codex needs nothing back for
it (it only shows `web_search_call` items a server streams). The reply's `tools` is empty.
Refused (400, naming what): server-side state (`previous_response_id`, `conversation`, `prompt`, `item_reference`
items, encrypted reasoning: the model would answer without the history they stand for; this server keeps no
responses: send the whole input, as Codex does with `store: false`), `background`; image, audio and file parts (the
policy reads text only); other hosted and custom tools (file_search, computer_use_preview, code_interpreter,
image_generation, mcp, local_shell, shell, apply_patch, custom) and the items they leave in history (this server
never wrote them); log-probs in the reply (`top_logprobs`, include `message.output_text.logprobs`).
Not read, and why that is harmless: item ids and status, output_text annotations, a function call's `namespace`
(the call's name is what the model wrote; the namespace is the request's tool list's).
"""

from __future__ import annotations

import time
from typing import Any

from lego.proxy import openai_chat
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

PROTOCOL = "openai_responses"
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MODULE = "responses"

FIELDS = {
    "model": harmless("echoed in the reply: one policy is served whatever the name"),
    "input": honoured("rendered with the policy's chat template"),
    "instructions": honoured("the leading system turn"),
    "max_output_tokens": honoured("caps the reply below the configured maximum"),
    "stream": honoured("the SSE event sequence as the engine samples"),
    "stream_options": harmless("include_obfuscation: random padding of stream events"),
    "tools": checked("function and namespace tools are rendered (strict: their calls follow their schemas); "
                     "web_search is not offered; other hosted and custom tools are refused"),
    "tool_choice": checked("none, auto, required and a named function are honoured"),
    "parallel_tool_calls": honoured("false ends the generation with the first complete tool call"),
    "text": checked("verbosity is the policy's; a json_schema or json_object format is enforced by the engine"),
    "reasoning": policy("effort is the policy's; its reasoning comes back as the summary"),
    "include": checked("reasoning.encrypted_content and hosted-tool outputs add nothing here; log-probs are refused"),
    "temperature": policy("the policy's sampling"),
    "top_p": policy("the policy's sampling"),
    "top_logprobs": checked("0 is served; log-probs in the reply are refused"),
    "truncation": harmless("an overlong prompt is answered with the context-length error, never cut"),
    "max_tool_calls": harmless("counts hosted tool calls, and none are run"),
    "store": harmless("this server keeps no responses, and refuses what would read them back"),
    "previous_response_id": checked("server-side state: refused"),
    "conversation": checked("server-side state: refused"),
    "prompt": checked("a stored prompt template: refused"),
    "background": checked("false is served; background responses are refused"),
    "metadata": harmless("tags for the provider's dashboard"),
    "user": harmless("the end user's id, for the provider's abuse tracking"),
    "safety_identifier": harmless("the end user's id, for the provider's abuse tracking"),
    "client_metadata": harmless("Codex's turn bookkeeping"),
    "service_tier": harmless("scheduling priority"),
    "prompt_cache_key": harmless("prompt caching: the session reuses a prompt's known tokens anyway"),
    "prompt_cache_retention": harmless("prompt caching: the session reuses a prompt's known tokens anyway"),
}
TEXT_FIELDS = {
    "format": checked("text, json_object and json_schema (the engine enforces the schema) are served"),
    "verbosity": policy("how much the policy writes is its own"),
}
REASONING_FIELDS = {
    "effort": policy("how much the policy reasons is its own"),
    "summary": harmless("the reasoning comes back whole as the summary"),
    "generate_summary": harmless("the reasoning comes back whole as the summary"),
}
STREAM_OPTIONS_FIELDS = {"include_obfuscation": harmless("random padding of stream events")}
# `include` values that add nothing to what this server returns: encrypted reasoning (it returns the reasoning as
# its summary) and outputs of hosted tools and input images (refused before they could be included).
HARMLESS_INCLUDES = {"reasoning.encrypted_content", "web_search_call.action.sources", "web_search_call.results",
                     "file_search_call.results", "code_interpreter_call.outputs",
                     "computer_call_output.output.image_url", "message.input_image.image_url"}
# Hosted web search (Codex sends it on every call): not offered to the model (see the module docstring).
WEB_SEARCH_TOOLS = {"web_search", "web_search_preview", "web_search_preview_2025_03_11", "web_search_2025_08_26"}


def parse_tools(raw: Any, param: str = "tools", namespaces: dict[str, str] | None = None,
                namespace: dict[str, str] | None = None, strict: set[str] | None = None) -> list[dict[str, Any]]:
    """Function tools, a namespace's flattened in (each naming its `namespace`: name and description);
    `namespaces` gets each such tool's namespace name by tool name, `strict` the names of those with
    `strict: true`."""
    if raw is None:
        return []
    expect(raw, list, param)
    tools = []
    for i, tool in enumerate(raw):
        expect(tool, dict, f"{param}[{i}]")
        kind = tool.get("type")
        if kind == "function":
            definition = function_tool(tool.get("name"), tool.get("description"), tool.get("parameters"),
                                       f"{param}[{i}]")
            if namespace is not None:
                # the namespace is part of the tool's definition: the model sees which group it belongs to
                definition["function"]["namespace"] = namespace
                if namespaces is not None:
                    namespaces[tool["name"]] = namespace["name"]
            tools.append(definition)
            if strict is not None and expect(tool.get("strict") or False, bool, f"{param}[{i}].strict"):
                strict.add(tool["name"])
        elif kind == "namespace":
            group = {"name": expect(tool.get("name"), str, f"{param}[{i}].name")}
            if tool.get("description") is not None:
                group["description"] = expect(tool["description"], str, f"{param}[{i}].description")
            tools.extend(parse_tools(expect(tool.get("tools"), list, f"{param}[{i}].tools"), f"{param}[{i}].tools",
                                     namespaces, group, strict))
        elif kind in WEB_SEARCH_TOOLS and namespace is None:
            continue  # not offered: this server runs no web search (see the module docstring)
        else:
            raise unsupported(f"{param}[{i}].type", f"is {kind!r}, a hosted or custom tool",
                              "send function tools that the harness runs itself")
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
            if item.get("encrypted_content"):
                raise unsupported(f"{param}.encrypted_content", "is encrypted reasoning (this server never returns "
                                  "it, and the policy cannot read it)", "replay the reasoning items this server "
                                  "returned (their summary is the reasoning's text)")
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
        elif kind == "item_reference":
            raise unsupported(param, "is an item_reference (an item stored on the server)",
                              "this server keeps no items: send the item itself")
        else:
            # web_search_call, computer_call, custom_tool_call, compaction, ...: items of tools or server features
            # this server does not run, so it never wrote them; dropping one would show the model a history
            # without what it saw then
            raise unsupported(param, f"is a {kind!r} item", "replay the message, reasoning, function_call and "
                              "function_call_output items this server answered with")
    return messages


def parse_tool_choice(raw: Any, tools: list[dict[str, Any]],
                      parallel: bool = True) -> tuple[bool, ToolChoice | None]:
    """As Chat Completions' (openai_chat.parse_tool_choice), where Responses names a function at the top level:
    {"type": "function", "name": ...}."""
    if isinstance(raw, dict) and raw.get("type") == "function":
        raw = {"type": "function", "function": {"name": expect(raw.get("name"), str, "tool_choice.name")}}
    return openai_chat.parse_tool_choice(raw, tools, parallel, named_form='{"type": "function", "name": ...}')


def check_options(body: dict[str, Any]) -> None:
    """Every field known (`FIELDS`), and refused where the proxy cannot do what it asks."""
    check_fields(body, FIELDS, "Responses request", MODULE)
    for state in ("previous_response_id", "conversation", "prompt"):
        if body.get(state) is not None:
            raise RequestError(f"'{state}' is not supported: this server keeps no responses, conversations or "
                               "prompts, so the model would not see what it stands for; send the whole "
                               "conversation in 'input' (with store: false)", param=state, code="unsupported_parameter")
    if body.get("background"):
        raise unsupported("background", "asks for a background response", "wait for the answer (stream it to see "
                          "it as it is written)")
    option_object(body, "text", TEXT_FIELDS, "text", MODULE)
    option_object(body, "reasoning", REASONING_FIELDS, "reasoning", MODULE)
    option_object(body, "stream_options", STREAM_OPTIONS_FIELDS, "stream_options", MODULE)
    if body.get("top_logprobs"):
        raise unsupported("top_logprobs", "asks for log-probs in the reply", "leave it out: the session records "
                          "every sampled token's log-prob for training")
    for value in expect(body.get("include") or [], list, "include"):
        if value not in HARMLESS_INCLUDES:
            raise unsupported("include", f"asks for {value!r}", "leave it out: this server returns the reply's "
                              "text, reasoning and function calls only")


def parse_request(body: dict[str, Any]) -> tuple[Conversation, dict[str, Any]]:
    check_options(body)
    namespaces: dict[str, str] = {}
    strict: set[str] = set()
    conversation = Conversation(parse_input(body.get("input"), body.get("instructions")),
                                parse_tools(body.get("tools"), namespaces=namespaces, strict=strict))
    parallel = body.get("parallel_tool_calls")
    parallel = True if parallel is None else expect(parallel, bool, "parallel_tool_calls")
    parse_tools_flag, tool_choice = parse_tool_choice(body.get("tool_choice"), conversation.tools, parallel)
    max_tokens = body.get("max_output_tokens")
    if max_tokens is not None:
        expect(max_tokens, int, "max_output_tokens")
        if max_tokens < 1:
            raise RequestError("'max_output_tokens' must be at least 1", param="max_output_tokens")
    options = {
        "model": str(body.get("model") or ""),
        "stream": bool(expect(body.get("stream", False), bool, "stream")),
        "max_tokens": max_tokens,
        "parse_tools": parse_tools_flag,
        "tool_choice": tool_choice,
        "namespaces": namespaces,
        "strict_tools": frozenset(strict),
        "json_output": json_output((body.get("text") or {}).get("format")),
    }
    return conversation, options


def json_output(fmt: Any) -> JsonOutput | None:
    """The structured output `text.format` asks for (None: text)."""
    if fmt is None:
        return None
    kind = expect(fmt, dict, "text.format").get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return JsonOutput(None, "text.format")
    if kind == "json_schema":
        return JsonOutput.of(fmt.get("schema"), "text.format.schema")
    raise RequestError(f"'text.format.type' is {kind!r}; it must be text, json_object or json_schema",
                       param="text.format.type")


def output_items(completion: Completion, namespaces: dict[str, str] | None = None) -> list[dict[str, Any]]:
    reply = completion.reply
    items: list[dict[str, Any]] = []
    if reply.reasoning:
        items.append({"type": "reasoning", "id": new_id("rs_"),
                      "summary": [{"type": "summary_text", "text": reply.reasoning}]})
    if reply.content or not reply.tool_calls:
        items.append({"type": "message", "id": new_id("msg_"), "status": "completed",
                      "role": "assistant",
                      "content": [{"type": "output_text", "text": reply.content, "annotations": []}]})
    for call in reply.tool_calls:
        items.append(function_call_item(call, namespaces))
    return items


def function_call_item(call: ToolCall, namespaces: dict[str, str] | None = None) -> dict[str, Any]:
    """The output item of one tool call (a streamed reply sends each as it is written)."""
    item = {"type": "function_call", "id": new_id("fc_"), "call_id": new_id("call_"),
            "name": call.name, "arguments": call.arguments, "status": "completed"}
    if namespaces and call.name in namespaces:
        # A namespace's tool is called with its namespace named, or the client cannot route the call
        # (Codex answers "unsupported call" to a bare `spawn_agent`).
        item["namespace"] = namespaces[call.name]
    return item


def _usage(completion: Completion) -> dict[str, Any]:
    return {"input_tokens": completion.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": completion.prompt_tokens + completion.completion_tokens}


def response_body(completion: Completion, options: dict[str, Any], model: str,
                  items: list[dict[str, Any]] | None = None, response_id: str | None = None) -> dict[str, Any]:
    return {"id": response_id or new_id("resp_"), "object": "response",
            "created_at": int(time.time()), "status": "completed", "model": options["model"] or model,
            "output": output_items(completion, options.get("namespaces")) if items is None else items,
            "parallel_tool_calls": options.get("tool_choice") is None or options["tool_choice"].parallel,
            "tool_choice": "auto", "tools": [], "usage": _usage(completion)}


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
