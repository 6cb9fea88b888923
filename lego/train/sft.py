"""Supervised fine-tuning on demonstrations (the warm start before RL).

The loss is the mean negative log-likelihood of the sampled tokens (response mask 1) only: the prompt, the
harness's system text and the tool observations are context, never targets, exactly as in the RL loss. Each
optimizer step takes one demonstration (`warmstart.step_batch`: one), a number of them, or all of them, cycled in
a seeded order so that every demonstration is seen equally often whatever the step count.
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
    """Fine-tune the policy at `model_path` on `samples` for `settings.steps` steps, or fewer: it stops at the end
    of the first pass over the demonstrations (`settings.step_batch` of them per step) whose
    mean loss is at most `settings.stop_at_loss`, or in which every demonstration's sampled tokens had at least
    `settings.stop_at_probability` together. The result is saved to `out_dir` as the next policy version. Returns
    the checkpoint and each step's metrics (loss, mean log-prob and accuracy of the sampled tokens, the least
    likely demonstration's log-prob, seconds)."""
    from lego.train.trainer import TrainBatch, Trainer

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
    steps = _step_indices(len(usable), settings, seed)
    demonstration_of = [sample.rollout_id for sample in usable]
    history: list[dict[str, float]] = []
    pass_logprob: dict[str, float] = {}  # each demonstration's log-prob, over the current pass
    for step, (indices, pass_ends) in zip(range(settings.steps), steps, strict=False):
        metrics, sequence_logprobs = _sft_step(trainer, batch, indices, settings.grad_clip, device)
        for index, logprob in zip(indices, sequence_logprobs, strict=True):
            pass_logprob[demonstration_of[index]] = pass_logprob.get(demonstration_of[index], 0.0) + logprob
        metrics["least_likely_demonstration_logprob"] = min(pass_logprob.values())
        if schedule is not None:
            schedule.step()
        history.append(metrics)
        if on_step is not None:
            on_step(step, metrics)
        if pass_ends:
            if _reached(history, pass_logprob, _steps_per_pass(len(usable), settings), settings):
                break
            pass_logprob = {}
    trainer.steps += len(history)  # the checkpoint's count goes on (Trainer starts from it)
    return trainer.save(out_dir), history


def _demonstrations_per_step(count: int, settings: WarmStartConfig) -> int:
    if settings.step_batch == "one":
        return 1
    if settings.step_batch == "all":
        return count
    return min(settings.step_batch, count)


def _steps_per_pass(count: int, settings: WarmStartConfig) -> int:
    return math.ceil(count / _demonstrations_per_step(count, settings))


def _step_indices(count: int, settings: WarmStartConfig, seed: int):
    """Each step's demonstrations and whether it ends a pass: each pass takes them all in a seeded order, a
    step's worth at a time, so that every demonstration is seen equally often whatever the step count."""
    shuffle, size = random.Random(seed), _demonstrations_per_step(count, settings)
    while True:
        if size == count:
            yield list(range(count)), True
            continue
        order = list(range(count))
        shuffle.shuffle(order)
        while order:
            taken, order = order[-size:], order[:-size]
            yield taken[::-1], not order


def _reached(history: list[dict[str, float]], pass_logprob: dict[str, float], steps_in_pass: int,
             settings: WarmStartConfig) -> bool:
    if settings.stop_at_probability is not None:
        if min(pass_logprob.values()) >= math.log(settings.stop_at_probability):
            return True
    if settings.stop_at_loss is not None:
        recent = history[-steps_in_pass:]
        if sum(entry["loss"] for entry in recent) / len(recent) <= settings.stop_at_loss:
            return True
    return False


def _sft_step(trainer, batch, indices: list[int], grad_clip: float, device: str) -> tuple[dict[str, float], list[float]]:
    """One optimizer step on the demonstrations `indices` (one forward and backward each, the loss their mean
    over all their sampled tokens). Returns the step's metrics and each one's log-prob (summed over its sampled
    tokens, before the update)."""
    from lego.train.trainer import collate, token_logprobs

    started = time.monotonic()
    masks = [collate(batch, [index], need_routing=False).response_mask for index in indices]
    tokens = float(sum(mask.sum() for mask in masks)) or 1.0
    trainer.optimizer.zero_grad(set_to_none=True)
    total, sampled, sequence_logprobs = 0.0, [], []
    for index, mask in zip(indices, masks, strict=True):
        micro = collate(batch, [index], need_routing=False)
        mask = mask.to(device)
        logprobs, _ = token_logprobs(trainer.model, micro.input_ids.to(device), mask, None, with_entropy=False)
        loss = -(logprobs * mask).sum() / tokens
        loss.backward()
        total += loss.item()
        with torch.no_grad():
            picked = logprobs[mask.bool()]
            sampled.append(picked)
            sequence_logprobs.append(float(picked.sum()))
    grad_norm = torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), grad_clip)
    learning_rate = float(trainer.optimizer.param_groups[0]["lr"])
    trainer.optimizer.step()
    picked = torch.cat(sampled)
    return ({"loss": total, "mean_logprob": float(picked.mean()),
             "token_accuracy": float((picked > np.log(0.5)).float().mean()), "grad_norm": float(grad_norm),
             "learning_rate": learning_rate, "tokens": tokens, "seconds": time.monotonic() - started},
            sequence_logprobs)
