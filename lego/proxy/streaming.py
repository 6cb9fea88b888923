"""Streamed answers, sent as the engine samples: the SSE events of each protocol, written piece by piece.

A `ReplyStreamer` sits between the session and the HTTP response of one streamed call. The session hands it each
chunk of sampled tokens (`tokens`); it turns them into text (`StreamDecoder`), reads that text as the model writes it
(`ReplyReader`: reasoning, content, whole tool calls) and has the protocol's writer turn each piece into SSE events,
written at once. The HTTP response is opened with the first tokens, so a request the proxy refuses before sampling
still gets its protocol's error status. When the generation ends, the call's `Completion` (committed by the session
from the very same tokens) closes the stream: the rest of the reply, the finish reason and the usage. A failure after
the stream opened ends it with the protocol's error event.

Writers (one per protocol) keep each protocol's order of events:
- OpenAI chat: a role chunk, `reasoning_content` and `content` deltas, each tool call as two `tool_calls` chunks
  (id and name, then its arguments), the finish chunk, the usage chunk when asked, `[DONE]`.
- Anthropic: `message_start`, `ping`, content blocks in the order they are written (thinking, text, tool_use; a
  text block after a tool call opens a new block), `message_delta` with the stop reason and usage, `message_stop`.
- Responses: `response.created`, `response.in_progress`, output items as they are written (reasoning, message,
  function_call, each added, filled and done), then `response.completed` holding every item.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from typing import Any

from aiohttp import web

from lego.errors import tail
from lego.proxy import anthropic, openai_chat, responses
from lego.proxy.jsonio import to_json
from lego.proxy.messages import RequestError, new_id
from lego.proxy.render import ChatRenderer
from lego.proxy.reply import Reply, ReplyEvent, ReplyReader, StreamDecoder, parse_reply
from lego.proxy.session import Completion, Session

log = logging.getLogger(__name__)

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class StreamWriter(ABC):
    """The SSE events of one protocol for one streamed reply (subclasses: one per protocol)."""

    def __init__(self, options: dict[str, Any], model: str) -> None:
        self.options = options
        self.model = options["model"] or model

    @abstractmethod
    def start(self, prompt_tokens: int) -> list[bytes]:
        """The events that open the reply (sent with the first tokens)."""

    @abstractmethod
    def events(self, events: list[ReplyEvent]) -> list[bytes]:
        """The events for newly parsed pieces of the reply."""

    @abstractmethod
    def finish(self, completion: Completion) -> list[bytes]:
        """The events that close the reply, with its finish reason and usage."""

    @abstractmethod
    def error(self, exc: RequestError) -> list[bytes]:
        """The protocol's error event for a failure after the stream opened."""


class OpenAIChatWriter(StreamWriter):
    def __init__(self, options: dict[str, Any], model: str) -> None:
        super().__init__(options, model)
        self.base = {"id": new_id("chatcmpl-"), "object": "chat.completion.chunk",
                     "created": int(time.time()), "model": self.model}
        self.calls = 0

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        body = {**self.base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        return b"data: " + to_json(body) + b"\n\n"

    def start(self, prompt_tokens: int) -> list[bytes]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def events(self, events: list[ReplyEvent]) -> list[bytes]:
        lines = []
        for event in events:
            if event.kind == "reasoning":
                lines.append(self._chunk({"reasoning_content": event.text}))
            elif event.kind == "content":
                lines.append(self._chunk({"content": event.text}))
            else:
                call, index = event.call, self.calls
                self.calls += 1
                lines.append(self._chunk({"tool_calls": [{"index": index, "id": new_id("call_"),
                                                          "type": "function",
                                                          "function": {"name": call.name, "arguments": ""}}]}))
                lines.append(self._chunk({"tool_calls": [{"index": index,
                                                          "function": {"arguments": call.arguments}}]}))
        return lines

    def finish(self, completion: Completion) -> list[bytes]:
        lines = [self._chunk({}, openai_chat._finish_reason(completion))]
        if self.options.get("include_usage"):
            usage = {**self.base, "choices": [], "usage": openai_chat._usage(completion)}
            lines.append(b"data: " + to_json(usage) + b"\n\n")
        lines.append(b"data: [DONE]\n\n")
        return lines

    def error(self, exc: RequestError) -> list[bytes]:
        body = openai_chat.error_body(exc.message, exc.kind, exc.param, exc.code)
        return [b"data: " + to_json(body) + b"\n\n", b"data: [DONE]\n\n"]


class AnthropicWriter(StreamWriter):
    def __init__(self, options: dict[str, Any], model: str) -> None:
        super().__init__(options, model)
        self.blocks = 0  # blocks opened so far
        self.open: str | None = None  # the kind of the block now open
        self.texts = 0
        self.tool_uses = 0

    @staticmethod
    def _event(kind: str, data: dict[str, Any]) -> bytes:
        return b"event: " + kind.encode() + b"\ndata: " + to_json({"type": kind, **data}) + b"\n\n"

    def start(self, prompt_tokens: int) -> list[bytes]:
        message = {"id": new_id("msg_"), "type": "message", "role": "assistant", "model": self.model,
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": prompt_tokens, "output_tokens": 1, "cache_creation_input_tokens": 0,
                             "cache_read_input_tokens": 0}}
        return [self._event("message_start", {"message": message}), self._event("ping", {})]

    def _begin(self, kind: str, block: dict[str, Any], lines: list[bytes]) -> None:
        self._close(lines)
        lines.append(self._event("content_block_start", {"index": self.blocks, "content_block": block}))
        self.open = kind
        if kind == "text":
            self.texts += 1

    def _close(self, lines: list[bytes]) -> None:
        if self.open is None:
            return
        if self.open == "thinking":
            lines.append(self._delta({"type": "signature_delta", "signature": ""}))
        lines.append(self._event("content_block_stop", {"index": self.blocks}))
        self.blocks += 1
        self.open = None

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return self._event("content_block_delta", {"index": self.blocks, "delta": delta})

    def events(self, events: list[ReplyEvent]) -> list[bytes]:
        lines: list[bytes] = []
        for event in events:
            if event.kind == "reasoning":
                if self.open != "thinking":
                    self._begin("thinking", {"type": "thinking", "thinking": "", "signature": ""}, lines)
                lines.append(self._delta({"type": "thinking_delta", "thinking": event.text}))
            elif event.kind == "content":
                if self.open != "text":
                    self._begin("text", {"type": "text", "text": ""}, lines)
                lines.append(self._delta({"type": "text_delta", "text": event.text}))
            else:
                call = event.call
                self._begin("tool_use", {"type": "tool_use", "id": new_id("toolu_"),
                                         "name": call.name, "input": {}}, lines)
                lines.append(self._delta({"type": "input_json_delta", "partial_json": call.arguments}))
                self._close(lines)
                self.tool_uses += 1
        return lines

    def finish(self, completion: Completion) -> list[bytes]:
        lines: list[bytes] = []
        if not self.texts and not self.tool_uses:  # as a whole answer: a text block, even empty, when no tool call
            self._begin("text", {"type": "text", "text": ""}, lines)
        self._close(lines)
        stop = {"stop_reason": anthropic._stop_reason(completion), "stop_sequence": completion.stop_sequence}
        lines.append(self._event("message_delta", {"delta": stop,
                                                   "usage": {"output_tokens": completion.completion_tokens}}))
        lines.append(self._event("message_stop", {}))
        return lines

    def error(self, exc: RequestError) -> list[bytes]:
        return [self._event("error", {"error": anthropic.error_body(exc.message, exc.status)["error"]})]


class ResponsesWriter(StreamWriter):
    def __init__(self, options: dict[str, Any], model: str) -> None:
        super().__init__(options, model)
        self.sequence = 0
        self.response_id = new_id("resp_")
        self.created_at = int(time.time())
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the reasoning or message item being written
        self.text = ""  # the open item's text so far

    def _parallel(self) -> bool:
        """As the request asked (the non-streamed body echoes the same): false when calls were limited to one."""
        choice = self.options.get("tool_choice")
        return choice is None or bool(getattr(choice, "parallel", True))

    def _event(self, kind: str, data: dict[str, Any]) -> bytes:
        body = {"type": kind, **data, "sequence_number": self.sequence}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + to_json(body) + b"\n\n"

    def _response(self, status: str) -> dict[str, Any]:
        return {"id": self.response_id, "object": "response", "created_at": self.created_at, "status": status,
                "model": self.model, "output": [], "parallel_tool_calls": self._parallel(), "tool_choice": "auto",
                "tools": [], "usage": None}

    def start(self, prompt_tokens: int) -> list[bytes]:
        started = self._response("in_progress")
        return [self._event("response.created", {"response": started}),
                self._event("response.in_progress", {"response": started})]

    def _begin(self, item: dict[str, Any], lines: list[bytes]) -> None:
        self._close(lines)
        index = len(self.items)
        self.items.append(item)
        self.open, self.text = item, ""
        if item["type"] == "reasoning":
            lines.append(self._event("response.output_item.added", {"output_index": index,
                                                                    "item": {**item, "summary": []}}))
            lines.append(self._event("response.reasoning_summary_part.added", {
                **self._ref(), "part": {"type": "summary_text", "text": ""}}))
        else:
            lines.append(self._event("response.output_item.added", {
                "output_index": index, "item": {**item, "status": "in_progress", "content": []}}))
            lines.append(self._event("response.content_part.added", {
                **self._ref(), "part": {"type": "output_text", "text": "", "annotations": []}}))

    def _ref(self) -> dict[str, Any]:
        item = self.open
        ref = {"item_id": item["id"], "output_index": len(self.items) - 1}
        return {**ref, "summary_index": 0} if item["type"] == "reasoning" else {**ref, "content_index": 0}

    def _close(self, lines: list[bytes]) -> None:
        item = self.open
        if item is None:
            return
        ref, text = self._ref(), self.text
        if item["type"] == "reasoning":
            part = {"type": "summary_text", "text": text}
            item["summary"] = [part]
            lines.append(self._event("response.reasoning_summary_text.done", {**ref, "text": text}))
            lines.append(self._event("response.reasoning_summary_part.done", {**ref, "part": part}))
        else:
            part = {"type": "output_text", "text": text, "annotations": []}
            item["content"] = [part]
            lines.append(self._event("response.output_text.done", {**ref, "text": text}))
            lines.append(self._event("response.content_part.done", {**ref, "part": part}))
        lines.append(self._event("response.output_item.done", {"output_index": len(self.items) - 1, "item": item}))
        self.open = None

    def events(self, events: list[ReplyEvent]) -> list[bytes]:
        lines: list[bytes] = []
        for event in events:
            if event.kind == "reasoning":
                if self.open is None or self.open["type"] != "reasoning":
                    self._begin({"type": "reasoning", "id": new_id("rs_"), "summary": []}, lines)
                self.text += event.text
                lines.append(self._event("response.reasoning_summary_text.delta", {**self._ref(),
                                                                                    "delta": event.text}))
            elif event.kind == "content":
                if self.open is None or self.open["type"] != "message":
                    self._begin({"type": "message", "id": new_id("msg_"), "status": "completed",
                                 "role": "assistant", "content": []}, lines)
                self.text += event.text
                lines.append(self._event("response.output_text.delta", {**self._ref(), "delta": event.text}))
            else:
                self._close(lines)
                item = responses.function_call_item(event.call, self.options.get("namespaces"))
                index = len(self.items)
                self.items.append(item)
                ref = {"item_id": item["id"], "output_index": index}
                lines.append(self._event("response.output_item.added", {
                    "output_index": index, "item": {**item, "arguments": "", "status": "in_progress"}}))
                lines.append(self._event("response.function_call_arguments.delta", {**ref,
                                                                                    "delta": item["arguments"]}))
                lines.append(self._event("response.function_call_arguments.done", {**ref,
                                                                                   "arguments": item["arguments"]}))
                lines.append(self._event("response.output_item.done", {"output_index": index, "item": item}))
        return lines

    def finish(self, completion: Completion) -> list[bytes]:
        lines: list[bytes] = []
        if not any(item["type"] in ("message", "function_call") for item in self.items):
            # as a whole answer: a message, even empty, when there is no tool call
            self._begin({"type": "message", "id": new_id("msg_"), "status": "completed",
                         "role": "assistant", "content": []}, lines)
        self._close(lines)
        final = responses.response_body(completion, self.options, self.model, self.items, self.response_id)
        final["created_at"] = self.created_at
        lines.append(self._event("response.completed", {"response": final}))
        return lines

    def error(self, exc: RequestError) -> list[bytes]:
        failed = {**self._response("failed"), "output": self.items,
                  "error": {"code": exc.code or exc.kind, "message": exc.message}}
        return [self._event("response.failed", {"response": failed})]


WRITERS: dict[str, type[StreamWriter]] = {
    openai_chat.PROTOCOL: OpenAIChatWriter,
    anthropic.PROTOCOL: AnthropicWriter,
    responses.PROTOCOL: ResponsesWriter,
}


class ReplyStreamer:
    """One streamed call's answer (see the module docstring): pass `tokens` to `Session.complete`, then `finish`."""

    def __init__(self, request: web.Request, writer: StreamWriter, renderer: ChatRenderer,
                 end_ids: tuple[int, ...], options: dict[str, Any]) -> None:
        self.request = request
        self.writer = writer
        self.decoder = StreamDecoder(renderer.decode, end_ids, tuple(options.get("stop", ())),
                                     concatenates=renderer.decodes_by_concatenation)
        self.reader = ReplyReader(options["parse_tools"], renderer.thinking)
        self.response: web.StreamResponse | None = None
        self._unsent: list[bytes] = []  # the opening events, until the first piece of the reply goes with them
        self._last_events: list[ReplyEvent] | None = None  # what the reader's end of the reply gave (read_reply)
        self._diverged = False  # the reply's text does not start with the streamed text

    @property
    def started(self) -> bool:
        return self.response is not None

    async def _open(self, prompt_tokens: int) -> None:
        """Open the response. Its opening events go out with the first piece of the reply, in one write."""
        self.response = web.StreamResponse(status=200, headers=SSE_HEADERS)
        await self.response.prepare(self.request)
        self._unsent = self.writer.start(prompt_tokens)

    def _take_unsent(self) -> list[bytes]:
        lines, self._unsent = self._unsent, []
        return lines

    async def tokens(self, prompt_tokens: int, ids: list[int]) -> None:
        if self.response is None:
            await self._open(prompt_tokens)
        text = self.decoder.feed(ids)
        lines = self.writer.events(self.reader.feed(text)) if text else []
        if lines or self._unsent:
            await self.response.write(b"".join(self._take_unsent() + lines))

    def read_reply(self, text: str) -> Reply:
        """The whole reply, read by this stream's reader (which has read what was streamed): the session's reading
        and the stream's are one (`Session.complete`'s `read_reply`). Never raises: a text that does not continue
        what was streamed is read apart, and `finish` reports it."""
        if text.startswith(self.decoder.text[: self.reader.read()]):
            self._last_events, reply = self.reader.finish(text)
            return reply
        self._diverged = True
        return parse_reply(text, self.reader.parse_tools, self.reader.thinking)

    async def finish(self, completion: Completion) -> web.StreamResponse:
        if self.response is None:  # nothing was sampled before the end
            await self._open(completion.prompt_tokens)
        if self._diverged or not completion.reply.text.startswith(self.decoder.text[: self.reader.read()]):
            raise RuntimeError("the streamed text is not the start of the reply's text; the tokenizer does not "
                               "decode token by token as it decodes a whole reply")
        events = self._last_events
        if events is None:  # the session read the reply itself
            events, _ = self.reader.finish(completion.reply.text)
        lines = self._take_unsent() + self.writer.events(events) + self.writer.finish(completion)
        await self.response.write_eof(b"".join(lines))  # the last events and the end of the stream, in one write
        return self.response

    async def fail(self, exc: Exception, session: Session) -> web.StreamResponse:
        """End an opened stream with the protocol's error event (the call is recorded as failed by the session)."""
        if isinstance(exc, RequestError):
            error = exc
            session.internal_errors.append(tail(f"{exc.status} {exc.kind}: {exc.message}"))
        else:
            log.exception("a streamed proxy answer failed", exc_info=exc)
            session.internal_errors.append(tail(f"{type(exc).__name__}: {exc}"))
            error = RequestError(f"internal proxy error: {type(exc).__name__}: {exc}", status=500, kind="api_error")
        try:
            await self.response.write_eof(b"".join(self._take_unsent() + self.writer.error(error)))
        except ConnectionError:  # the client is gone: nobody to tell
            pass
        return self.response
