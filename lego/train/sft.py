"""Supervised fine-tuning on demonstrations (the warm start before RL).

The loss is the mean negative log-likelihood of the sampled tokens (response mask 1) only: the prompt, the
harness's system text and the tool observations are context, never targets, exactly as in the RL loss. Each
optimizer step takes one demonstration, cycled in a seeded order, so that every demonstration is seen equally
often whatever the step count.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from lego.config import TrainConfig, WarmStartConfig
from lego.data.batches import TrainingSample, training_batch_fields
from lego.errors import LegoError


class NoDemonstrations(LegoError):
    """Nothing to fine-tune on: no demonstration was graded resolved, or none has a sampled token."""


def fine_tune(model_path: str | Path, samples: Sequence[TrainingSample], settings: WarmStartConfig,
              out_dir: str | Path, *, device: str = "cpu", seed: int = 0,
              on_step: Callable[[int, dict[str, float]], None] | None = None) -> tuple[Path, list[dict[str, float]]]:
    """Fine-tune the policy at `model_path` on `samples` for `settings.steps` steps, or fewer: with
    `settings.stop_at_loss`, it stops at the end of the first pass over the demonstrations (one step each) whose
    mean loss is at most that. The result is saved to `out_dir` as the next policy version. Returns the checkpoint
    and each step's metrics (loss, mean log-prob and accuracy of the sampled tokens, seconds)."""
    from lego.train.trainer import TrainBatch, Trainer, collate, token_logprobs

    usable = [sample for sample in samples if int(np.asarray(sample.response_mask)[1:].sum()) > 0]
    if not usable:
        raise NoDemonstrations("no demonstration with sampled tokens to fine-tune on; check that the warm start's "
                               "gold rollouts were graded resolved (lego data show) and sampling.max_tokens fits "
                               "the gold replies")
    trainer = Trainer(model_path, TrainConfig(lr=settings.lr, grad_clip=settings.grad_clip, router_replay="disabled",
                                              measure_routing_drift=False), device=device, seed=seed)
    batch = TrainBatch(**training_batch_fields(usable))
    schedule = None
    if settings.lr_schedule == "cosine":
        schedule = torch.optim.lr_scheduler.LambdaLR(
            trainer.optimizer, lambda step: 0.5 * (1.0 + math.cos(math.pi * min(step, settings.steps) / settings.steps)))
    order: list[int] = []
    shuffle = random.Random(seed)
    history: list[dict[str, float]] = []
    for step in range(settings.steps):
        if not order:
            order = list(range(len(usable)))
            shuffle.shuffle(order)
        index = order.pop()
        started = time.monotonic()
        micro = collate(batch, [index], need_routing=False)
        mask = micro.response_mask.to(device)
        logprobs, _ = token_logprobs(trainer.model, micro.input_ids.to(device), mask, None, with_entropy=False)
        tokens = mask.sum().clamp(min=1.0)
        loss = -(logprobs * mask).sum() / tokens
        trainer.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), settings.grad_clip)
        learning_rate = float(trainer.optimizer.param_groups[0]["lr"])
        trainer.optimizer.step()
        if schedule is not None:
            schedule.step()
        with torch.no_grad():
            sampled = logprobs[mask.bool()]
            metrics = {"loss": float(loss), "mean_logprob": float(sampled.mean()),
                       "token_accuracy": float((sampled > np.log(0.5)).float().mean()),
                       "grad_norm": float(grad_norm), "learning_rate": learning_rate, "tokens": float(tokens),
                       "seconds": time.monotonic() - started}
        history.append(metrics)
        if on_step is not None:
            on_step(step, metrics)
        if not order and settings.stop_at_loss is not None and len(history) >= len(usable):
            pass_loss = sum(entry["loss"] for entry in history[-len(usable):]) / len(usable)
            if pass_loss <= settings.stop_at_loss:
                break
    trainer.steps += len(history)  # the checkpoint's count goes on (Trainer starts from it)
    return trainer.save(out_dir), history
