"""The model's own chat template, rendered incrementally: only new messages are rendered and tokenized.

What a request adds to a known stream is the template's text for its new messages: the render of known + new
messages minus the render of the known messages *followed by a boundary message*, so that they take the form they
have mid-conversation (Qwen3 renders a last assistant turn with an empty `<think>` block and closes a tool-response
group only before a non-tool turn). Known assistant turns are rendered without reasoning in both renders: their
text is discarded anyway (the session keeps the sampled tokens) and this keeps Qwen3's think-stripping of earlier
turns from moving the boundary. Only that new text is tokenized.

Rendering the whole conversation for every call costs what the conversation costs (Jinja's sandbox walks every
message, `tojson`s every tool), so a call that only adds tool results, user or system turns is rendered from a
*skeleton* instead: the template's text for a stand-in conversation (the first and the last known message with
stand-in contents, one stand-in tool if there are tools, the new messages' roles with placeholder contents), cached
by that shape, with the new contents put in place of the placeholders. That is exact for templates that
- write a user, tool or system message's content as it is (no strip, no escaping), and
- render a new message from its own role and content, its neighbours' roles, and whether there are tools, never
  from the content of earlier messages or from the tools' contents.
Qwen3's template is such a template. Whether the model's template is one is checked once per process (`probe`) on
conversations that vary every one of these; a template that is not is rendered whole for every call (exact, slower).

The tokens of the first turn (the system prompt and the tools, where a harness sends the same ones in every session)
are kept per process (`header`): a session's first call tokenizes only its first user turn.

Tokenizing the new text apart gives the same tokens as tokenizing the whole render because every message boundary in
the template sits next to a special or added token (`<|im_end|>`, `<|im_start|>`, `<tool_response>`), which the
tokenizer never merges across. Tests check all of this against full rendering. ASCII text is tokenized by a word
cache that gives the tokenizer's own tokens several times faster (lego/proxy/encoder.py). Long texts (a first turn,
a file read back) are tokenized on a worker thread, so the event loop is not held for their whole duration: it gets
the GIL back at Python's switch interval, and the tokenizer's own calls (unseen words, non-ASCII text) run beside it
without the GIL.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from array import array
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lego.proxy.encoder import WordCacheEncoder

if TYPE_CHECKING:
    from lego.proxy.messages import ChatMessage, Conversation

log = logging.getLogger(__name__)

BOUNDARY = "\x00lego-boundary\x00"
PLACEHOLDER = re.compile("\x00([0-9]+)\x00")
STAND_IN = "lego stand-in"
STAND_IN_TOOL = {"type": "function", "function": {"name": "stand_in", "description": STAND_IN,
                                                  "parameters": {"type": "object", "properties": {}}}}
VERBATIM_ROLES = frozenset({"user", "tool", "system"})  # roles a skeleton renders (new assistant turns: full render)
HEADER_CACHE = 32  # first turns (system prompt + tools) whose tokens a process keeps
SKELETON_CACHE = 4096  # conversation shapes whose skeleton a renderer keeps
THREAD_ENCODE_CHARS = 16384  # texts at least this long are tokenized on a worker thread
_NOT_ASCII = object()  # a token whose text alone is not ASCII (ChatRenderer.decode)
_PROBED: dict[str, bool] = {}  # chat template -> whether skeletons render it exactly (checked once per process)


def _decoder_type(tokenizer) -> str | None:
    try:
        return json.loads(tokenizer.decoder.__getstate__()).get("type")
    except Exception:  # no decoder, or one that cannot be read: decoded the general way
        return None


@dataclass(slots=True)
class NewTokens:
    """What a call adds to a stream: its token ids (a flat array, as the stream keeps them: a first turn's 16k
    tokens are copied, not converted one by one), and how many of them are the first turn (the system prompt and
    tools) when the stream starts from nothing (None otherwise)."""

    ids: array
    header: int | None = None


@dataclass(frozen=True)
class _Skeleton:
    literals: tuple[str, ...]  # the text around the placeholders, one more than `slots`
    slots: tuple[int, ...]  # which new message's content goes in each placeholder

    def fill(self, contents: list[str]) -> str:
        parts = [self.literals[0]]
        for slot, literal in zip(self.slots, self.literals[1:], strict=True):
            parts.append(contents[slot])
            parts.append(literal)
        return "".join(parts)


class ChatRenderer:
    def __init__(self, tokenizer, *, incremental: bool | None = None) -> None:
        """`incremental`: render skeletons (None: when the probe finds them exact for this template)."""
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template; the proxy needs the model's own template")
        self.tokenizer = tokenizer
        self._fast = getattr(tokenizer, "_tokenizer", None)  # the Rust tokenizer, without Python overhead
        self._words = WordCacheEncoder.for_tokenizer(self._fast) if self._fast is not None else None
        # decode without the Python wrapper only where the wrapper adds nothing (no clean-up of spaces)
        self._fast_decode = self._fast if not getattr(tokenizer, "clean_up_tokenization_spaces", True) else None
        # A byte-level decoder's text of a sequence is its tokens' texts put together (a streamed reply is decoded
        # piece by piece).
        self.decodes_by_concatenation = self._fast_decode is not None and _decoder_type(self._fast) == "ByteLevel"
        self._token_texts: dict[int, str] = {}  # end-of-turn token -> its text (decode_after)
        # token -> its text where that is ASCII (whole characters alone, so the text of a sequence of such tokens is
        # theirs put together), else _NOT_ASCII: a reply is decoded without the tokenizer's call
        self._ascii_texts: dict[int, object] | None = {} if self.decodes_by_concatenation else None
        probe = [{"role": "user", "content": BOUNDARY}]
        without = self.render(probe, [], add_generation_prompt=False)
        self.generation_prompt = self.render(probe, [], add_generation_prompt=True)[len(without):]
        self.generation_prompt_ids = self.encode(self.generation_prompt)
        # The generation prompt opens a think block (Qwen3 thinking models): a reply starts inside it.
        self.thinking = self.generation_prompt.rstrip().endswith("<think>")
        self.user_prefix = without[: without.index(BOUNDARY)]  # Qwen3: "<|im_start|>user\n"
        # What the template writes after an assistant turn's content, before the next turn (Qwen3: "<|im_end|>\n").
        turn = self.render([{"role": "user", "content": "a"}, {"role": "assistant", "content": BOUNDARY},
                            {"role": "user", "content": "b"}], [], add_generation_prompt=False)
        after = turn[turn.index(BOUNDARY) + len(BOUNDARY):]
        self.turn_end = after[: after.index(self.user_prefix + "b")]
        self._skeletons: dict[tuple, _Skeleton | None] = {}
        self._headers: OrderedDict[tuple[str, str], tuple[str, array]] = OrderedDict()
        self._pending_headers: dict[tuple[str, str], asyncio.Future] = {}
        self._pool: ThreadPoolExecutor | None = None
        if incremental is None:
            template = tokenizer.chat_template
            if template not in _PROBED:
                _PROBED[template] = self.probe()
                if not _PROBED[template]:
                    log.warning("the model's chat template renders a message from more than its neighbours' roles; "
                                "the proxy renders whole conversations for it (exact, slower per call)")
            incremental = _PROBED[template]
        self.incremental = incremental

    # ------------------------------------------------------------------------------------------ template and tokens

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
               add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> array:
        """The tokens of `text` (no special tokens added), as a flat int32 array (as a stream keeps them)."""
        if not text:
            return array("i")
        if self._words is not None:
            ids = self._words.encode_array(text)
            if ids is not None:
                return ids
        if self._fast is not None:
            return array("i", self._fast.encode(text, add_special_tokens=False).ids)
        return array("i", self.tokenizer(text, add_special_tokens=False)["input_ids"])

    async def encode_async(self, text: str) -> array:
        """`encode`, on a worker thread for long texts (the event loop serves other calls meanwhile)."""
        if len(text) < THREAD_ENCODE_CHARS:
            return self.encode(text)
        return await asyncio.get_running_loop().run_in_executor(self._workers(), self.encode, text)

    def decode(self, ids: list[int]) -> str:
        texts = self._ascii_texts
        if texts is not None:  # a concatenating decoder: an all-ASCII text is its tokens' texts put together
            pieces = list(map(texts.get, ids))
            if None in pieces:
                for token in ids:
                    if token not in texts:
                        text = self._decode([token])
                        texts[token] = text if text.isascii() else _NOT_ASCII
                pieces = list(map(texts.get, ids))
            if _NOT_ASCII not in pieces:
                return "".join(pieces)  # type: ignore[arg-type]
        return self._decode(ids)

    def _decode(self, ids: list[int]) -> str:
        if self._fast_decode is not None:
            return self._fast_decode.decode(ids, skip_special_tokens=False)
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def decode_after(self, text: str, ids: list[int], longer: list[int]) -> str:
        """`decode(longer)`, where `longer` is `ids` and one more token and `text` is `decode(ids)`. A byte-level
        decoder's text of a sequence is its tokens' texts put together (a trailing unfinished character reads as
        U+FFFD either way), so a reply is decoded once and its end-of-turn token's text added, not decoded again."""
        if self.decodes_by_concatenation and len(longer) == len(ids) + 1:
            last = longer[-1]
            piece = self._token_texts.get(last)
            if piece is None:
                piece = self._token_texts[last] = self.decode([last])
            if piece.isascii():  # whole characters alone, so nothing of the text before it changes
                return text + piece
        return self.decode(longer)

    def _workers(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="lego-tokenizer")
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def prefix_text(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        """The text the full template gives `messages` when more messages follow them."""
        if not messages:
            return ""
        text = self.render([*messages, {"role": "user", "content": BOUNDARY}], tools, add_generation_prompt=False)
        return text[: text.rindex(self.user_prefix + BOUNDARY)]

    def bridge_after(self, reply_text: str) -> str:
        """Template text still owed after a sampled reply before the next turn: the part of `turn_end` the
        model did not write itself (after a sampled `<|im_end|>`, Qwen3 owes "\\n"; after a cut-off reply,
        "<|im_end|>\\n")."""
        for size in range(len(self.turn_end), 0, -1):
            if reply_text.endswith(self.turn_end[:size]):
                return self.turn_end[size:]
        return self.turn_end

    # ------------------------------------------------------------------------------------------ what a call adds

    async def new_tokens(self, conversation: Conversation, known: int, bridge: str = "",
                         start: bool = False) -> NewTokens | None:
        """The tokens `conversation` adds after its first `known` messages (whose stream ends with the template text
        `bridge` still owed), generation prompt included; None when the template renders the known messages
        differently with these new ones after them (start from an earlier point). `start`: the stream starts from
        nothing, and its first turn's tokens come from the per-process header cache."""
        messages = conversation.messages
        if known == 0:
            if start and len(messages) > 1 and messages[0].role == "system":
                rest = self.new_text(conversation, 1)
                if rest is not None:
                    head = await self.header(conversation)
                    ids = head[:]
                    ids.extend(await self.encode_async(rest))
                    return NewTokens(ids, len(head))
            full = self.render(conversation.template_messages(), conversation.tools, add_generation_prompt=True)
            return NewTokens(await self.encode_async(bridge + full))
        text = self.new_text(conversation, known)
        if text is None:
            return None
        return NewTokens(await self.encode_async(bridge + text))

    def new_text(self, conversation: Conversation, known: int) -> str | None:
        """The template text of the messages after the first `known` (known >= 1), generation prompt included, or
        None when the known messages render differently followed by them."""
        if self.incremental:
            text = self._from_skeleton(conversation.messages, known, bool(conversation.tools))
            if text is not None:
                return text
        return self._by_full_render(conversation, known)

    def _by_full_render(self, conversation: Conversation, known: int) -> str | None:
        template = conversation.template_messages(known=known)
        full = self.render(template, conversation.tools, add_generation_prompt=True)
        prefix = self.prefix_text(template[:known], conversation.tools)
        return full[len(prefix):] if full.startswith(prefix) else None

    async def header(self, conversation: Conversation) -> array:
        """Tokens of the first turn (the leading system message and the tools), kept per process: every session of
        a harness sends the same ones. The caller must not change the array (copy it)."""
        system = conversation.messages[0].content
        key = (system, conversation.tools_key())
        cached = self._headers.get(key)
        if cached is not None:
            self._headers.move_to_end(key)
            return cached[1]
        pending = self._pending_headers.get(key)
        if pending is not None:  # another session's first call is tokenizing it now
            return await asyncio.shield(pending)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending_headers[key] = future
        try:
            text = self.prefix_text(conversation.template_messages()[:1], conversation.tools)
            ids = await self.encode_async(text)
            self._headers[key] = (text, ids)
            if len(self._headers) > HEADER_CACHE:
                self._headers.popitem(last=False)
            future.set_result(ids)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved here: a failure is raised to every waiter, never logged as unretrieved
            raise
        finally:
            del self._pending_headers[key]
        return ids

    # ------------------------------------------------------------------------------------------ skeletons

    def _from_skeleton(self, messages: list[ChatMessage], known: int, has_tools: bool) -> str | None:
        new = messages[known:]
        if not new or not known:
            return None
        for message in new:
            if message.role not in VERBATIM_ROLES or "\x00" in message.content:
                return None
        context = [messages[0]] if known == 1 else [messages[0], messages[known - 1]]
        shape = (tuple((m.role, len(m.tool_calls)) for m in context), tuple((m.role, not m.content) for m in new),
                 has_tools)
        if shape in self._skeletons:
            skeleton = self._skeletons[shape]
        else:
            skeleton = self._skeleton(shape)
            if len(self._skeletons) >= SKELETON_CACHE:
                self._skeletons.clear()
            self._skeletons[shape] = skeleton
        if skeleton is None:
            return None
        return skeleton.fill([message.content for message in new])

    def _skeleton(self, shape: tuple) -> _Skeleton | None:
        context_shape, new_shape, has_tools = shape
        context: list[dict[str, Any]] = []
        for role, calls in context_shape:
            message: dict[str, Any] = {"role": role, "content": STAND_IN}
            if role == "assistant":
                message["reasoning_content"] = ""  # as known assistant turns render (see the module docstring)
            if calls:
                message["tool_calls"] = [{"type": "function", "function": {"name": "stand_in", "arguments": "{}"}}
                                         for _ in range(calls)]
            context.append(message)
        new = [{"role": role, "content": "" if empty else f"\x00{index}\x00"}
               for index, (role, empty) in enumerate(new_shape)]
        tools = [STAND_IN_TOOL] if has_tools else []
        full = self.render(context + new, tools, add_generation_prompt=True)
        prefix = self.prefix_text(context, tools)
        if not full.startswith(prefix):
            return None
        pieces = PLACEHOLDER.split(full[len(prefix):])
        slots = tuple(int(slot) for slot in pieces[1::2])
        if slots != tuple(i for i, (_, empty) in enumerate(new_shape) if not empty):
            return None  # a content written twice, dropped or moved: not a template skeletons can render
        return _Skeleton(tuple(pieces[0::2]), slots)

    def probe(self) -> bool:
        """Whether skeletons render this template exactly: compared with full renders on conversations that vary
        what a template could look at (roles around the new messages, tools, reasoning, contents that a template
        might strip, escape or test)."""
        from lego.proxy.messages import ChatMessage, Conversation, ToolCall

        contents = ["plain text", "  padded with spaces  ", "\n\nnewlines around\n\n", "",
                    "<tool_response>\nwrapped\n</tool_response>", "{{ braces }} {% raw %} </think> <think>",
                    "unicode é 中文 🙂 \\n \\u0000", "<|im_start|>user\ninjected<|im_end|>"]
        counter = iter(range(10**6))

        def text() -> str:
            return contents[next(counter) % len(contents)]

        def system() -> ChatMessage:
            return ChatMessage("system", text() or "system")

        def user() -> ChatMessage:
            return ChatMessage("user", text())

        def tool() -> ChatMessage:
            return ChatMessage("tool", text(), tool_call_id="call_1")

        def assistant(calls: int = 1, reasoning: str | None = None) -> ChatMessage:
            return ChatMessage("assistant", text(), [ToolCall("bash", '{"command": "ls"}')] * calls,
                               reasoning=reasoning)

        def wrapped() -> ChatMessage:
            return ChatMessage("user", "<tool_response>\nresult\n</tool_response>")

        knowns = [lambda: [system()], lambda: [user()], lambda: [system(), user()],
                  lambda: [system(), user(), assistant()], lambda: [system(), user(), assistant(0)],
                  lambda: [system(), user(), assistant(), tool(), assistant(2)],
                  lambda: [user(), assistant(), tool()], lambda: [system(), user(), assistant(1, "thought")],
                  lambda: [system(), user(), assistant(), tool(), wrapped(), assistant(0)],
                  lambda: [system(), user(), assistant(0), system()], lambda: [system(), wrapped(), assistant()]]
        news = [lambda: [tool()], lambda: [tool(), tool()], lambda: [user()], lambda: [tool(), user()],
                lambda: [system()], lambda: [wrapped()], lambda: [tool(), tool(), tool()], lambda: [user(), user()],
                lambda: [system(), user()]]
        tool_sets = [[], [{"type": "function", "function": {"name": "bash", "description": "Run {{ x }}",
                                                            "parameters": {"type": "object", "properties": {
                                                                "command": {"type": "string"}}}}}]]
        try:
            for make_known in knowns:
                for make_new in news:
                    for tools in tool_sets:
                        known = make_known()
                        conversation = Conversation([*known, *make_new()], tools)
                        expected = self._by_full_render(conversation, len(known))
                        got = self._from_skeleton(conversation.messages, len(known), bool(tools))
                        if got != expected:
                            log.debug("skeleton render differs from the full render for roles %s + %s",
                                      [m.role for m in known], [m.role for m in conversation.messages[len(known):]])
                            return False
        except Exception:  # a template that fails on a probe is not one skeletons can stand in for
            log.debug("skeleton probe failed", exc_info=True)
            return False
        return True
