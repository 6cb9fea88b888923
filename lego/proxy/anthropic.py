"""Anthropic Messages: request -> Conversation, Completion -> JSON or SSE events.

`system` (a string or text blocks) comes first; `role: system` entries inside `messages` (Claude Code's
mid-conversation system) stay where they are. A user message's `tool_result` blocks become tool turns and its text
blocks a user turn, in block order. `<think>` reasoning comes back as a `thinking` block (empty signature) and
`<tool_call>`s as `tool_use` blocks.

Every request field is listed in `FIELDS` with how it is treated (see lego/proxy/fields.py); an unknown one is
refused (400). Honoured: messages, system, max_tokens, stop_sequences, stream, custom tools, `tool_choice` (`any` or
`tool` forces a tool call, `none` leaves the reply's text unparsed, `disable_parallel_tool_use` ends the generation
with the first complete call: see `Session.complete`), structured output (`output_config.format`, `output_format`: a
JSON schema the reply follows) and strict tools (`strict: true`: every call follows its tool's input schema); a
forced call, structured output and strict tools are constrained decoding, enforced by the engine
(lego/engine/constraints.py; an engine that cannot, or a schema it cannot compile, gets a 400). The policy's own,
whatever the request says: temperature, top_p, top_k, `thinking` (type, budget, display: the policy thinks as its
chat template says, and its reasoning comes back as thinking blocks) and `output_config.effort`. Harmless: model
(echoed), metadata, service_tier, cache_control (the session reuses known tokens anyway); `context_management` edits
that keep every thinking block (Claude Code sends `clear_thinking_20251015` with `keep: all`) are no edit at all.
Refused (400, naming what): image, document, search_result and other non-text blocks (the policy reads text only);
`redacted_thinking` and server-tool blocks in history (this server never wrote them, and the policy cannot read
them); server tools and Anthropic-defined tools (web_search_*, web_fetch_*, code_execution_*, computer_*,
text_editor_*, bash_*, ...: this server runs none, and the policy knows no built-in schema for them; send a custom
tool with an input_schema instead), tools with `defer_loading` or `input_examples` (tool search, examples: neither
of which the proxy does); `container` and `mcp_servers` (server-side execution); any other context edit (it would
change what the model sees in a way the session's token stream does not).
Not rendered, and why that is harmless: a tool result's `is_error` (the chat template has no error flag; the
harness writes what went wrong into the result's text, as Claude Code does with `<tool_use_error>`), thinking
signatures, citations, cache_control markers and block ids.
"""

from __future__ import annotations

import json
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

PROTOCOL = "anthropic_messages"
ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 500: "api_error"}
MODULE = "anthropic"

FIELDS = {
    "model": harmless("echoed in the reply: one policy is served whatever the name"),
    "messages": honoured("rendered with the policy's chat template"),
    "system": honoured("the leading system turn"),
    "max_tokens": honoured("caps the reply below the configured maximum"),
    "stop_sequences": honoured("end the reply; the session keeps every sampled token"),
    "stream": honoured("SSE events as the engine samples"),
    "tools": checked("custom tools are rendered (strict: their calls follow their schemas); server and "
                     "Anthropic-defined tools are refused"),
    "tool_choice": checked("auto, none, any, tool and disable_parallel_tool_use are honoured"),
    "temperature": policy("the policy's sampling"),
    "top_p": policy("the policy's sampling"),
    "top_k": policy("the policy's sampling"),
    "thinking": policy("the policy's thinking mode is its chat template's; its reasoning comes back as thinking"),
    "output_config": checked("effort is the policy's; a format (JSON schema) is enforced by the engine"),
    "output_format": checked("structured output (beta): the engine enforces the JSON schema"),
    "context_management": checked("edits that keep every thinking block are no edit; other edits are refused"),
    "metadata": harmless("user_id for the provider's abuse tracking"),
    "service_tier": harmless("scheduling priority"),
    "cache_control": harmless("automatic prompt caching: the session reuses a prompt's known tokens anyway"),
    "container": checked("server-side code execution container: refused"),
    "mcp_servers": checked("server-side MCP connector: refused when it names servers"),
}
THINKING_FIELDS = {
    "type": policy("enabled, adaptive or disabled: the policy thinks as its chat template says"),
    "budget_tokens": policy("the reply is capped by max_tokens alone"),
    "display": harmless("the thinking text is returned either way; clients replay what they got"),
}
OUTPUT_CONFIG_FIELDS = {
    "effort": policy("how much the policy reasons is its own"),
    "format": checked("structured output: a JSON schema, enforced by the engine"),
}
CONTEXT_MANAGEMENT_FIELDS = {"edits": checked("only edits that keep every thinking block")}
# Tools whose type is not `custom`: run by the server (web search, code execution, ...) or defined by Anthropic
# with a schema the policy was never shown (computer, text editor, bash, memory).
SERVER_TOOL_HINT = "send a custom tool (name, description, input_schema) that the harness runs itself"


def error_body(message: str, status: int) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


def _blocks(content: Any, param: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    expect(content, list, param)
    for i, block in enumerate(content):
        expect(block, dict, f"{param}[{i}]")
    return content


def parse_messages(raw: Any, system: Any, ends: list[int] | None = None) -> list[ChatMessage]:
    messages: list[ChatMessage] = []
    if system is not None and system != "" and system != []:
        messages.append(ChatMessage(role="system", content=text_of(system, "system")))
    expect(raw, list, "messages")
    if not raw:
        raise RequestError("'messages' must not be empty", param="messages")
    messages.extend(parse_items(raw, ends=ends))
    return messages


def parse_items(raw: list[Any], start: int = 0, ends: list[int] | None = None) -> list[ChatMessage]:
    """The messages of `raw`, items `start`, `start + 1`, ... of a request's `messages` (each read on its own: a
    resent request's new items are read alone, lego/proxy/resend.py). A user item may become several messages.
    `ends`, when given, gets how many messages there are after each item."""
    messages: list[ChatMessage] = []
    for i, item in enumerate(raw, start):
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
                else:
                    # redacted_thinking, server_tool_use, web_search_tool_result, ...: this server never wrote them,
                    # and dropping them would show the model a history without what it saw then
                    raise RequestError(f"'{param}.content[{j}]' is a {kind!r} block, which this server does not "
                                       "support in an assistant turn (it never writes one, and the policy cannot "
                                       "read it); replay the text, thinking and tool_use blocks it answered",
                                       param=f"{param}.content[{j}]")
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
        if ends is not None:
            ends.append(len(messages))
    return messages


def parse_tools(raw: Any, strict: set[str] | None = None) -> list[dict[str, Any]]:
    """The custom tools; `strict`, when given, gets the names of those with `strict: true`."""
    if raw is None:
        return []
    expect(raw, list, "tools")
    tools = []
    for i, tool in enumerate(raw):
        param = f"tools[{i}]"
        expect(tool, dict, param)
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise unsupported(f"{param}.type", f"is {kind!r}, a server or Anthropic-defined tool", SERVER_TOOL_HINT)
        if tool.get("defer_loading"):
            raise unsupported(f"{param}.defer_loading", "asks for tool search",
                              "send only the tools the model may call, without defer_loading")
        if tool.get("input_examples"):
            raise unsupported(f"{param}.input_examples", "holds examples the chat template cannot show",
                              "put the examples in the tool's description")
        tools.append(function_tool(tool.get("name"), tool.get("description"), tool.get("input_schema"), param))
        if strict is not None and expect(tool.get("strict") or False, bool, f"{param}.strict"):
            strict.add(tool["name"])
    return tools


def parse_tool_choice(raw: Any, tools: list[dict[str, Any]]) -> tuple[bool, ToolChoice | None]:
    """(whether the reply is read for tool calls, how its tool calls are constrained: None when they are not)."""
    if raw is None:
        return bool(tools), None
    expect(raw, dict, "tool_choice")
    kind = raw.get("type")
    if kind == "none":
        return False, None
    if kind not in ("auto", "any", "tool"):
        raise RequestError("'tool_choice.type' must be auto, any, tool or none", param="tool_choice.type")
    parallel = not expect(raw.get("disable_parallel_tool_use") or False, bool, "tool_choice.disable_parallel_tool_use")
    if kind == "auto":
        return bool(tools), None if parallel or not tools else ToolChoice(required=False, parallel=False)
    if not tools:
        raise RequestError(f"'tool_choice' is {kind} but the request has no tools", param="tool_choice")
    if kind == "any":
        return True, ToolChoice(parallel=parallel)
    name = expect(raw.get("name"), str, "tool_choice.name")
    if name not in {tool["function"]["name"] for tool in tools}:
        raise RequestError(f"'tool_choice.name' is {name!r}, which is not one of the request's tools",
                           param="tool_choice.name")
    return True, ToolChoice(name, parallel=parallel)


def check_options(body: dict[str, Any]) -> None:
    """Every field known (`FIELDS`), and refused where the proxy cannot do what it asks."""
    check_fields(body, FIELDS, "Messages request", MODULE)
    thinking = option_object(body, "thinking", THINKING_FIELDS, "thinking", MODULE)
    if thinking.get("type", "enabled") not in ("enabled", "adaptive", "disabled"):
        raise RequestError("'thinking.type' must be enabled, adaptive or disabled", param="thinking.type")
    option_object(body, "output_config", OUTPUT_CONFIG_FIELDS, "output_config", MODULE)
    edits = option_object(body, "context_management", CONTEXT_MANAGEMENT_FIELDS, "context_management",
                          MODULE).get("edits") or []
    expect(edits, list, "context_management.edits")
    for i, edit in enumerate(edits):
        expect(edit, dict, f"context_management.edits[{i}]")
        if edit.get("type") != "clear_thinking_20251015" or edit.get("keep", "all") != "all":
            raise unsupported(f"context_management.edits[{i}]", f"asks the server to clear context "
                              f"({json.dumps(edit)})", "send the history the model should see; only "
                              "clear_thinking_20251015 with keep 'all' (no edit) is accepted")
    if body.get("container") is not None:
        raise unsupported("container", "asks for a server-side code execution container",
                          "run code with the harness's own tools")
    if body.get("mcp_servers"):
        raise unsupported("mcp_servers", "asks the server to connect to MCP servers",
                          "have the harness call them and send their tools as custom tools")


def parse_request(body: dict[str, Any], ends: list[int] | None = None) -> tuple[Conversation, dict[str, Any]]:
    """The conversation and the options of a request. `ends`, when given, gets how many messages the conversation
    has after each item of the request's `messages`, not counting the `system` message (lego/proxy/resend.py)."""
    check_options(body)
    strict: set[str] = set()
    conversation = Conversation(parse_messages(body.get("messages"), body.get("system"), ends),
                                parse_tools(body.get("tools"), strict))
    max_tokens = body.get("max_tokens")
    if max_tokens is not None:
        expect(max_tokens, int, "max_tokens")
        if max_tokens < 1:
            raise RequestError("'max_tokens' must be at least 1", param="max_tokens")
    parse_tools_flag, tool_choice = parse_tool_choice(body.get("tool_choice"), conversation.tools)
    stop_sequences = body.get("stop_sequences") or []
    if not isinstance(stop_sequences, list) or not all(isinstance(item, str) for item in stop_sequences):
        raise RequestError("'stop_sequences' must be a list of strings", param="stop_sequences")
    options = {
        "model": str(body.get("model") or ""),
        "stream": bool(expect(body.get("stream", False), bool, "stream")),
        "max_tokens": max_tokens,
        "stop": tuple(item for item in stop_sequences if item),
        "parse_tools": parse_tools_flag,
        "tool_choice": tool_choice,
        "strict_tools": frozenset(strict),
        "json_output": json_output(body),
    }
    return conversation, options


def json_output(body: dict[str, Any]) -> JsonOutput | None:
    """The structured output the request asks for (`output_config.format`, or the beta `output_format`)."""
    config = body.get("output_config") or {}
    for param, value in (("output_config.format", config.get("format")), ("output_format", body.get("output_format"))):
        if value is None:
            continue
        if expect(value, dict, param).get("type") != "json_schema":
            raise RequestError(f"'{param}.type' must be json_schema", param=f"{param}.type")
        return JsonOutput.of(value.get("schema"), f"{param}.schema")
    return None


def _content(completion: Completion) -> list[dict[str, Any]]:
    reply = completion.reply
    blocks: list[dict[str, Any]] = []
    if reply.reasoning:
        blocks.append({"type": "thinking", "thinking": reply.reasoning, "signature": ""})
    if reply.content or not reply.tool_calls:
        blocks.append({"type": "text", "text": reply.content})
    for call in reply.tool_calls:
        blocks.append({"type": "tool_use", "id": new_id("toolu_"), "name": call.name,
                       "input": json.loads(call.arguments)})
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
    return {"id": new_id("msg_"), "type": "message", "role": "assistant",
            "model": options["model"] or model, "content": _content(completion),
            "stop_reason": _stop_reason(completion), "stop_sequence": completion.stop_sequence, "usage": _usage(completion, completion.completion_tokens)}
