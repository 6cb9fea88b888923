"""`lego bench r3`: how closely training log-probs match inference log-probs, with and without R3.

Inference runs in the engine's dtype (bf16 by default) and samples real trajectories from the policy; the
training forward runs in the trainer's dtype (fp32 by default) over the same tokens, once replaying the
recorded routing and once letting the routers choose. Goal: Pearson >= 0.999 with R3.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import torch

from lego.bench import register
from lego.config import LegoConfig
from lego.engine.base import SamplingParams
from lego.errors import ConfigError
from lego.workdir import WorkDir

USER_TEXTS = [
    "Fix the failing test in tests/test_parser.py: the parser drops trailing commas.",
    "The CLI crashes with KeyError: 'path' when the config file has no [paths] section.",
    "Add a --dry-run flag to the deploy command that prints what would change.",
    "Our cache never expires entries; make ttl_seconds work as documented.",
    "Sorting by date puts None values first; they should go last.",
    "Refactor utils.retry to accept a backoff multiplier and a maximum delay.",
    "Unicode file names break the archive extractor on Windows paths.",
    "The JSON encoder should serialise Decimal values as strings, not floats.",
]


def _prompts(tokenizer, count: int) -> list[list[int]]:
    prompts = []
    for i in range(count):
        messages = [{"role": "system", "content": "You are a careful software engineer."},
                    {"role": "user", "content": USER_TEXTS[i % len(USER_TEXTS)]}]
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts.append(tokenizer.encode(rendered, add_special_tokens=False))
    return prompts


def _stats(train: np.ndarray, inference: np.ndarray) -> dict[str, float]:
    delta = np.abs(train - inference)
    return {"pearson": float(np.corrcoef(train, inference)[0, 1]), "mean_abs_diff": float(delta.mean()),
            "max_abs_diff": float(delta.max())}


def sample_from_policy(config: LegoConfig, work: WorkDir, trajectories: int, max_tokens: int):
    """The config's policy (a seeded random-init one is written when missing) samples `trajectories` replies at
    temperature 1 on the config's engine (`engine.kind`: transformers or vllm) in its dtype: (model path, prompts,
    GenerateResults with log-probs and the routing that engine recorded)."""
    from lego.engine.checkpoint import default_model_path, init_tiny_model
    from lego.engine.factory import make_engine
    from lego.engine.tokenizer import load_tokenizer

    model_path = default_model_path(config, work)
    if not (model_path / "config.json").is_file():
        init_tiny_model(config.model.init, model_path, seed=config.project.seed)
    prompts = _prompts(load_tokenizer(model_path), trajectories)
    if config.engine.kind == "scripted":
        raise ConfigError("bench r3 samples from the policy; use engine.kind=transformers or vllm, not scripted")
    engine = make_engine(config, model_path)
    try:
        async def sample():
            return await asyncio.gather(*[
                engine.generate(prompt, SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=i))
                for i, prompt in enumerate(prompts)])

        results = asyncio.run(sample())
    finally:
        engine.close()
    return model_path, prompts, results


@register("r3")
def bench_r3(config: LegoConfig, work: WorkDir, trajectories: int = 16, max_tokens: int = 96) -> dict[str, Any]:
    from lego.train.replay import routing_difference_share
    from lego.train.trainer import token_logprobs

    started = time.perf_counter()
    model_path, prompts, results = sample_from_policy(config, work, trajectories, max_tokens)
    sampled_s = time.perf_counter() - started

    from lego.engine.checkpoint import load_model

    model = load_model(model_path, config.train.dtype, config.engine.device)
    inference, with_r3, without_r3, drift_tokens, total_tokens = [], [], [], 0.0, 0
    with torch.no_grad():
        for prompt, result in zip(prompts, results, strict=True):
            ids = torch.tensor([prompt + result.token_ids], device=config.engine.device)
            labels = torch.zeros((1, ids.shape[1] - 1))
            labels[0, len(prompt) - 1:] = 1
            routed = torch.as_tensor(result.routed_experts)[None]
            replayed, _ = token_logprobs(model, ids, labels, routed, with_entropy=False)
            free, _ = token_logprobs(model, ids, labels, None, with_entropy=False)
            with_r3.append(replayed[0, len(prompt) - 1:].cpu().numpy())
            without_r3.append(free[0, len(prompt) - 1:].cpu().numpy())
            inference.append(np.asarray(result.logprobs, dtype=np.float32))
            share = routing_difference_share(model, ids, routed)
            drift_tokens += share * ids.shape[1]
            total_tokens += ids.shape[1]
    inference_all = np.concatenate(inference)
    return {
        "model": str(model_path),
        "engine": config.engine.kind,
        "inference_dtype": config.engine.dtype,
        "training_dtype": config.train.dtype,
        "trajectories": len(results),
        "sampled_tokens": int(len(inference_all)),
        "with_r3": _stats(np.concatenate(with_r3), inference_all),
        "without_r3": _stats(np.concatenate(without_r3), inference_all),
        "routing_differs_share": drift_tokens / max(total_tokens, 1),
        "goal_pearson_with_r3": 0.999,
        "seconds": {"sample": round(sampled_s, 2), "total": round(time.perf_counter() - started, 2)},
    }
