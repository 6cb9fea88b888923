"""`lego bench proxy`: what the proxy adds per call, against calling the engine directly.

Workload: mini-swe-agent-shaped sessions (an ~8 KB first prompt, one bash tool, then a tool call and a ~1.5 KB
observation per turn), each session running its turns in sequence, 1, 8 and 64 sessions at once. The same calls
go once straight to the engine (prompt ids already known) and once through the proxy over loopback HTTP with
the openai wire format (the proxy renders and tokenizes only the new messages). Engines: an instant engine
(a fixed reply, no compute: the proxy's own cost) and the tiny Qwen3-MoE. Client, proxy and engine share one
process and its cores, so absolute numbers include the client's own work.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
from typing import Any

import aiohttp

from lego.bench import register
from lego.config import LegoConfig, SamplingConfig
from lego.engine.base import GenerateResult, SamplingParams
from lego.workdir import WorkDir

SYSTEM = "You are a helpful assistant that can interact with a computer. " * 20
ISSUE = ("Please solve this issue: the function add() in calc.py returns a - b. " * 100)[:8000]
OBSERVATION = ("test_calc.py::test_add FAILED assert add(2, 3) == 5\n" * 30)[:1500]
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Execute a bash command",
                                            "parameters": {"type": "object",
                                                           "properties": {"command": {"type": "string"}},
                                                           "required": ["command"]}}}]
REPLY = 'I will run the tests.\n<tool_call>\n{"name": "bash", "arguments": {"command": "pytest -x"}}\n</tool_call>'


class InstantEngine:
    """Answers every prompt at once with the same tool-call reply: measures the proxy, not a model."""

    def __init__(self, tokenizer, max_context: int = 131072) -> None:
        self.reply_ids = list(tokenizer.encode(REPLY, add_special_tokens=False)) + [151645]
        self.max_context = max_context
        self.eos_token_ids = (151645,)
        self.policy_version = 0

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        ids = self.reply_ids[: sampling.max_tokens]
        return GenerateResult(token_ids=ids, logprobs=[-0.5] * len(ids), routed_experts=None,
                              finish_reason="stop" if len(ids) == len(self.reply_ids) else "length",
                              prompt_tokens=len(prompt_ids))

    async def score(self, token_ids: list[int]) -> list[float]:
        return [0.0] * len(token_ids)

    def load_checkpoint(self, path: str, policy_version: int) -> None:
        self.policy_version = policy_version


def _summary(latencies: list[float], wall: float) -> dict[str, float]:
    ordered = sorted(latencies)
    return {"calls": len(ordered), "p50_ms": round(1000 * statistics.median(ordered), 3),
            "p90_ms": round(1000 * ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)], 3),
            "calls_per_s": round(len(ordered) / wall, 1)}


async def _direct(engine, prompt_ids: list[int], sessions: int, turns: int, sampling: SamplingParams) -> dict:
    latencies: list[float] = []

    async def one() -> None:
        for _ in range(turns):
            start = time.perf_counter()
            await engine.generate(prompt_ids, sampling)
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(sessions)))
    return _summary(latencies, time.perf_counter() - start)


async def _through_proxy(server, sessions: int, turns: int) -> dict:
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        async def one() -> None:
            session = server.open_session()
            messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                                              {"role": "user", "content": ISSUE}]
            for turn in range(turns):
                body = json.dumps({"model": "policy", "messages": messages, "tools": TOOLS})
                start = time.perf_counter()
                async with http.post(f"{session.openai_base_url}/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"}) as response:
                    answer = await response.json()
                latencies.append(time.perf_counter() - start)
                message = answer["choices"][0]["message"]
                message.pop("reasoning_content", None)
                messages.append(message)
                call_id = (message.get("tool_calls") or [{"id": "none"}])[0]["id"]
                messages.append({"role": "tool", "tool_call_id": call_id, "content": f"{turn}\n{OBSERVATION}"})
            server.close_session(session.id)

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(sessions)))
        return _summary(latencies, time.perf_counter() - start)


async def _compare(engine, tokenizer, label: str, concurrency: list[int], turns: int, max_tokens: int) -> dict:
    from lego.proxy import ProxyServer

    sampling = SamplingConfig(max_tokens=max_tokens)
    params = SamplingParams(max_tokens=max_tokens, stop_token_ids=tuple(engine.eos_token_ids))
    prompt = tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": ISSUE}],
                                           tools=TOOLS, tokenize=True, add_generation_prompt=True,
                                           return_dict=True)["input_ids"]
    results: dict[str, Any] = {"engine": label, "prompt_tokens_first_call": len(prompt), "turns_per_session": turns}
    async with ProxyServer(engine, tokenizer, sampling, unix_socket=False) as server:
        await engine.generate(list(prompt), params)  # warm-up
        await _through_proxy(server, 1, 1)
        for sessions in concurrency:
            direct = await _direct(engine, list(prompt), sessions, turns, params)
            proxied = await _through_proxy(server, sessions, turns)
            results[f"c{sessions}"] = {"direct": direct, "proxy": proxied,
                                       "added_p50_ms": round(proxied["p50_ms"] - direct["p50_ms"], 3)}
    return results


@register("proxy")
def bench_proxy(config: LegoConfig, work: WorkDir) -> dict[str, Any]:
    from lego.engine.checkpoint import default_model_path, init_tiny_model
    from lego.engine.tokenizer import load_tokenizer
    from lego.engine.transformers_engine import TransformersEngine

    tokenizer = load_tokenizer()
    started = time.perf_counter()
    instant = asyncio.run(_compare(InstantEngine(tokenizer), tokenizer, "instant", [1, 8, 64], turns=4,
                                   max_tokens=64))
    model_path = init_tiny_model(config.model.init, default_model_path(config, work), seed=config.project.seed)
    engine = TransformersEngine(model_path, dtype="float32", device="cpu", max_batch_size=config.engine.max_batch_size,
                                batch_wait_ms=config.engine.batch_wait_ms)
    try:
        tiny = asyncio.run(_compare(engine, tokenizer, "tiny-qwen3-moe", [1, 8, 64], turns=1, max_tokens=8))
    finally:
        engine.close()
    return {"benchmark": "proxy", "instant": instant, "tiny_model": tiny,
            "wall_s": round(time.perf_counter() - started, 1)}
