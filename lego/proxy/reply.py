"""What the model wrote, read the Qwen3 way: `<think>…</think>` reasoning, text, and `<tool_call>` JSON blocks;
read whole or as it is written.

A tool call is `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`. A block that is not valid JSON,
lacks a string name, or has arguments that are not an object stays in the text, as written: the harness sees the
malformed call and can tell the model so (never a server error). Arguments keep the model's own JSON text so a
harness that replays them byte-identically replays exactly what was sampled.

The reply is read by one reader, `ReplyReader`, fed the text as it grows; reading a whole text is feeding it in one
piece, so a streamed reply and the same reply sent whole are the same reply. The reader only hands on what no later
text can change:
- Reasoning: a reply that opens with `<think>` (after whitespace), or any reply when the generation prompt already
  opened the think block, reasons until the first `</think>`; the reasoning is that text without its leading and
  trailing newlines. Text that does not open with `<think>` is content, whatever follows (a later `</think>` too).
- Content: the rest without its well-formed tool-call blocks, without leading and trailing whitespace. Whitespace is
  held until text follows it, and text that may still become `<tool_call>` or `</think>` until it cannot.
- Tool calls: each block as its `</tool_call>` arrives (a call's arguments are only known whole).
`StreamDecoder` turns sampled token ids into that text as they come: whole characters only, never the end-of-turn
token, and never text that may be the start of a stop string.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from lego.proxy.jsonio import loads
from lego.proxy.messages import ChatMessage, ToolCall

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
ARGUMENTS_KEY = re.compile(r'"arguments"\s*:\s*')
_DECODER = json.JSONDecoder()  # json.loads's own settings; raw_decode keeps no state between calls


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


@dataclass(slots=True)
class ReplyEvent:
    """A piece of a reply, in the order it was written: reasoning text, content text, or a whole tool call."""

    kind: str  # reasoning | content | tool_call
    text: str = ""
    call: ToolCall | None = None


def parse_tool_call(body: str) -> ToolCall | None:
    try:
        call = loads(body)
    except ValueError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        return None
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict):
        return None
    found = ARGUMENTS_KEY.search(body)
    if found:
        start = found.end()
        # The arguments' own text: usually they are the call's last member, so their text runs to the closing
        # brace; else it is the JSON value that starts after the key.
        if body.endswith("}"):
            text = body[start:-1].rstrip()
            try:
                if loads(text) == arguments:
                    return ToolCall(name=call["name"], arguments=text)
            except ValueError:
                pass
        try:
            value, end = _DECODER.raw_decode(body, start)
        except ValueError:
            value, end = None, 0
        if value == arguments:
            return ToolCall(name=call["name"], arguments=body[start:end])
    return ToolCall(name=call["name"], arguments=json.dumps(arguments, ensure_ascii=False))


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper beginning of `marker` (it may still become it)."""
    # Such an end starts with the marker's first character, within its length minus one of the text's end: found
    # with `find` (a text rarely holds that character there), not by trying every length.
    first = marker[0]
    start = text.find(first, max(0, len(text) - len(marker) + 1))
    while start >= 0:
        if marker.startswith(text[start:]):
            return len(text) - start
        start = text.find(first, start + 1)
    return 0


class ReplyReader:
    """Reads a reply as it is written (see the module docstring): `feed` the text as it grows, then `finish`."""

    def __init__(self, parse_tools: bool = True, thinking: bool = False) -> None:
        """`thinking`: the generation prompt already opened a think block (the reply starts inside it)."""
        self.parse_tools, self.thinking = parse_tools, thinking
        self._mode = "reasoning" if thinking else "start"  # start | reasoning | content | call
        self._pending = ""  # text read but not handed on yet
        self._fed = 0  # characters read so far
        self._reasoned = thinking  # a think block was opened
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._space = ""  # whitespace after the content handed on: handed on only when text follows it
        self._calls: list[ToolCall] = []
        self._finished: Reply | None = None

    def feed(self, text: str) -> list[ReplyEvent]:
        if self._finished is not None:
            raise ValueError("the reply is finished; a ReplyReader reads one reply")
        self._fed += len(text)
        self._pending += text
        events: list[ReplyEvent] = []
        self._advance(events, final=False)
        return events

    def finish(self, text: str) -> tuple[list[ReplyEvent], Reply]:
        """Read the whole reply `text` (what was fed plus the rest of it) to its end: the last events and the reply."""
        if self._finished is not None:
            raise ValueError("the reply is finished; a ReplyReader reads one reply")
        events = self.feed(text[self._fed:]) if len(text) > self._fed else []
        self._advance(events, final=True)
        reasoning = "".join(self._reasoning) if self._reasoned else None
        self._finished = Reply(text=text, content="".join(self._content), reasoning=reasoning,
                               tool_calls=list(self._calls))
        return events, self._finished

    def read(self) -> int:
        """How many characters of the reply were read so far (a finished reply's text starts with them)."""
        return self._fed

    # ------------------------------------------------------------------------------------------ the states

    def _advance(self, events: list[ReplyEvent], final: bool) -> None:
        while True:
            mode = self._mode
            if mode == "start":
                head = self._pending.lstrip()
                if not final and (not head or THINK_OPEN.startswith(head)) and head != THINK_OPEN:
                    return  # whitespace so far, or the beginning of "<think>": undecided
                if head.startswith(THINK_OPEN):
                    self._mode, self._reasoned, self._pending = "reasoning", True, head[len(THINK_OPEN):]
                else:
                    self._mode = "content"
            elif mode == "reasoning":
                end = self._pending.find(THINK_CLOSE)
                if end >= 0:
                    self._reason(self._pending[:end], closing=True, events=events)
                    self._mode, self._pending = "content", self._pending[end + len(THINK_CLOSE):]
                    continue
                if final:
                    self._reason(self._pending, closing=True, events=events)
                    self._pending = ""
                    return
                hold = _partial_suffix(self._pending, THINK_CLOSE)
                body = self._pending[: len(self._pending) - hold]
                kept = body.rstrip("\n")  # newlines right before "</think>" are not part of the reasoning
                self._reason(kept, closing=False, events=events)
                self._pending = self._pending[len(kept):]
                return
            elif mode == "content":
                start = self._pending.find(CALL_OPEN) if self.parse_tools else -1
                if start >= 0:
                    self._say(self._pending[:start], events)
                    self._mode, self._pending = "call", self._pending[start + len(CALL_OPEN):]
                    continue
                hold = 0 if final or not self.parse_tools else _partial_suffix(self._pending, CALL_OPEN)
                self._say(self._pending[: len(self._pending) - hold], events)
                self._pending = self._pending[len(self._pending) - hold:]
                return
            else:  # inside a tool-call block
                end = self._pending.find(CALL_CLOSE)
                if end < 0:
                    if final:  # never closed: it is text, as written
                        self._say(CALL_OPEN + self._pending, events)
                        self._pending = ""
                    return
                body = self._pending[:end]
                call = parse_tool_call(body.strip())
                if call is None:  # malformed: stays in the text
                    self._say(CALL_OPEN + body + CALL_CLOSE, events)
                else:
                    self._calls.append(call)
                    events.append(ReplyEvent("tool_call", call=call))
                self._mode, self._pending = "content", self._pending[end + len(CALL_CLOSE):]

    def _reason(self, text: str, closing: bool, events: list[ReplyEvent]) -> None:
        if not self._reasoning:
            text = text.lstrip("\n")
        if closing:
            text = text.rstrip("\n")
        if text:
            self._reasoning.append(text)
            events.append(ReplyEvent("reasoning", text))

    def _say(self, text: str, events: list[ReplyEvent]) -> None:
        if not self._content and not self._space:
            text = text.lstrip()
        text = self._space + text
        kept = text.rstrip()
        self._space = text[len(kept):]
        if kept:
            self._content.append(kept)
            events.append(ReplyEvent("content", kept))


def parse_reply(text: str, parse_tools: bool = True, thinking: bool = False) -> Reply:
    """The reply `text` read whole (the same reply a streamed read of it gives)."""
    return ReplyReader(parse_tools, thinking).finish(text)[1]


class StreamDecoder:
    """Sampled token ids to reply text as they come (see the module docstring). `decode` is the tokenizer's;
    `concatenates`: its text of a sequence is the text of its tokens one after the other, but for characters
    split between tokens (byte-level BPE), so new tokens are decoded alone."""

    def __init__(self, decode: Callable[[list[int]], str], end_ids: tuple[int, ...] = (),
                 stops: tuple[str, ...] = (), concatenates: bool = False) -> None:
        self.decode = decode
        self.end_ids = frozenset(end_ids)
        self.stops = tuple(stop for stop in stops if stop)
        self.concatenates = concatenates
        self._ids: list[int] = []
        self._prefix = 0  # decoding starts a few tokens back, so a token's text reads as it does in context
        self._read = 0  # tokens whose text is in self.text
        self.text = ""
        self._given = 0  # characters of self.text handed on

    def feed(self, ids: list[int]) -> str:
        """The new text that is safe to show, after the tokens `ids`."""
        # The engine stops on an end-of-turn token, so one is always the last: it is not part of the reply's text.
        self._ids.extend(token for token in ids if token not in self.end_ids)
        if self.concatenates:
            # An unfinished character decodes to a trailing U+FFFD: wait for the tokens that finish it.
            piece = self.decode(self._ids[self._read:])
            if piece and not piece.endswith("\ufffd"):
                self.text += piece
                self._read = len(self._ids)
            return self._give()
        before = self.decode(self._ids[self._prefix:self._read])
        after = self.decode(self._ids[self._prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):  # a whole character or more
            self.text += after[len(before):]
            self._prefix, self._read = self._read, len(self._ids)
        return self._give()

    def _give(self) -> str:
        safe = len(self.text)
        for stop in self.stops:
            # An occurrence ending inside the text already handed on would have stopped it there: look after it.
            found = self.text.find(stop, max(0, self._given - len(stop) + 1))
            end = found if found >= 0 else len(self.text) - _partial_suffix(self.text, stop)
            safe = min(safe, end)
        piece = self.text[self._given:safe] if safe > self._given else ""
        self._given += len(piece)
        return piece
