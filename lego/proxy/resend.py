"""A harness resends its whole history on every call: only the bytes that are new are parsed.

Parsing a Claude-Code-sized request (80 KB: system prompt, tools, history) and validating every message of it costs
more than the rest of a later turn. But a harness resends the history it sent before byte for byte, and puts the
new messages at the end of its `messages` array. So a session keeps its last few requests' raw bytes beside what
they parsed to, and where in those bytes each item of `messages` starts (`Layout`, found by a scan that skips JSON
strings whole). A new request that is one of them with its first `k` items unchanged and other items after them:

    new == old[: start of item k] + ITEMS + old[closing bracket of messages :]

(for `k` = all of them, `old[: end of the last item] + "," + ITEMS`) differs from it only in those items: every
other field is the same bytes, so it parses to the same options and tools, and the first `k` items to the same
messages. Only ITEMS is parsed (`[` + ITEMS + `]` must be a JSON array of at least one item: that also proves the
bytes around them still close the array) and validated by the protocol's own item parser. Anything else (a changed
field, an edited or reordered message, bytes that do not parse, a protocol without an item parser) takes the full
path, so what is recorded never depends on the shortcut: the conversation it gives is equal to the full parse's
(`tests/test_proxy_resend.py` checks both on the same requests). The kept messages are the previous conversation's
own objects, whose match keys are already computed; its tools list, tools key and agent signature are carried over.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from lego.proxy.jsonio import loads
from lego.proxy.messages import Conversation, RequestError

KEPT_REQUESTS = 3  # a session's recent requests (its main agent's and a sub-agent's or two) compared with a new one
REWRITTEN_ITEMS = 2  # how many trailing items a harness may rewrite (e.g. a moved cache marker) and still match
# A JSON string (escapes included) or a bracket: everything the scan needs to follow the nesting.
_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
_MESSAGES_KEY = b'"messages"'
_WHITESPACE = b" \t\r\n"


@dataclass
class Layout:
    """Where the items of a request's top-level `messages` array lie in its bytes."""

    starts: tuple[int, ...]  # the offset of each item's first byte, for the items before the pending ones
    last_end: int  # the offset just past the last item
    close: int  # the offset of the array's closing bracket
    count: int = -1  # how many items (-1: len(starts))
    # Byte ranges holding the last items, not scanned yet: only a request that rewrites one of them needs their
    # starts. The same ranges in every later request that keeps them (its bytes up to them are the same).
    pending: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.count < 0:
            self.count = len(self.starts)

    def start(self, raw: bytes, item: int) -> int:
        """The offset of item `item`'s first byte in `raw` (the request this layout is of)."""
        if item >= len(self.starts):
            starts = list(self.starts)
            for begin, end in self.pending:
                wrapped = messages_layout(b'{"messages":[' + raw[begin:end] + b"]}")
                if wrapped is None:
                    raise AssertionError("the items parsed as a JSON array of objects")  # pragma: no cover
                starts.extend(begin - len(b'{"messages":[') + start for start in wrapped.starts)
            if len(starts) != self.count:
                raise AssertionError("every item's start was found")  # pragma: no cover
            self.starts, self.pending = tuple(starts), ()
        return self.starts[item]


def messages_layout(raw: bytes) -> Layout | None:
    """The layout of `raw`'s top-level `messages` array, or None when it has no such array of objects (or two
    `messages` keys: which one a parser keeps is its own business)."""
    depth = 0
    array_depth = -1  # the nesting inside the messages array while the scan is in it
    key_end = -1  # just past a top-level "messages" key whose value is next
    starts: list[int] = []
    found: Layout | None = None
    for match in _TOKENS.finditer(raw):
        position = match.start()
        char = raw[position]
        if char == 0x22:  # a string: a key at the top level may be "messages"
            if depth == 1 and match.end() - position == len(_MESSAGES_KEY) and raw.startswith(_MESSAGES_KEY, position):
                if found is not None or array_depth != -1:
                    return None
                key_end = match.end()
            elif key_end != -1:
                return None  # "messages" holds a string
            continue
        if key_end != -1:
            if char != 0x5B or raw[key_end:position].strip(_WHITESPACE) != b":":
                return None  # "messages" holds no array, or the key was a value
            key_end = -1
            depth += 1
            array_depth = depth
            continue
        if char in (0x7B, 0x5B):  # { [
            if depth == array_depth:
                starts.append(position)
            depth += 1
        else:
            depth -= 1
            if depth == array_depth - 1 and array_depth != -1:
                if char != 0x5D or not starts:
                    return None
                end = position
                while raw[end - 1] in _WHITESPACE:
                    end -= 1
                found = Layout(tuple(starts), end, position)
                array_depth = -2  # done with it: a second "messages" key is refused above
    if depth != 0 or found is None:
        return None
    return found


@dataclass
class _Sent:
    module: ModuleType
    raw: bytes
    layout: Layout
    head: int  # how many conversation messages come before the items' (Anthropic's `system`)
    ends: list[int]  # how many messages the items up to each one give (the protocol's item parser's count)
    conversation: Conversation
    options: dict[str, Any]


def load_json(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object (read as json reads it: lego/proxy/jsonio.py)."""
    try:
        body = loads(raw)
    except ValueError as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


class ResentRequests:
    """A session's recent requests, to parse the next one's new items only (see the module docstring). Not
    thread-safe: the proxy's event loop is its only caller."""

    def __init__(self, kept: int = KEPT_REQUESTS) -> None:
        self._sent: deque[_Sent] = deque(maxlen=kept)
        self.shortcuts = 0  # requests parsed from their new items alone (for tests and benchmarks)

    def clear(self) -> None:
        self._sent.clear()

    def parse(self, module: ModuleType, raw: bytes) -> tuple[Conversation, dict[str, Any]]:
        """`module.parse_request` of the JSON body `raw`: the same conversation and options, from the new items alone
        when `raw` resends a recent request's history."""
        parse_items = getattr(module, "parse_items", None)
        if parse_items is not None:
            for sent in reversed(self._sent):
                if sent.module is module:
                    parsed = self._from_tail(sent, raw, parse_items)
                    if parsed is not None:
                        self.shortcuts += 1
                        return parsed
        body = load_json(raw)
        ends: list[int] = []
        conversation, options = module.parse_request(body, ends) if parse_items is not None else \
            module.parse_request(body)
        if parse_items is not None:
            layout = messages_layout(raw)
            if layout is not None and layout.count == len(ends):
                self._sent.append(_Sent(module, raw, layout, len(conversation.messages) - ends[-1], ends,
                                        conversation, options))
        return conversation, dict(options)

    def _from_tail(self, sent: _Sent, raw: bytes, parse_items) -> tuple[Conversation, dict[str, Any]] | None:
        old, layout = memoryview(sent.raw), sent.layout
        count = layout.count
        end = len(raw) - (len(old) - layout.close)  # where the new request's messages array closes, if it matches
        if not raw.endswith(old[layout.close:]):
            return None
        for keep in range(count, max(0, count - REWRITTEN_ITEMS) - 1, -1):
            start = layout.last_end if keep == count else layout.start(sent.raw, keep)
            if end <= start or not raw.startswith(old[:start]):
                continue
            items_bytes = raw[start:end]
            if keep == count:  # appended after the last item: a comma first
                items_bytes = items_bytes.lstrip(_WHITESPACE)
                if not items_bytes.startswith(b","):
                    continue
                items_bytes = items_bytes[1:]
            try:
                items = loads(b"[" + items_bytes + b"]")
            except ValueError:
                continue
            if not items:
                continue
            kept = sent.ends[keep - 1] if keep else 0  # the messages the kept items give
            ends: list[int] = []
            try:
                messages = parse_items(items, keep, ends)
            except RequestError:
                return None  # the full path answers it, with the protocol's error
            conversation = sent.conversation.extended(sent.head + kept, messages)
            # the new items are the last bytes before the array's (unchanged) closing bracket; where each starts is
            # found when a later request rewrites one of them
            pending = ((end - len(items_bytes), end),)
            if keep == count:
                starts, pending = layout.starts, layout.pending + pending
            else:
                starts = layout.starts[:keep]  # all found: item `keep`'s start was asked for above
            self._sent.append(_Sent(sent.module, raw, Layout(
                starts, end - (len(items_bytes) - len(items_bytes.rstrip(_WHITESPACE))), end, keep + len(items),
                pending), sent.head, [*sent.ends[:keep], *(kept + e for e in ends)], conversation, sent.options))
            return conversation, dict(sent.options)
        return None
