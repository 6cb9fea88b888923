"""What the model wrote, read the Qwen3 way: `<think>…</think>` reasoning, text, and `<tool_call>` JSON blocks.

A tool call is `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`. A block that is not valid JSON,
lacks a string name, or has arguments that are not an object stays in the text, as written: the harness sees the
malformed call and can tell the model so (never a server error). Arguments keep the model's own JSON text so a
harness that replays them byte-identically replays exactly what was sampled.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from lego.proxy.messages import ChatMessage, ToolCall

TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
ARGUMENTS_KEY = re.compile(r'"arguments"\s*:\s*')


@dataclass
class Reply:
    text: str  # the decoded sampled text (without the final stop token)
    content: str  # what is left for the user: no reasoning, no well-formed tool calls
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)

    def as_message(self) -> ChatMessage:
        """The assistant message this reply becomes in the harness's history (what its key is matched against)."""
        return ChatMessage(role="assistant", content=self.content, tool_calls=list(self.tool_calls),
                           reasoning=self.reasoning)


def split_reasoning(text: str) -> tuple[str | None, str]:
    if "</think>" in text:
        before, after = text.split("</think>", 1)
        return before.split("<think>")[-1].strip("\n"), after.lstrip("\n")
    if text.lstrip().startswith("<think>"):  # cut off while thinking
        return text.lstrip()[len("<think>"):].strip("\n"), ""
    return None, text


def parse_tool_call(body: str) -> ToolCall | None:
    try:
        call = json.loads(body)
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        return None
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict):
        return None
    raw = json.dumps(arguments, ensure_ascii=False)
    found = ARGUMENTS_KEY.search(body)
    if found:
        try:
            value, end = json.JSONDecoder().raw_decode(body, found.end())
        except ValueError:
            value, end = None, 0
        if value == arguments:
            raw = body[found.end():end]
    return ToolCall(name=call["name"], arguments=raw)


def parse_reply(text: str, parse_tools: bool = True) -> Reply:
    reasoning, rest = split_reasoning(text)
    calls: list[ToolCall] = []
    if parse_tools:
        kept: list[str] = []
        position = 0
        for block in TOOL_CALL_BLOCK.finditer(rest):
            call = parse_tool_call(block.group(1).strip())
            if call is None:
                continue  # malformed: stays in the text
            kept.append(rest[position:block.start()])
            position = block.end()
            calls.append(call)
        kept.append(rest[position:])
        rest = "".join(kept)
    return Reply(text=text, content=rest.strip(), reasoning=reasoning, tool_calls=calls)
