"""Streamed answers are sent as the engine samples, in each protocol's event order, and the record stays exact.

The gated engine streams its reply's first token and then waits for the test to open a gate before it samples the
rest: a client that sees the first token while the gate is still shut saw it before the generation ended. Beside it,
reading a reply in pieces (the way a stream reads it) gives the same reply as reading it whole, on random replies
and random cuts, with the real Qwen3 tokenizer.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading

import httpx
import numpy as np
import pytest
from proxy_doubles import BackgroundProxy, ScriptedEngine, assistant_text, background_proxy, check_fidelity

from lego.config import SamplingConfig
from lego.engine.base import TokenChunk
from lego.proxy.reply import ReplyReader, StreamDecoder, parse_reply

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a shell command",
                                         "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}
REPLY = "<think>\nThe tests first.\n</think>\n\n" + assistant_text("Hello there.", [("bash", {"command": "ls -l"})])


class GatedEngine(ScriptedEngine):
    """The scripted engine, streaming each reply's first token, then the rest once the test opens `gate`."""

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer)
        self.gate = threading.Event()
        self.ended = threading.Event()  # the generation's last token was produced

    async def stream(self, prompt_ids, sampling):
        result = await self.generate(prompt_ids, sampling)
        yield TokenChunk(result.token_ids[:1])
        await asyncio.get_running_loop().run_in_executor(None, self.gate.wait)
        self.ended.set()
        yield TokenChunk(result.token_ids[1:], result)


class FailingEngine(ScriptedEngine):
    """Streams a first token, then fails."""

    async def stream(self, prompt_ids, sampling):
        result = await self.generate(prompt_ids, sampling)
        self.prompts.pop(), self.results.pop(), self.samplings.pop()  # never served
        yield TokenChunk(result.token_ids[:1])
        raise RuntimeError("the GPU fell off")


@pytest.fixture()
def gated(tokenizer):
    engine = GatedEngine(tokenizer)
    with background_proxy(engine, tokenizer, 256) as background:
        yield background
        engine.gate.set()  # release a generation still held, before the proxy stops


def request(protocol: str, stream: bool) -> tuple[str, dict]:
    if protocol == "openai_chat":
        return "/v1/chat/completions", {"model": "m", "stream": stream, "tools": [BASH], "messages": [
            {"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "List the files."}]}
    if protocol == "anthropic_messages":
        return "/v1/messages", {"model": "m", "max_tokens": 100, "stream": stream, "system": "You are a coding agent.",
                                "tools": [{"name": "bash", "description": "Run a shell command",
                                           "input_schema": BASH["function"]["parameters"]}],
                                "messages": [{"role": "user", "content": "List the files."}]}
    return "/v1/responses", {"model": "m", "stream": stream, "instructions": "You are a coding agent.",
                             "input": "List the files.", "tools": [{"type": "function", **BASH["function"]}]}


def data_of(line: str) -> dict | None:
    if not line.startswith("data: ") or line == "data: [DONE]":
        return None
    return json.loads(line[6:])


def visible_text(protocol: str, event: dict) -> str:
    """The reply text (reasoning or content) an event carries, as a client shows it."""
    if protocol == "openai_chat":
        delta = (event.get("choices") or [{}])[0].get("delta", {})
        return (delta.get("reasoning_content") or "") + (delta.get("content") or "")
    if protocol == "anthropic_messages":
        delta = event.get("delta", {}) if event.get("type") == "content_block_delta" else {}
        return delta.get("text", "") + delta.get("thinking", "")
    if event.get("type") in ("response.output_text.delta", "response.reasoning_summary_text.delta"):
        return event["delta"]
    return ""


def assemble(protocol: str, events: list[dict]) -> dict:
    """What a client makes of a streamed answer: reasoning, content and tool calls."""
    reasoning, content, calls = "", "", []
    for event in events:
        if protocol == "openai_chat":
            for choice in event.get("choices") or []:
                delta = choice["delta"]
                reasoning += delta.get("reasoning_content") or ""
                content += delta.get("content") or ""
                for call in delta.get("tool_calls") or []:
                    if "id" in call:
                        calls.append([call["function"]["name"], ""])
                    calls[call["index"]][1] += call["function"].get("arguments", "")
        elif protocol == "anthropic_messages":
            if event["type"] == "content_block_start" and event["content_block"]["type"] == "tool_use":
                calls.append([event["content_block"]["name"], ""])
            elif event["type"] == "content_block_delta":
                delta = event["delta"]
                reasoning += delta.get("thinking", "")
                content += delta.get("text", "")
                if delta["type"] == "input_json_delta":
                    calls[-1][1] += delta["partial_json"]
        elif event["type"] == "response.completed":
            for item in event["response"]["output"]:
                if item["type"] == "reasoning":
                    reasoning += item["summary"][0]["text"]
                elif item["type"] == "message":
                    content += item["content"][0]["text"]
                else:
                    calls.append([item["name"], item["arguments"]])
    return {"reasoning": reasoning, "content": content,
            "calls": [(name, json.loads(arguments)) for name, arguments in calls]}


def answer_of(protocol: str, body: dict) -> dict:
    """The same, from a whole (non-streamed) answer."""
    if protocol == "openai_chat":
        message = body["choices"][0]["message"]
        return {"reasoning": message.get("reasoning_content") or "", "content": message["content"] or "",
                "calls": [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                          for c in message.get("tool_calls") or []]}
    if protocol == "anthropic_messages":
        blocks = body["content"]
        return {"reasoning": "".join(b["thinking"] for b in blocks if b["type"] == "thinking"),
                "content": "".join(b["text"] for b in blocks if b["type"] == "text"),
                "calls": [(b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"]}
    return assemble(protocol, [{"type": "response.completed", "response": body}])


@pytest.mark.parametrize("protocol", ["openai_chat", "anthropic_messages", "openai_responses"])
def test_the_first_token_arrives_before_the_generation_ends(gated, tokenizer, protocol):
    engine = gated.engine
    reply = assistant_text("Hello there.", [("bash", {"command": "ls -l"})])
    engine.script(reply)
    first = tokenizer.decode(tokenizer.encode(reply, add_special_tokens=False)[:1])
    assert first == "Hello"  # the first token is text a client shows
    session = gated.open_session()
    path, body = request(protocol, stream=True)
    events, seen_before_end = [], None
    with httpx.stream("POST", f"{session.base_url}{path}", json=body, timeout=60) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            event = data_of(line)
            if event is None:
                continue
            events.append(event)
            if seen_before_end is None and visible_text(protocol, event):
                seen_before_end = visible_text(protocol, event), not engine.ended.is_set()
                engine.gate.set()  # only now may the engine sample the rest
    assert seen_before_end == (first, True)
    assert assemble(protocol, events) == {"reasoning": "", "content": "Hello there.",
                                          "calls": [("bash", {"command": "ls -l"})]}
    segments, calls = check_fidelity(session, engine)
    assert [call.stream for call in calls] == [True]
    assert segments[0].num_sampled == len(engine.results[0].token_ids)


@pytest.mark.parametrize("protocol", ["openai_chat", "anthropic_messages", "openai_responses"])
def test_a_streamed_answer_is_the_whole_answer(tokenizer, protocol):
    engine = ScriptedEngine(tokenizer)
    background = BackgroundProxy(engine, tokenizer, SamplingConfig(max_tokens=256))
    try:
        engine.script(REPLY, REPLY)
        path, body = request(protocol, stream=False)
        whole_session, streamed_session = background.open_session(), background.open_session()
        whole = httpx.post(f"{whole_session.base_url}{path}", json=body, timeout=60)
        assert whole.status_code == 200, whole.text
        path, body = request(protocol, stream=True)
        streamed = httpx.post(f"{streamed_session.base_url}{path}", json=body, timeout=60)
        assert streamed.status_code == 200, streamed.text
        events = [event for event in map(data_of, streamed.text.splitlines()) if event is not None]
        expected = answer_of(protocol, whole.json())
        assert expected == {"reasoning": "The tests first.", "content": "Hello there.",
                            "calls": [("bash", {"command": "ls -l"})]}
        assert assemble(protocol, events) == expected
        if protocol == "anthropic_messages":
            kinds = [e["type"] for e in events]
            assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == ["message_delta", "message_stop"]
            assert events[-2]["delta"]["stop_reason"] == "tool_use"
            assert events[0]["message"]["usage"]["input_tokens"] == len(engine.prompts[1])
        elif protocol == "openai_responses":
            assert [e["sequence_number"] for e in events] == list(range(len(events)))
            assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
        else:
            assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
        for session in (whole_session, streamed_session):
            engine_view = ScriptedEngine(tokenizer)
            index = 0 if session is whole_session else 1
            engine_view.prompts, engine_view.results = [engine.prompts[index]], [engine.results[index]]
            check_fidelity(session, engine_view)
    finally:
        background.close()


def test_an_engine_failing_mid_stream_ends_the_stream_with_an_error(tokenizer):
    engine = FailingEngine(tokenizer)
    background = BackgroundProxy(engine, tokenizer, SamplingConfig(max_tokens=256))
    try:
        engine.script("Hello there, a long reply.")
        session = background.open_session()
        path, body = request("anthropic_messages", stream=True)
        response = httpx.post(f"{session.base_url}{path}", json=body, timeout=60)
        assert response.status_code == 200  # the stream had begun
        lines = response.text.splitlines()
        assert "event: error" in lines and "event: message_stop" not in lines
        error = json.loads(lines[lines.index("event: error") + 1][6:])
        assert error["type"] == "error" and "GPU fell off" in error["error"]["message"]
        segments, calls = session.trajectory_parts()
        assert segments == [] and calls[0].error.startswith("RuntimeError")  # nothing recorded as served
        assert session.internal_errors and "GPU fell off" in session.internal_errors[0]
    finally:
        background.close()


# ---------------------------------------------------------------------------------------------- reading in pieces


def random_reply(rng: random.Random) -> str:
    parts = []
    if rng.random() < 0.5:
        parts.append(rng.choice(["", "  ", "\n"]) + "<think>" + rng.choice(["", "\n", "\n\n"]) + "I think </thi nk"
                     + rng.choice(["", "\n"]) + ("</think>" if rng.random() < 0.8 else ""))
    for _ in range(rng.randint(0, 4)):
        kind = rng.random()
        if kind < 0.4:
            parts.append(rng.choice(["Text here.", "  padded  ", "\n\nnewlines\n", "a <tool_ b", "x < y", "é中🙂"]))
        elif kind < 0.7:
            parts.append("<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": rng.choice(["ls", "a\nb"])}})
                         + "\n</tool_call>")
        elif kind < 0.85:
            parts.append(rng.choice(['<tool_call>\n{"name": "bash", "arguments": "ls"}\n</tool_call>',
                                     "<tool_call>\nnot json\n</tool_call>", "<tool_call>\n{\"na"]))
        else:
            parts.append(rng.choice([" ", "\n", "\t"]))
    return "".join(parts)


def read_in_pieces(text: str, rng: random.Random, parse_tools: bool, thinking: bool):
    reader = ReplyReader(parse_tools, thinking)
    events, position = [], 0
    while position < len(text):
        size = rng.randint(1, 6)
        events += reader.feed(text[position:position + size])
        position += size
    last, reply = reader.finish(text)
    return events + last, reply


def test_reading_a_reply_in_pieces_gives_the_reply_read_whole():
    rng = random.Random(7)
    for _ in range(3000):
        text = random_reply(rng)
        parse_tools, thinking = rng.random() < 0.8, rng.random() < 0.2
        whole = parse_reply(text, parse_tools, thinking)
        events, reply = read_in_pieces(text, rng, parse_tools, thinking)
        assert reply == whole, text
        reasoning = "".join(e.text for e in events if e.kind == "reasoning")
        assert reasoning == (whole.reasoning or "")
        assert "".join(e.text for e in events if e.kind == "content") == whole.content
        assert [e.call for e in events if e.kind == "tool_call"] == whole.tool_calls


def test_a_reply_is_read_as_qwen3_writes_it():
    reply = parse_reply("<think>\nLet me look.\n</think>\n\nI'll run ls.\n" + assistant_text("", [("bash", {"command": "ls"})])
                        + "\n<tool_call>\nbroken\n</tool_call>")
    assert reply.reasoning == "Let me look."
    assert reply.content == "I'll run ls.\n\n<tool_call>\nbroken\n</tool_call>"
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("bash", '{"command": "ls"}')]
    assert parse_reply("<think>\ncut off while thinking").reasoning == "cut off while thinking"
    assert parse_reply("plain </think> text").content == "plain </think> text"  # no think block was opened
    assert parse_reply("thought\n</think>\n\nanswer", thinking=True).reasoning == "thought"
    assert parse_reply(assistant_text("", [("bash", {"command": "ls"})]), parse_tools=False).tool_calls == []


def test_the_stream_decoder_shows_whole_characters_and_nothing_of_a_stop_string(tokenizer):
    ids = tokenizer.encode("naïve 中文🦜𓀀 done. STOP here", add_special_tokens=False) + [151645]
    for concatenates in (True, False):
        decoder = StreamDecoder(lambda part: tokenizer.decode(part, skip_special_tokens=False), (151645,),
                                ("STOP",), concatenates=concatenates)
        shown = ""
        for token in ids:
            piece = decoder.feed([token])
            assert "\ufffd" not in piece
            shown += piece
        assert shown == "naïve 中文🦜𓀀 done. "  # never the stop string, nor what follows it
    decoder = StreamDecoder(lambda part: tokenizer.decode(part, skip_special_tokens=False), (151645,))
    assert "".join(decoder.feed([token]) for token in ids) == "naïve 中文🦜𓀀 done. STOP here"
    split = tokenizer.encode("𓀀", add_special_tokens=False)
    assert len(split) == 3  # one character over three byte-level tokens
    for concatenates in (True, False):
        decoder = StreamDecoder(lambda part: tokenizer.decode(part), concatenates=concatenates)
        assert [decoder.feed([token]) for token in split] == ["", "", "𓀀"]


def test_a_streamed_reply_keeps_its_logprobs_and_routing(gated):
    engine = gated.engine
    engine.gate.set()
    engine.script(REPLY, "Done.")
    session = gated.open_session()
    path, body = request("openai_chat", stream=True)
    first = httpx.post(f"{session.base_url}{path}", json=body, timeout=60)
    events = [event for event in map(data_of, first.text.splitlines()) if event is not None]
    answer = assemble("openai_chat", events)
    call_id = next(c["id"] for e in events for c in (e["choices"][0]["delta"].get("tool_calls") or []) if "id" in c)
    body["messages"] += [{"role": "assistant", "content": answer["content"], "reasoning_content": answer["reasoning"],
                          "tool_calls": [{"id": call_id, "type": "function", "function": {
                              "name": "bash", "arguments": '{"command": "ls -l"}'}}]},
                         {"role": "tool", "tool_call_id": call_id, "content": "calc.py"}]
    httpx.post(f"{session.base_url}{path}", json=body, timeout=60).raise_for_status()
    segments, calls = check_fidelity(session, engine)
    assert [c.kind for c in calls] == ["start", "extend"] and len(segments) == 1
    sampled = segments[0].response_mask.astype(bool)
    np.testing.assert_array_equal(segments[0].logprobs[sampled],
                                  np.asarray(engine.results[0].logprobs + engine.results[1].logprobs, dtype=np.float32))


def test_a_held_back_end_is_the_longest_that_may_still_become_the_marker():
    """What the reader and the stream decoder hold back (the end of the text that may still become `<tool_call>`, a
    stop string, ...) against trying every length, on random texts full of the markers' characters."""
    from lego.proxy.reply import _partial_suffix

    def by_every_length(text: str, marker: str) -> int:
        return next((size for size in range(min(len(marker) - 1, len(text)), 0, -1)
                     if text.endswith(marker[:size])), 0)

    rng = random.Random(5)
    for marker in ("<tool_call>", "</think>", "STOP", "<<", "abab", "aaa", "x"):
        for _ in range(3000):
            text = "".join(rng.choice("<tool_cal>/thinkSTOPabx") for _ in range(rng.randint(0, 16)))
            assert _partial_suffix(text, marker) == by_every_length(text, marker), (text, marker)


def test_a_tool_calls_arguments_keep_the_text_the_model_wrote():
    """The arguments' own text, however the model spaced it, wherever they sit in the call, and with numbers that a
    float cannot hold (a 25-digit id): the harness sees exactly what was sampled."""
    from lego.proxy.reply import parse_tool_call

    cases = {
        '{"name": "bash", "arguments": {"command": "ls -la",   "n": 1}}': '{"command": "ls -la",   "n": 1}',
        '{"arguments": {"id": 1234567890123456789012345}, "name": "get"}': '{"id": 1234567890123456789012345}',
        '{"name": "get", "arguments": {"id": -9223372036854775809, "x": 1e400}}':
            '{"id": -9223372036854775809, "x": 1e400}',
        '{"name":"f","arguments":{"a":{"arguments":[1,2]}} }': '{"a":{"arguments":[1,2]}}',
        '{"name": "f", "arguments": {}}': "{}",
    }
    for body, arguments in cases.items():
        call = parse_tool_call(body)
        assert call is not None and call.arguments == arguments, body
        assert json.loads(call.arguments) == json.loads(body)["arguments"]
    assert parse_tool_call('{"name": "f", "arguments": [1]}') is None
    assert parse_tool_call('{"name": "f", "arguments": {"a": 1}') is None  # not JSON: stays in the text


def test_a_streamed_reply_is_read_once_by_the_streams_own_reader(tokenizer):
    """The session reads a streamed reply's whole text through the stream's reader (it has read most of it
    already): the reply is what `parse_reply` gives, and the stream's last events are the rest. A text that does not
    continue what was streamed is read apart, and finishing the stream then fails loudly."""
    from lego.proxy.render import ChatRenderer
    from lego.proxy.streaming import OpenAIChatWriter, ReplyStreamer

    renderer = ChatRenderer(tokenizer)
    options = {"model": "m", "parse_tools": True, "stop": ()}
    text = "I will run it.\n" + assistant_text("", [("bash", {"command": "ls"})])
    streamer = ReplyStreamer(None, OpenAIChatWriter(options, "m"), renderer, (151645,), options)
    streamed = streamer.decoder.feed(tokenizer.encode(text[:20], add_special_tokens=False))
    early = streamer.reader.feed(streamed)
    reply = streamer.read_reply(text)
    assert reply == parse_reply(text, True, renderer.thinking)
    events = early + streamer._last_events
    assert "".join(e.text for e in events if e.kind == "content") == reply.content
    assert [e.call for e in events if e.kind == "tool_call"] == reply.tool_calls

    other = ReplyStreamer(None, OpenAIChatWriter(options, "m"), renderer, (151645,), options)
    other.reader.feed(other.decoder.feed(tokenizer.encode("Something else", add_special_tokens=False)))
    assert other.read_reply(text) == parse_reply(text, True, renderer.thinking)
    other.response = object()  # (opened: finish goes straight to the check)

    class Done:
        reply = parse_reply(text)
        prompt_tokens = 3

    with pytest.raises(RuntimeError, match="not the start of the reply"):
        asyncio.run(other.finish(Done()))
