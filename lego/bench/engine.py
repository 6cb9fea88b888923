"""`lego bench engine`: the transformers and vLLM engines side by side on the same checkpoint and prompts.

Each engine is made as `engine.kind` makes it (lego.engine.factory), in the config's dtype, over the config's tiny
policy (`-c vllm`: the default's Qwen3-MoE with head_dim 32, which vLLM's CPU attention accepts). For each level of
concurrency it sends that many rollout-sized requests at once (a prompt of `prompt_tokens`, a harness's first
prompt being 1-25k tokens; `max_tokens` sampled each, no stop token, so both engines sample the same number) and
reports sampled tokens per second over the batch's wall time, the mean time per request and time to its first
token (streamed). Also each engine's start-up (and its first request, a warm-up) and the time of a weight update (load_checkpoint of the same
checkpoint: in place in vLLM). The engines run one after the other, never at once. A benchmark, not a test.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

from lego.bench import register
from lego.config import LegoConfig
from lego.errors import LegoError
from lego.workdir import WorkDir


def _prompt(tokenizer, tokens: int, salt: int) -> list[int]:
    """A chat prompt of exactly `tokens` ids: a system message of repeated text, then the user's `salt`, so that no
    two requests share a prompt (no engine serves one from another's prefix)."""
    filler = tokenizer.encode(" You are a coding agent working in a repository; run commands and fix the bug.")
    head = tokenizer.encode("<|im_start|>system\n")
    tail = tokenizer.encode(f"<|im_end|>\n<|im_start|>user\nRequest {salt}.<|im_end|>\n<|im_start|>assistant\n")
    body = (filler * (tokens // max(len(filler), 1) + 1))[: max(tokens - len(head) - len(tail), 1)]
    return head + body + tail


async def _timed(engine, prompt: list[int], sampling) -> dict[str, float]:
    started = time.perf_counter()
    first = None
    tokens = 0
    async for chunk in engine.stream(prompt, sampling):
        if first is None and chunk.token_ids:
            first = time.perf_counter() - started
        if chunk.result is not None:
            tokens = len(chunk.result.token_ids)
    return {"seconds": time.perf_counter() - started, "ttft_s": first or 0.0, "tokens": tokens}


async def _level(engine, prompts: list[list[int]], sampling) -> dict[str, Any]:
    started = time.perf_counter()
    runs = await asyncio.gather(*[_timed(engine, prompt, sampling) for prompt in prompts])
    wall = time.perf_counter() - started
    tokens = sum(run["tokens"] for run in runs)
    return {"concurrency": len(prompts), "wall_s": round(wall, 2), "sampled_tokens": tokens,
            "tokens_per_s": round(tokens / wall, 1),
            "mean_request_s": round(statistics.mean(run["seconds"] for run in runs), 2),
            "mean_ttft_s": round(statistics.mean(run["ttft_s"] for run in runs), 3)}


def bench_one(config: LegoConfig, kind: str, model_path: Path, levels: list[int], prompt_tokens: int,
              max_tokens: int) -> dict[str, Any]:
    from lego.engine.base import SamplingParams
    from lego.engine.factory import make_engine
    from lego.engine.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model_path)
    engine_config = config.model_copy(update={"engine": config.engine.model_copy(update={"kind": kind})})
    started = time.perf_counter()
    engine = make_engine(engine_config, model_path)
    startup = time.perf_counter() - started
    try:
        sampling = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=max_tokens, seed=0)
        warm = asyncio.run(_level(engine, [_prompt(tokenizer, prompt_tokens, -1)], sampling))  # warm-up
        rows = [asyncio.run(_level(engine, [_prompt(tokenizer, prompt_tokens, level * 1000 + i)
                                            for i in range(level)], sampling)) for level in levels]
        loaded = time.perf_counter()
        engine.load_checkpoint(model_path, 1)
        update = time.perf_counter() - loaded
    finally:
        engine.close()
    # The first request's wall time beside the start-up: an engine may finish loading in the background.
    return {"kind": kind, "dtype": config.engine.dtype, "startup_s": round(startup, 1),
            "first_request_s": warm["wall_s"], "weight_update_s": round(update, 3), "levels": rows}


@register("engine")
def bench_engine(config: LegoConfig, work: WorkDir, engines: str = "transformers,vllm", concurrency: str = "1,8",
                 prompt_tokens: int = 2048, max_tokens: int = 128) -> dict[str, Any]:
    """`engines`, `concurrency`: comma-separated; `prompt_tokens`, `max_tokens`: each request's size."""
    from lego.engine.checkpoint import default_model_path, init_tiny_model

    kinds = [kind.strip() for kind in engines.split(",") if kind.strip()]
    levels = [int(level) for level in concurrency.split(",") if level.strip()]
    if not kinds or not levels or min(levels) < 1:
        raise LegoError("bench engine: engines and concurrency need at least one entry each (concurrency >= 1)")
    model_path = Path(config.model.path) if config.model.path else default_model_path(config, work)
    if not (model_path / "config.json").is_file():
        init_tiny_model(config.model.init, model_path, seed=config.project.seed)
    results = [bench_one(config, kind, model_path, levels, prompt_tokens, max_tokens) for kind in kinds]
    return {"model": str(model_path), "model_init": config.model.init.model_dump(), "prompt_tokens": prompt_tokens,
            "max_tokens": max_tokens, "engines": results}
