"""`lego bench proxy`: what the proxy costs per call as a deployment sees it, beside a minimal pass-through.

Processes, as in a deployment: the client (every session's harness side) in its own process; an upstream stand-in
(an aiohttp server that answers every call at once with a fixed tool call, as an engine behind an HTTP API
would); the reference, a minimal aiohttp pass-through that forwards each request to the upstream and streams its
answer back; and the proxy (`ProxyServer` over an engine that answers at once with the same tool call). Each server
reports its own CPU time (`time.process_time`, every thread of the process), so the CPU per call is the server's
alone, whatever else runs on the machine.

Workload: `sessions` sessions (64) of `turns` turns (4) at once, each session's turns in sequence, for two prompt
shapes, each streamed and not:
- mini-swe-agent (OpenAI chat): an ~8 KB / ~2,100-token first prompt (system prompt, the task, one bash tool),
  then per turn the model's tool call and a ~1.5 KB observation as a tool message.
- Claude Code (Anthropic messages): an ~80 KB / ~16,700-token first prompt (a long system prompt in two blocks,
  17 tools with long descriptions), then per turn a tool_use and a ~2 KB tool_result.
Every session sends the same shared prefix (system prompt and tools), as every session of one harness does; its tool
results are its own (generated per session and turn, `FRESH_WORDS` of their words never seen before).

Measured per target (direct to the upstream, through the pass-through, through the proxy), first turns and later
turns apart (all sessions finish their first turn before any starts its second): the target server's CPU per call,
and the client's p50/p90 latency. `added_p50_ms` is a target's p50 minus the direct p50 in the same round; `ratio`
is proxy over pass-through: for CPU per call, per round and then the median over rounds (the targets of a round
run one after the other, so a slow spell of a shared machine touches both); for the added p50, of the medians (one
round's added p50 can be near zero or below). Each configuration runs `rounds` times, targets interleaved; the other
reported numbers are medians over rounds. `lego bench proxy -o sessions=8 -o turns=2 -o rounds=3` is a smaller run.

CPU time on a shared machine moves with its load (the pass-through's own CPU per call has been seen to triple
within an hour on a busy VM), so a difference of a few percent cannot be told from it. `-o measure=instructions`
counts instead: the pass-through and the proxy each run under valgrind's callgrind (which must be
installed), instrumented only while a phase's calls run, and each reports the instructions it executed per call, in
every thread. The count is the same from run to run to within about half a percent, whatever else the machine does;
one round is enough, latencies are not reported (valgrind slows the servers fifty-fold), and `direct` is not run.
With `-o profiles=DIR` as well, each phase's callgrind profile is kept in DIR as
`TARGET-SHAPE-MODE-PHASE.callgrind` (read it with `callgrind_annotate` or KCachegrind: where the instructions go).
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lego.bench import BenchError, register
from lego.bench.proxy_meters import UNMETERED, CpuMeter, InstructionMeter, Unmetered
from lego.config import LegoConfig
from lego.engine.base import GenerateResult, SamplingParams, TokenChunk
from lego.workdir import WorkDir

MEASURES = ("cpu", "instructions")
TARGETS = ("direct", "passthrough", "proxy")
TARGET_RATIO = 2.0  # the proxy's CPU per call and added p50 on later turns, at most this times the pass-through's
IM_END = 151645
STREAM_CHUNK_TOKENS = 4  # tokens per chunk the proxy's engine streams (a real engine streams one to a few)
STREAM_PIECE_CHARS = 14  # characters per event the upstream streams (about as many tokens)
# Words of a tool result that no earlier text has (paths, hashes, new identifiers): the rest is the repository's and
# the tools' own vocabulary, which the sessions of a rollout group share.
FRESH_WORDS = 0.01
START_TIMEOUT_S = 120.0


# ---------------------------------------------------------------------------------------------- workload

WORDS = ("the a to of and in is that for you it with as on be this are or by file command function test tool "
         "result output error code should must will can when if not use run read write edit path line directory "
         "repository change issue patch python bash git diff status commit branch search replace string number "
         "value default optional required parameter argument example important note always never instead before "
         "after each every only first last").split()
CODE = ["def", "return", "self", "import", "None", "True", "False", "class", "assert", "==", "()", "[]", "{}", "->",
        "x", "y", "i", "n", "args", "kwargs", "print", "calc.py", "test_calc.py", "./", "--", "-e", "`", '"', "'",
        ":", ",", "."]


def _text(rng: random.Random, size: int, code: float = 0.05, newlines: float = 0.08, fresh: float = 0.0) -> str:
    """Deterministic text of `size` characters, English words mixed with code at the given rate, and at the rate
    `fresh` words made up on the spot (names, paths, hashes no other text has)."""
    out, length = [], 0
    while length < size:
        if rng.random() < fresh:
            word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randint(5, 12)))
        else:
            word = rng.choice(CODE) if rng.random() < code else rng.choice(WORDS)
        out.append(word + ("\n" if rng.random() < newlines else " "))
        length += len(word) + 1
    return "".join(out)[:size]


@dataclass(frozen=True)
class Shape:
    name: str
    protocol: str  # openai_chat | anthropic_messages
    system: list[str]  # system prompt blocks
    user: str
    tools: list[dict[str, Any]]  # in the shape's protocol
    tool_name: str
    arguments: dict[str, Any]
    text: str  # what the model writes before its tool call
    observation_chars: int  # the size of each tool result

    @property
    def reply(self) -> str:
        """The model's reply as Qwen3 writes it (what the proxy's engine samples)."""
        call = json.dumps({"name": self.tool_name, "arguments": self.arguments})
        return f"{self.text}\n<tool_call>\n{call}\n</tool_call>"


def make_shapes() -> dict[str, Shape]:
    rng = random.Random(0)
    bash = {"type": "function", "function": {
        "name": "bash", "description": "Execute a bash command in the repository.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
    mini = Shape(name="mini_swe_agent", protocol="openai_chat", system=[_text(rng, 1400)],
                 user=_text(rng, 6600, code=0.75, newlines=0.15), tools=[bash], tool_name="bash",
                 arguments={"command": "python -m pytest -x test_calc.py"}, text="I will run the tests.",
                 observation_chars=1500)
    rng = random.Random(1)
    tools = [{"name": f"Tool{i}", "description": _text(rng, 2400),
              "input_schema": {"type": "object", "required": ["p0"], "properties": {
                  f"p{j}": {"type": "string", "description": _text(rng, 120)} for j in range(4)}}}
             for i in range(17)]
    claude = Shape(name="claude_code", protocol="anthropic_messages",
                   system=["You are Claude Code, Anthropic's official CLI for Claude.", _text(rng, 25500, code=0.03)],
                   user=_text(rng, 1200), tools=tools, tool_name="Tool0",
                   arguments={"p0": "python -m pytest -x test_calc.py", "p1": "Run the tests"},
                   text="I'll run the tests.", observation_chars=2000)
    return {mini.name: mini, claude.name: claude}


# ---------------------------------------------------------------------------------------------- client side


class Conversation:
    """One session's history in its protocol, grown turn by turn from the answers it gets."""

    def __init__(self, shape: Shape, base_url: str, stream: bool, seed: int = 0) -> None:
        self.shape, self.base_url, self.stream = shape, base_url, stream
        self.turn = 0
        self.seed = seed
        if shape.protocol == "openai_chat":
            self.messages: list[dict[str, Any]] = [{"role": "system", "content": shape.system[0]},
                                                   {"role": "user", "content": shape.user}]
        else:
            self.messages = [{"role": "user", "content": [{"type": "text", "text": shape.user}]}]

    def request(self) -> tuple[str, bytes]:
        shape = self.shape
        if shape.protocol == "openai_chat":
            body: dict[str, Any] = {"model": "policy", "messages": self.messages, "tools": shape.tools}
            if self.stream:
                body.update(stream=True, stream_options={"include_usage": True})
            return f"{self.base_url}/v1/chat/completions", json.dumps(body).encode()
        system = [{"type": "text", "text": text} for text in shape.system]
        system[-1]["cache_control"] = {"type": "ephemeral"}
        body = {"model": "policy", "max_tokens": 4096, "system": system, "tools": shape.tools,
                "messages": self.messages, "stream": self.stream}
        return f"{self.base_url}/v1/messages", json.dumps(body).encode()

    def answered(self, content: str, call_id: str, name: str, arguments: str) -> None:
        # every session's tool results are its own: test output, with names no other session's output has
        rng = random.Random(self.seed * 1000 + self.turn)
        observation = _text(rng, self.shape.observation_chars, code=0.5, newlines=0.15, fresh=FRESH_WORDS)
        self.turn += 1
        if self.shape.protocol == "openai_chat":
            self.messages += [{"role": "assistant", "content": content, "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]},
                {"role": "tool", "tool_call_id": call_id, "content": f"{self.turn}\n{observation}"}]
        else:
            self.messages += [{"role": "assistant", "content": [
                {"type": "text", "text": content},
                {"type": "tool_use", "id": call_id, "name": name, "input": json.loads(arguments)}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id,
                                              "content": f"{self.turn}\n{observation}"}]}]


async def _read_answer(response, conversation: Conversation) -> None:
    """Read one answer (JSON or SSE) and grow the conversation from it, as the harness would."""
    if response.status != 200:
        raise BenchError(f"{conversation.base_url} answered {response.status}: {(await response.text())[:500]}")
    openai = conversation.shape.protocol == "openai_chat"
    if not conversation.stream:
        body = await response.json()
        if openai:
            message = body["choices"][0]["message"]
            call = message["tool_calls"][0]
            conversation.answered(message.get("content") or "", call["id"], call["function"]["name"],
                                  call["function"]["arguments"])
        else:
            text = "".join(block["text"] for block in body["content"] if block["type"] == "text")
            use = next(block for block in body["content"] if block["type"] == "tool_use")
            conversation.answered(text, use["id"], use["name"], json.dumps(use["input"]))
        return
    text, call_id, name, arguments = [], "", "", []
    async for raw in response.content:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        if openai:
            for choice in event.get("choices") or []:
                delta = choice["delta"]
                text.append(delta.get("content") or "")
                for call in delta.get("tool_calls") or []:
                    call_id = call.get("id") or call_id
                    name = call.get("function", {}).get("name") or name
                    arguments.append(call.get("function", {}).get("arguments") or "")
        elif event["type"] == "content_block_start" and event["content_block"]["type"] == "tool_use":
            call_id, name = event["content_block"]["id"], event["content_block"]["name"]
        elif event["type"] == "content_block_delta":
            delta = event["delta"]
            text.append(delta.get("text", ""))
            arguments.append(delta.get("partial_json", ""))
    if not call_id:
        raise BenchError(f"a streamed answer from {conversation.base_url} had no tool call")
    conversation.answered("".join(text), call_id, name, "".join(arguments))


async def _turns(http, conversations: list[Conversation], turns: int) -> list[float]:
    latencies: list[float] = []

    async def one(conversation: Conversation) -> None:
        for _ in range(turns):
            url, body = conversation.request()
            start = time.perf_counter()
            async with http.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
                await _read_answer(response, conversation)
            latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(one(conversation) for conversation in conversations))
    return latencies


async def _client_main(conn) -> None:
    import aiohttp

    shapes = make_shapes()
    loop = asyncio.get_running_loop()
    conversations: list[Conversation] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=600)) as http:
        conn.send(("ready", None))
        while True:
            command, argument = await loop.run_in_executor(None, conn.recv)
            try:
                if command == "stop":
                    return
                if command == "begin":  # (shape, stream, base urls): every session's first turn
                    shape, stream, urls = argument
                    seed = random.randrange(1 << 30)  # fresh tool results in every run
                    conversations = [Conversation(shapes[shape], url, stream, seed + index)
                                     for index, url in enumerate(urls)]
                    conn.send(("ok", await _turns(http, conversations, 1)))
                elif command == "continue":  # the later turns
                    conn.send(("ok", await _turns(http, conversations, argument)))
            except Exception as exc:  # the orchestrator reports it
                conn.send(("error", f"{type(exc).__name__}: {exc}"))


def _client_process(conn) -> None:
    asyncio.run(_client_main(conn))


# ---------------------------------------------------------------------------------------------- upstream stand-in


def _sse(kind: str | None, data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {kind}\n" if kind else "").encode() + f"data: {payload}\n\n".encode()


def _pieces(text: str) -> list[str]:
    """A text as an engine's server streams it: a few tokens per event."""
    return [text[start:start + STREAM_PIECE_CHARS] for start in range(0, len(text), STREAM_PIECE_CHARS)] or [""]


def canned_answers(shape: Shape) -> tuple[bytes, list[bytes]]:
    """The upstream's answer to every call of a shape: the JSON body, and the SSE events of the streamed form (the
    text and the tool call's arguments a few tokens per event, as an engine's server with a tool parser sends)."""
    arguments = json.dumps(shape.arguments)
    if shape.protocol == "openai_chat":
        call = {"id": "call_0", "type": "function", "function": {"name": shape.tool_name, "arguments": arguments}}
        base = {"id": "chatcmpl-0", "object": "chat.completion.chunk", "created": 0, "model": "policy"}
        usage = {"prompt_tokens": 2000, "completion_tokens": 40, "total_tokens": 2040}
        body = {**base, "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": shape.text, "tool_calls": [call]}}], "usage": usage}

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return _sse(None, {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

        events = [chunk({"role": "assistant", "content": ""}),
                  *(chunk({"content": piece}) for piece in _pieces(shape.text)),
                  chunk({"tool_calls": [{"index": 0, "id": "call_0", "type": "function",
                                         "function": {"name": shape.tool_name, "arguments": ""}}]}),
                  *(chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
                    for piece in _pieces(arguments)),
                  chunk({}, "tool_calls"), _sse(None, {**base, "choices": [], "usage": usage}), _sse(None, "[DONE]")]
        return json.dumps(body).encode(), events
    usage = {"input_tokens": 16000, "output_tokens": 40}
    content = [{"type": "text", "text": shape.text},
               {"type": "tool_use", "id": "toolu_0", "name": shape.tool_name, "input": shape.arguments}]
    message = {"id": "msg_0", "type": "message", "role": "assistant", "model": "policy", "content": content,
               "stop_reason": "tool_use", "stop_sequence": None, "usage": usage}
    events = [_sse("message_start", {"type": "message_start", "message": {**message, "content": [],
                                                                          "stop_reason": None}}),
              _sse("ping", {"type": "ping"}),
              _sse("content_block_start", {"type": "content_block_start", "index": 0,
                                           "content_block": {"type": "text", "text": ""}}),
              *(_sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                             "delta": {"type": "text_delta", "text": piece}})
                for piece in _pieces(shape.text)),
              _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
              _sse("content_block_start", {"type": "content_block_start", "index": 1, "content_block": {
                  "type": "tool_use", "id": "toolu_0", "name": shape.tool_name, "input": {}}}),
              *(_sse("content_block_delta", {"type": "content_block_delta", "index": 1,
                                             "delta": {"type": "input_json_delta", "partial_json": piece}})
                for piece in _pieces(arguments)),
              _sse("content_block_stop", {"type": "content_block_stop", "index": 1}),
              _sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
                                     "usage": {"output_tokens": 40}}),
              _sse("message_stop", {"type": "message_stop"})]
    return json.dumps(message).encode(), events


def _post_app(handler):
    """An aiohttp app that answers every POST with `handler` (bodies up to 64 MiB: long sessions' requests)."""
    from aiohttp import web

    application = web.Application(client_max_size=64 * 1024 * 1024)
    application.router.add_post("/{tail:.*}", handler)
    return application


async def _serve(conn, make_app: Callable[[], Any], on_command: Callable[[str, Any], Any] | None = None) -> None:
    """Serve an aiohttp app on a free loopback port; answer control commands (cpu, stop, others) on `conn`."""
    from aiohttp import web

    runner = web.AppRunner(make_app(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    conn.send(("ready", port))
    loop = asyncio.get_running_loop()
    try:
        while True:
            command, argument = await loop.run_in_executor(None, conn.recv)
            if command == "stop":
                return
            if command == "cpu":
                conn.send(("ok", time.process_time()))
            elif on_command is not None:
                try:
                    conn.send(("ok", await on_command(command, argument)))
                except Exception as exc:
                    conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        await runner.cleanup()


def _upstream_process(conn) -> None:
    from aiohttp import web

    answers = {shape.protocol: canned_answers(shape) for shape in make_shapes().values()}

    async def answer(request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        protocol = "anthropic_messages" if request.path.endswith("/v1/messages") else "openai_chat"
        whole, events = answers[protocol]
        if not body.get("stream"):
            return web.Response(body=whole, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        for event in events:
            await response.write(event)
        await response.write_eof()
        return response

    asyncio.run(_serve(conn, lambda: _post_app(answer)))


def _passthrough_process(conn, upstream: str) -> None:
    """The reference: the least an HTTP hop in front of the engine does (forward the body, stream the answer)."""
    import aiohttp
    from aiohttp import web

    async def main() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            async def forward(request: web.Request) -> web.StreamResponse:
                body = await request.read()
                async with http.post(upstream + request.path_qs, data=body,
                                     headers={"Content-Type": "application/json"}) as answer:
                    kind = answer.headers.get("Content-Type", "application/json")
                    if not kind.startswith("text/event-stream"):
                        return web.Response(body=await answer.read(), status=answer.status,
                                            headers={"Content-Type": kind})
                    response = web.StreamResponse(status=answer.status, headers={"Content-Type": kind})
                    await response.prepare(request)
                    async for data in answer.content.iter_any():
                        await response.write(data)
                    await response.write_eof()
                    return response

            await _serve(conn, lambda: _post_app(forward))

    asyncio.run(main())


# ---------------------------------------------------------------------------------------------- the proxy


class InstantEngine:
    """Answers every prompt at once with the shape's tool call (streamed in small chunks): the proxy's own cost."""

    def __init__(self, tokenizer, max_context: int = 131072) -> None:
        self.tokenizer = tokenizer
        self.reply_ids: list[int] = [IM_END]
        self.max_context = max_context
        self.eos_token_ids = (IM_END,)
        self.policy_version = 0

    def answer_with(self, text: str) -> None:
        self.reply_ids = list(self.tokenizer.encode(text, add_special_tokens=False)) + [IM_END]

    def _result(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        ids = self.reply_ids[: sampling.max_tokens]
        return GenerateResult(token_ids=ids, logprobs=[-0.5] * len(ids), routed_experts=None,
                              finish_reason="stop" if ids[-1] == IM_END else "length", prompt_tokens=len(prompt_ids))

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        return self._result(prompt_ids, sampling)

    async def stream(self, prompt_ids: list[int], sampling: SamplingParams) -> AsyncIterator[TokenChunk]:
        result = self._result(prompt_ids, sampling)
        ids = result.token_ids
        for start in range(0, len(ids), STREAM_CHUNK_TOKENS):
            end = start + STREAM_CHUNK_TOKENS
            yield TokenChunk(ids[start:end], result if end >= len(ids) else None)

    async def score(self, token_ids: list[int]) -> list[float]:
        return [0.0] * len(token_ids)

    def load_checkpoint(self, path: str, policy_version: int) -> None:
        self.policy_version = policy_version


def _proxy_process(conn) -> None:
    # The proxy's own cost, with no engine: torch stays out of this process (transformers' tokenizers only probe
    # for it), which makes the start several times shorter, fifty-fold so under callgrind.
    if "torch" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]
    import transformers

    transformers.logging.set_verbosity_error()
    from lego.config import SamplingConfig
    from lego.engine.tokenizer import load_tokenizer
    from lego.proxy import ProxyServer

    tokenizer = load_tokenizer()
    shapes = make_shapes()
    engine = InstantEngine(tokenizer)

    async def main() -> None:
        server = await ProxyServer(engine, tokenizer, SamplingConfig(max_tokens=512), unix_socket=False).start()
        opened: list[str] = []
        loop = asyncio.get_running_loop()
        conn.send(("ready", server.port))
        try:
            while True:
                command, argument = await loop.run_in_executor(None, conn.recv)
                if command == "stop":
                    return
                try:
                    if command == "cpu":
                        conn.send(("ok", time.process_time()))
                    elif command == "open":  # (shape, sessions): fresh sessions answering with the shape's call
                        shape, count = argument
                        engine.answer_with(shapes[shape].reply)
                        sessions = [server.open_session() for _ in range(count)]
                        opened = [session.id for session in sessions]
                        conn.send(("ok", [session.base_url for session in sessions]))
                    elif command == "close":
                        for session_id in opened:
                            server.close_session(session_id)
                        opened = []
                        conn.send(("ok", None))
                except Exception as exc:
                    conn.send(("error", f"{type(exc).__name__}: {exc}"))
        finally:
            await server.stop()

    asyncio.run(main())


# ---------------------------------------------------------------------------------------------- orchestration


class _Child:
    def __init__(self, context, name: str, target, *args, executable: str | None = None) -> None:
        self.name = name
        self.conn, child_end = context.Pipe()
        self.process = context.Process(target=target, args=(child_end, *args), name=f"lego-bench-{name}", daemon=True)
        if executable is None:
            self.process.start()
        else:  # (spawn's executable is one setting for every process: set for this start only)
            from multiprocessing import spawn

            before = spawn.get_executable()
            spawn.set_executable(executable)
            try:
                self.process.start()
            finally:
                spawn.set_executable(before)
        self.ready = self.wait(START_TIMEOUT_S * (10 if executable else 1))

    def wait(self, timeout: float = 600.0):
        deadline = time.monotonic() + timeout
        while not self.conn.poll(1.0):
            if not self.process.is_alive():
                raise BenchError(f"the bench's {self.name} process exited with code {self.process.exitcode} "
                                 "(its error is printed above)")
            if time.monotonic() > deadline:
                raise BenchError(f"the bench's {self.name} process did not answer within {timeout:.0f} s")
        status, value = self.conn.recv()
        if status == "error":
            raise BenchError(f"the bench's {self.name} process failed: {value}")
        return value

    def ask(self, command: str, argument: Any = None, timeout: float = 600.0):
        self.conn.send((command, argument))
        return self.wait(timeout)

    def stop(self) -> None:
        if self.process.is_alive():
            try:
                self.conn.send(("stop", None))
            except OSError:
                pass
            self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)


def _latency(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"calls": len(ordered), "p50_ms": round(1000 * statistics.median(ordered), 3),
            "p90_ms": round(1000 * ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)], 3)}


def _run_target(target: str, servers: dict[str, _Child], client: _Child, shape: str, stream: bool,
                sessions: int, turns: int, meter: CpuMeter | InstructionMeter | Unmetered) -> dict[str, Any]:
    server = servers["upstream" if target == "direct" else target]
    if target == "proxy":
        urls = server.ask("open", (shape, sessions))
    else:
        urls = [f"http://127.0.0.1:{server.ready}/s/bench"] * sessions
    phases: dict[str, Any] = {}
    meter.start(server)
    first = client.ask("begin", (shape, stream, urls))
    label = f"{shape}-{'stream' if stream else 'non_stream'}"
    phases["first_turn"] = {**_latency(first), meter.key: meter.stop(server, f"{label}-first_turn") / len(first)}
    if turns > 1:
        meter.start(server)
        later = client.ask("continue", turns - 1)
        phases["later_turns"] = {**_latency(later),
                                 meter.key: meter.stop(server, f"{label}-later_turns") / len(later)}
    if target == "proxy":
        server.ask("close")
    return phases


def _median_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per target and phase, the median over rounds of each number (calls summed)."""
    merged: dict[str, Any] = {}
    for target in rounds[0]:
        merged[target] = {}
        for phase in rounds[0][target]:
            rows = [one[target][phase] for one in rounds]
            merged[target][phase] = {key: (sum(row[key] for row in rows) if key == "calls" else
                                           round(statistics.median(row[key] for row in rows), 3))
                                     for key in rows[0]}
    return merged


def _compare_instructions(merged: dict[str, Any]) -> dict[str, Any]:
    """Instructions per call of the pass-through and the proxy, and their ratio, per phase."""
    out: dict[str, Any] = {}
    for phase in merged["proxy"]:
        proxy = merged["proxy"][phase]["instructions_per_call"]
        passthrough = merged["passthrough"][phase]["instructions_per_call"]
        out[phase] = {"passthrough": {"instructions_per_call": round(passthrough)},
                      "proxy": {"instructions_per_call": round(proxy)},
                      "ratio": {"instructions_per_call": round(proxy / max(passthrough, 1.0), 3)}}
    return out


def _compare(merged: dict[str, Any], rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Added p50 (per round, against that round's direct p50) and the proxy / pass-through ratios."""
    out: dict[str, Any] = {}
    for phase in merged["proxy"]:
        row: dict[str, Any] = {}
        for target in ("passthrough", "proxy"):
            added = [one[target][phase]["p50_ms"] - one["direct"][phase]["p50_ms"] for one in rounds]
            row[target] = {"cpu_ms_per_call": merged[target][phase]["cpu_ms_per_call"],
                           "added_p50_ms": round(statistics.median(added), 3),
                           "p50_ms": merged[target][phase]["p50_ms"], "p90_ms": merged[target][phase]["p90_ms"]}
        row["direct"] = {"p50_ms": merged["direct"][phase]["p50_ms"],
                         "upstream_cpu_ms_per_call": merged["direct"][phase]["cpu_ms_per_call"]}
        proxy, passthrough = row["proxy"], row["passthrough"]
        # per round, then the median: the two ran seconds apart, so a machine's slow spell cancels out
        cpu_ratios = [one["proxy"][phase]["cpu_ms_per_call"] / max(one["passthrough"][phase]["cpu_ms_per_call"], 1e-9)
                      for one in rounds]
        row["ratio"] = {
            "cpu_per_call": round(statistics.median(cpu_ratios), 2),
            # The pass-through's added p50 is a fraction of a millisecond at low load: floored at 0.05 ms.
            "added_p50": round(max(proxy["added_p50_ms"], 0.0) / max(passthrough["added_p50_ms"], 0.05), 2)}
        out[phase] = row
    return out


def _count_tokens(tokenizer, shape: Shape) -> int:
    from lego.proxy import anthropic, openai_chat

    first = Conversation(shape, "", False)
    body = json.loads(first.request()[1])
    module = openai_chat if shape.protocol == "openai_chat" else anthropic
    conversation, _ = module.parse_request(body)
    return len(tokenizer.apply_chat_template(conversation.template_messages(), tools=conversation.tools or None,
                                             tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"])


def run_bench(sessions: int = 64, turns: int = 4, rounds: int = 7,
              shape_names: tuple[str, ...] = ("mini_swe_agent", "claude_code"),
              modes: tuple[bool, ...] = (False, True), measure: str = "cpu",
              profiles: Path | None = None) -> dict[str, Any]:
    from lego.engine.tokenizer import ensure_tokenizer, load_tokenizer

    if measure not in MEASURES:
        raise BenchError(f"unknown measure {measure!r}: use one of {', '.join(MEASURES)}")
    ensure_tokenizer()  # fetched once here, not by each process
    started = time.perf_counter()
    shapes = make_shapes()
    context = multiprocessing.get_context("spawn")  # no fork of a process with threads and a tokenizer
    children: list[_Child] = []
    scratch = tempfile.TemporaryDirectory(prefix="lego-bench-proxy-")
    meter = CpuMeter() if measure == "cpu" else InstructionMeter(Path(scratch.name), profiles)
    targets = TARGETS if measure == "cpu" else ("passthrough", "proxy")
    try:
        upstream = _Child(context, "upstream", _upstream_process)
        children.append(upstream)
        passthrough = _Child(context, "passthrough", _passthrough_process, f"http://127.0.0.1:{upstream.ready}",
                             executable=meter.executable("passthrough"))
        children.append(passthrough)
        proxy = _Child(context, "proxy", _proxy_process, executable=meter.executable("proxy"))
        children.append(proxy)
        client = _Child(context, "client", _client_process)
        children.append(client)
        servers = {"upstream": upstream, "passthrough": passthrough, "proxy": proxy}
        tokenizer = load_tokenizer()
        results: dict[str, Any] = {}
        for name in shape_names:
            shape = shapes[name]
            results[name] = {"protocol": shape.protocol, "first_prompt_tokens": _count_tokens(tokenizer, shape),
                             "first_request_kb": round(len(Conversation(shape, "", False).request()[1]) / 1024, 1)}
            for stream in modes:
                for target in targets:  # warm-up: connections, caches, the proxy's shared prefix (not measured)
                    _run_target(target, servers, client, name, stream, min(sessions, 4), min(turns, 2), UNMETERED)
                per_round = []
                for _ in range(rounds):
                    per_round.append({target: _run_target(target, servers, client, name, stream, sessions, turns,
                                                          meter)
                                      for target in targets})
                merged = _median_rounds(per_round)
                results[name]["stream" if stream else "non_stream"] = (
                    _compare(merged, per_round) if measure == "cpu" else _compare_instructions(merged))
    finally:
        for child in reversed(children):
            child.stop()
        scratch.cleanup()
    later = [results[name][mode]["later_turns"]["ratio"] for name in shape_names
             for mode in ("non_stream", "stream") if mode in results[name] and turns > 1]
    if measure == "cpu":
        met = bool(later) and all(r["cpu_per_call"] <= TARGET_RATIO and r["added_p50"] <= TARGET_RATIO for r in later)
    else:
        met = bool(later) and all(r["instructions_per_call"] <= TARGET_RATIO for r in later)
    return {"benchmark": "proxy", "measure": measure, "sessions": sessions, "turns": turns, "rounds": rounds,
            "cpu_count": os.cpu_count(), "results": results,
            "target": {"ratio_max": TARGET_RATIO, "later_turns_met": met},
            "wall_s": round(time.perf_counter() - started, 1)}


@register("proxy")
def bench_proxy(config: LegoConfig, work: WorkDir, sessions: int = 64, turns: int = 4, rounds: int | None = None,
                measure: str = "cpu", profiles: str | None = None) -> dict[str, Any]:
    if measure not in MEASURES:
        raise BenchError(f"measure={measure!r} is not a measure: use one of {', '.join(MEASURES)}")
    for name, value in (("sessions", sessions), ("turns", turns), ("rounds", rounds)):
        if value is not None and value < 1:
            raise BenchError(f"{name} must be at least 1, got {value}")
    # counting instructions is deterministic: one round tells what seven would
    return run_bench(sessions=sessions, turns=turns, rounds=rounds or (7 if measure == "cpu" else 1), measure=measure,
                     profiles=Path(profiles) if profiles else None)
