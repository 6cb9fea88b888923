"""`lego bench train`: the trainer's optimizer steps on the configured device, with and without R3.

Trajectories are sampled by the engine from the config's policy (a random-init Qwen3-MoE is written when none
exists) in the engine's dtype, then the real `Trainer` takes optimizer steps on them in the training dtype, once
replaying the recorded routing (R3) and once letting the routers choose. It reports the seconds per step, the
sampled tokens trained per second and the train/inference log-prob Pearson of each mode (the trainer's own metric,
measured before the first update). `scripts/gpu_check.sh` runs it with a large model on CUDA.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from lego.bench import register
from lego.config import LegoConfig
from lego.workdir import WorkDir


@register("train")
def bench_train(config: LegoConfig, work: WorkDir, trajectories: int = 8, max_tokens: int = 64,
                steps: int = 2) -> dict[str, Any]:
    import torch

    from lego.bench.r3 import sample_from_policy
    from lego.train.trainer import TrainBatch, Trainer

    started = time.perf_counter()
    device = config.engine.device
    model_path, prompts, results = sample_from_policy(config, work, trajectories, max_tokens)
    sampled_s = time.perf_counter() - started

    ids, masks, logprobs, routing = [], [], [], []
    for prompt, result in zip(prompts, results, strict=True):
        ids.append(np.array(prompt + result.token_ids, dtype=np.int32))
        masks.append(np.array([0] * len(prompt) + [1] * len(result.token_ids), dtype=np.uint8))
        logprobs.append(np.array([0.0] * len(prompt) + list(result.logprobs), dtype=np.float32))
        routing.append(np.asarray(result.routed_experts) if result.routed_experts is not None else None)
    # Alternating advantages: every sequence has signal, so none is skipped and each step trains them all.
    advantages = [1.0 if i % 2 == 0 else -1.0 for i in range(len(ids))]
    sampled_tokens = int(sum(int(mask.sum()) for mask in masks))

    modes: dict[str, Any] = {}
    for mode, replay in (("with_r3", "R3"), ("without_r3", "disabled")):
        train_config = config.train.model_copy(update={"router_replay": replay, "epochs": 1})
        trainer = Trainer(model_path, train_config, device=device, seed=config.project.seed)
        step_seconds: list[float] = []
        first: dict[str, float] = {}
        for step in range(steps):
            batch = TrainBatch(ids, masks, logprobs, advantages, routing if replay == "R3" else None)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            began = time.perf_counter()
            metrics = trainer.step(batch)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            step_seconds.append(time.perf_counter() - began)
            if step == 0:
                first = metrics
        modes[mode] = {
            "step_seconds": [round(s, 3) for s in step_seconds],
            # the first step includes one-time work (allocations, kernels); the rest are the steady state
            "steady_step_seconds": round(float(np.mean(step_seconds[1:] or step_seconds)), 3),
            "sampled_tokens_per_second": round(sampled_tokens / float(np.mean(step_seconds[1:] or step_seconds)), 1),
            "logprob_pearson": _finite(first.get("logprob_pearson")),
            "logprob_abs_diff_mean": first.get("logprob_abs_diff_mean"),
            "routing_differs_share": _finite(first.get("routing_differs_share")),
            "grad_norm": first.get("grad_norm"),
        }
    return {
        "model": str(model_path),
        "device": device,
        "inference_dtype": config.engine.dtype,
        "training_dtype": config.train.dtype,
        "layers": config.model.init.num_hidden_layers,
        "experts": config.model.init.num_experts,
        "trajectories": len(ids),
        "sampled_tokens": sampled_tokens,
        "sequence_tokens": int(sum(len(seq) for seq in ids)),
        **modes,
        "seconds": {"sample": round(sampled_s, 2), "total": round(time.perf_counter() - started, 2)},
    }


def _finite(value: float | None) -> float | None:
    """None for a metric that was not measured (NaN): the result must stay valid JSON."""
    return None if value is None or value != value else float(value)
