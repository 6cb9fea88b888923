"""The policy trainer: verl's losses on a transformers model, with R3 routing replay, saving policy versions.

Input is a `TrainBatch` (lists of numpy arrays, one entry per token sequence, as the data layer stores segments).
Log-probs are computed in the training dtype (fp32 by default) with the inference routing replayed; the loss is
verl's own (`get_policy_loss_fn`, `agg_loss`, `kl_penalty`; `entropy_from_logits`, `masked_mean`; log-probs by
the arithmetic of `logprobs_from_logits`, see `token_logprobs`), aggregated over the whole batch even when it is
split into micro-batches (verl's `global_batch_info`), so gradient accumulation gives the gradient of the
full-batch loss.

Sequences without signal are never computed: a sequence whose sampled tokens all have advantage 0 adds nothing to
the policy loss, so the step skips it (no forward, no backward); a GRPO group without reward variance has only
such sequences and is not scored at all. The loss keeps the whole batch's token and sequence counts as its
denominators, so the gradient is exactly verl's on the whole batch. The KL and entropy terms use every sampled
token, advantage or not: with `kl_coef > 0` or `entropy_coeff > 0` the zero-advantage sequences are trained too.
A batch where nothing is left to train returns at once with `optimizer_steps: 0` and leaves the weights as they are.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel

from lego.config import TrainConfig
from lego.engine.checkpoint import MARKER, load_model, moe_routers
from lego.engine.checkpoint import policy_version as read_policy_version
from lego.errors import LegoError
from lego.train.replay import RoutingReplayError, replay_routing, routing_difference_share

# |advantage| at or below this is no signal: the GRPO advantage of a group without reward variance is 0 up to
# float noise from the SQL mean/std; lego.pipeline.dataset_stage counts non-zero advantages with the same bound.
SIGNAL_EPSILON = 1e-9
# LM-head rows per log-softmax: vectorised over the vocabulary, with a transient [rows, vocab] float32 of ~150 MB
# for Qwen3's 152k tokens.
LOGIT_ROWS = 256

# The optimizer's state beside the weights of a policy checkpoint, so that the next train stage continues one
# optimization (as verl's actor, whose checkpoints carry their optimizer) instead of restarting Adam each
# iteration: a fresh Adam's first steps move every weight by about the learning rate whatever the size of its
# gradient (m / sqrt(v) is the gradient's sign), and on a policy that has just memorized its demonstrations,
# GRPO's small, noisy gradients then move it in directions its signal never asked for. Measured on the learn
# configuration's warm start (exact reproduction of the first gold reply, 8 samples per task, 4 tasks): one RL
# iteration with a fresh Adam at lr 1e-3 (4 epochs) took the rate from 0.69 to 0.25.
OPTIMIZER_STATE = "optimizer.pt"

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "vocab.json", "merges.txt", "added_tokens.json", "generation_config.json")


class TrainError(LegoError):
    """The batch or the trainer's settings cannot be trained on."""


class OptimizerStep(BaseModel):
    """One optimizer step's metrics, computed on that step's own micro-batches (each epoch is one step)."""

    # The policy's optimizer steps so far, this one included: it goes on from the checkpoint's count (its
    # lego_model.json `train_steps`), so the steps of successive train stages follow each other on one axis.
    step: int
    epoch: int
    loss: float
    entropy: float
    kl_to_inference: float
    logprob_pearson: float | None  # None when undefined (fewer than 2 tokens, or constant log-probs)
    grad_norm: float
    learning_rate: float  # the rate this step was taken with
    clip_fraction: float
    response_tokens: int
    step_seconds: float  # wall time of this step (its forward and backward passes and the update)

    def metrics(self) -> dict[str, float]:
        """The defined values as floats (what MLflow and the train_steps table take)."""
        return {name: float(value) for name, value in self.model_dump(exclude={"step"}).items() if value is not None}


@dataclass
class TrainBatch:
    """Sequences to train on. Sequence i has T_i tokens: prompt/tool tokens and sampled tokens, in order.

    input_ids[i]:          int [T_i]
    response_mask[i]:      uint8 [T_i], 1 exactly on tokens the engine sampled (they get the loss)
    inference_logprobs[i]: float32 [T_i], the engine's log-prob of each sampled token (0 elsewhere)
    advantages[i]:         a float (per sequence, put on its sampled tokens) or float32 [T_i] (per token)
    routed_experts[i]:     uint8 [T_i, layers, top_k] recorded at inference, or None (dense model / no R3)
    old_logprobs:          optional [T_i] per sequence: the PPO "old" policy; default = inference_logprobs
                           (on-policy: the sampling policy is the old policy, as in verl's bypass mode)
    ref_logprobs:          optional [T_i] per sequence: a reference policy, needed only when kl_coef > 0
    group_ids:             optional, per sequence: its GRPO group (the task id within an iteration; the segments
                           of one rollout share it), only to count the groups that had signal
    """

    input_ids: list[np.ndarray]
    response_mask: list[np.ndarray]
    inference_logprobs: list[np.ndarray]
    advantages: list[float | np.ndarray]
    routed_experts: list[np.ndarray | None] | None = None
    old_logprobs: list[np.ndarray] | None = None
    ref_logprobs: list[np.ndarray] | None = None
    group_ids: list[str] | None = None

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        columns = {"response_mask": self.response_mask, "inference_logprobs": self.inference_logprobs,
                   "advantages": self.advantages, "routed_experts": self.routed_experts,
                   "old_logprobs": self.old_logprobs, "ref_logprobs": self.ref_logprobs,
                   "group_ids": self.group_ids}
        for name, column in columns.items():
            if column is not None and len(column) != n:
                raise TrainError(f"TrainBatch.{name} has {len(column)} entries for {n} sequences")
        for i, ids in enumerate(self.input_ids):
            length = len(ids)
            for name in ("response_mask", "inference_logprobs", "old_logprobs", "ref_logprobs"):
                column = getattr(self, name)
                if column is not None and len(column[i]) != length:
                    raise TrainError(f"sequence {i}: {name} has {len(column[i])} entries for {length} tokens")
            advantage = self.advantages[i]
            if not np.isscalar(advantage) and len(advantage) != length:
                raise TrainError(f"sequence {i}: advantages has {len(advantage)} entries for {length} tokens")
            if self.routed_experts is not None and self.routed_experts[i] is not None:
                if self.routed_experts[i].shape[0] != length:
                    raise RoutingReplayError(
                        f"sequence {i}: routed_experts has {self.routed_experts[i].shape[0]} rows for {length} "
                        "tokens; the record must have one row per token"
                    )

    def __len__(self) -> int:
        return len(self.input_ids)

    def label_tokens(self, i: int) -> int:
        """Sampled tokens of sequence i that are labels (from position 1 on: nothing predicts token 0)."""
        return int(np.asarray(self.response_mask[i])[1:].sum())

    def has_signal(self) -> list[bool]:
        """Per sequence: True when some sampled label token has a non-zero advantage (it moves the policy loss)."""
        flags = []
        for i, advantage in enumerate(self.advantages):
            labels = np.asarray(self.response_mask[i])[1:].astype(bool)
            if np.isscalar(advantage):
                flags.append(bool(labels.any()) and abs(float(advantage)) > SIGNAL_EPSILON)
            else:
                per_token = np.abs(np.asarray(advantage, dtype=np.float64)[1:][labels])
                flags.append(bool((per_token > SIGNAL_EPSILON).any()))
        return flags

    def with_negative_advantages_scaled(self, weight: float) -> TrainBatch:
        """The same batch with every negative advantage (per sequence or per token) times `weight`."""
        def scaled(advantage):
            if np.isscalar(advantage):
                return float(advantage) * weight if advantage < 0 else advantage
            values = np.asarray(advantage, dtype=np.float32)
            return np.where(values < 0, values * np.float32(weight), values)

        return replace(self, advantages=[scaled(advantage) for advantage in self.advantages])


@dataclass
class MicroBatch:
    """Right-padded tensors; columns are label positions (token t+1 predicted at position t)."""

    input_ids: torch.Tensor  # long [B, T]
    response_mask: torch.Tensor  # float [B, T-1]
    inference_logprobs: torch.Tensor  # float [B, T-1]
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None
    advantages: torch.Tensor  # float [B, T-1]
    routed_experts: torch.Tensor | None  # uint8 [B, T, layers, top_k]
    real_tokens: torch.Tensor  # bool [B, T]: False on padding


def plan_micro_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Consecutive groups whose padded size (count x longest) fits the budget; a longer sequence goes alone."""
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index, length in enumerate(lengths):
        if current and (len(current) + 1) * max(longest, length) > token_budget:
            groups.append(current)
            current, longest = [], 0
        current.append(index)
        longest = max(longest, length)
    if current:
        groups.append(current)
    return groups


def collate(batch: TrainBatch, indices: list[int], need_routing: bool) -> MicroBatch:
    """Pad `indices` of the batch into tensors; routing is kept when every sequence has it (required if
    `need_routing`)."""
    width = max(len(batch.input_ids[i]) for i in indices)
    size = len(indices)
    ids = torch.zeros((size, width), dtype=torch.long)
    mask = torch.zeros((size, width))
    inference = torch.zeros((size, width))
    old = torch.zeros((size, width))
    ref = torch.zeros((size, width)) if batch.ref_logprobs is not None else None
    advantages = torch.zeros((size, width))
    routed = None
    real = torch.zeros((size, width), dtype=torch.bool)
    for row, i in enumerate(indices):
        n = len(batch.input_ids[i])
        real[row, :n] = True
        ids[row, :n] = torch.as_tensor(np.asarray(batch.input_ids[i], dtype=np.int64))
        mask[row, :n] = torch.as_tensor(np.asarray(batch.response_mask[i], dtype=np.float32))
        inference[row, :n] = torch.as_tensor(np.asarray(batch.inference_logprobs[i], dtype=np.float32))
        source = batch.old_logprobs[i] if batch.old_logprobs is not None else batch.inference_logprobs[i]
        old[row, :n] = torch.as_tensor(np.asarray(source, dtype=np.float32))
        if ref is not None:
            ref[row, :n] = torch.as_tensor(np.asarray(batch.ref_logprobs[i], dtype=np.float32))
        advantage = batch.advantages[i]
        advantages[row, :n] = float(advantage) if np.isscalar(advantage) else torch.as_tensor(
            np.asarray(advantage, dtype=np.float32))
        record = batch.routed_experts[i] if batch.routed_experts is not None else None
        has_all = batch.routed_experts is not None and all(batch.routed_experts[j] is not None for j in indices)
        if need_routing or has_all:
            if record is None:
                raise RoutingReplayError(
                    f"sequence {i} has no routing record but R3 replay is on; record routing at inference "
                    "(engine routed_experts) or set train.router_replay=disabled"
                )
            if routed is None:
                routed = torch.zeros((size, width, *record.shape[1:]), dtype=torch.uint8)
            if tuple(record.shape[1:]) != tuple(routed.shape[2:]):
                raise RoutingReplayError(f"sequence {i}: routing record shape {record.shape} differs from the "
                                         f"others in its micro-batch ({tuple(routed.shape[1:])})")
            routed[row, :n] = torch.as_tensor(np.asarray(record, dtype=np.uint8))
    advantages = advantages * mask
    shift = slice(1, None)
    return MicroBatch(ids, mask[:, shift], inference[:, shift], old[:, shift],
                      ref[:, shift] if ref is not None else None, advantages[:, shift], routed, real)


def token_logprobs(model, input_ids: torch.Tensor, label_mask: torch.Tensor, routed_experts: torch.Tensor | None,
                   with_entropy: bool = True, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropies) [B, T-1] of tokens 1..T-1; computed only where label_mask is set (0 elsewhere).

    Right padding needs no attention mask: causal attention keeps real tokens blind to the padding after them.
    The LM head runs only on the masked positions (the vocabulary is large), LOGIT_ROWS at a time. The log-prob is
    log-softmax + gather, the same arithmetic as verl's `logprobs_from_logits`, whose fallback without flash-attn
    runs one logsumexp per token: on CPU, ten times slower for a 152k vocabulary (the bulk of a train step). The
    entropy is verl's `entropy_from_logits`, kept in the autograd graph only when `entropy_grad` (the loss uses it).
    """
    from verl.utils.torch_functional import entropy_from_logits

    if routed_experts is not None:
        with replay_routing(model, routed_experts):
            hidden = model.model(input_ids=input_ids, use_cache=False).last_hidden_state
    else:
        hidden = model.model(input_ids=input_ids, use_cache=False).last_hidden_state
    selected = label_mask.bool()
    rows = hidden[:, :-1][selected]
    labels = input_ids[:, 1:][selected]
    picked, entropies = [], []
    for start in range(0, max(len(labels), 1), LOGIT_ROWS):  # one (maybe empty) chunk keeps the graph when none
        logits = model.lm_head(rows[start:start + LOGIT_ROWS]).float()
        picked.append(torch.log_softmax(logits, dim=-1).gather(-1, labels[start:start + LOGIT_ROWS, None])[:, 0])
        if with_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                entropies.append(entropy_from_logits(logits))
    logprobs = torch.zeros(label_mask.shape, dtype=torch.float32, device=hidden.device)
    logprobs = logprobs.masked_scatter(selected, torch.cat(picked))
    entropy = None
    if with_entropy:
        entropy = torch.zeros(label_mask.shape, dtype=torch.float32, device=hidden.device)
        entropy = entropy.masked_scatter(selected, torch.cat(entropies))
    return logprobs, entropy


def checkpoint_train_steps(path: Path) -> int:
    """The optimizer steps that made the checkpoint at `path` (its marker's `train_steps`; 0 for a seeded init)."""
    marker = Path(path) / MARKER
    if not marker.is_file():
        return 0
    return int(json.loads(marker.read_text()).get("train_steps", 0) or 0)


def load_optimizer_state(optimizer: torch.optim.Optimizer, checkpoint: Path) -> bool:
    """Continue the optimization saved with `checkpoint` (its moments and step counts), at this trainer's own
    hyperparameters (the state's learning rate and weight decay are the earlier stage's). False: none saved."""
    path = checkpoint / OPTIMIZER_STATE
    if not path.is_file():
        return False
    hyper = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    try:
        optimizer.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    except (ValueError, RuntimeError, KeyError) as exc:
        raise TrainError(f"{path}: the optimizer state does not fit this model ({exc}); delete the file to "
                         "start a fresh optimizer from these weights, or set train.resume_optimizer: false") from exc
    for group, saved in zip(optimizer.param_groups, hyper, strict=True):
        group.update(saved)
    return True


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2 or np.std(a) == 0 or np.std(b) == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def verl_actor_config(config: TrainConfig, global_batch_info: dict):
    """The ActorConfig verl's policy losses read (clip ratios, aggregation, the global batch for accumulation)."""
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig

    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, use_dynamic_bsz=False,
                       clip_ratio=config.clip_ratio_low, clip_ratio_low=config.clip_ratio_low,
                       clip_ratio_high=config.clip_ratio_high, loss_agg_mode=config.loss_agg_mode,
                       policy_loss=PolicyLossConfig(loss_mode=config.policy_loss),
                       global_batch_info=global_batch_info)


def trained_sequences(batch: TrainBatch, config: TrainConfig) -> list[int]:
    """The sequences a train step computes: those with signal or, when a KL or entropy term is on (they use every
    sampled token, advantage or not), every sequence with a sampled label token. Empty: the step changes nothing."""
    every_token_counts = config.kl_coef > 0 or config.entropy_coeff > 0
    return [i for i, has in enumerate(batch.has_signal())
            if has or (every_token_counts and batch.label_tokens(i) > 0)]


def sequence_advantage(batch: TrainBatch, i: int) -> float:
    """Sequence i's advantage: the per-sequence value, or the sum over its sampled label tokens."""
    advantage = batch.advantages[i]
    if np.isscalar(advantage):
        return float(advantage)
    labels = np.asarray(batch.response_mask[i])[1:].astype(bool)
    return float(np.asarray(advantage, dtype=np.float64)[1:][labels].sum())


def signal_counts(batch: TrainBatch, trained: list[int]) -> dict[str, float]:
    """How many sequences (and GRPO groups, when the batch names them) had signal, were trained, were skipped."""
    signal = batch.has_signal()
    counts = {"sequences": float(len(batch)), "sequences_with_signal": float(sum(signal)),
              "sequences_trained": float(len(trained)), "sequences_skipped": float(len(batch) - len(trained))}
    if batch.group_ids is not None:
        groups = set(batch.group_ids)
        with_signal = {group for group, has in zip(batch.group_ids, signal, strict=True) if has}
        computed = {batch.group_ids[i] for i in trained}
        counts.update({"groups": float(len(groups)), "groups_with_signal": float(len(with_signal)),
                       "groups_skipped": float(len(groups - computed))})
    return counts


PassObserver = Callable[[int, int], None]  # (micro-batch passes done, passes in the whole step)


class PassCounter:
    """Counts a step's micro-batch passes for its observer."""

    def __init__(self, total: int, observer: PassObserver | None) -> None:
        self.total, self.done, self.observer = total, 0, observer

    def advance(self) -> None:
        self.done += 1
        if self.observer is not None:
            self.observer(self.done, self.total)


class Trainer:
    """Trains one policy checkpoint directory; `step()` per batch, `save()` writes the next policy version."""

    def __init__(self, model_path: str | Path, config: TrainConfig | None = None, device: str = "cpu",
                 seed: int = 0) -> None:
        from verl.trainer.ppo.core_algos import get_policy_loss_fn

        self.config = config or TrainConfig()
        self.model_path = Path(model_path)
        self.device = device
        torch.manual_seed(seed)
        self.model = load_model(self.model_path, self.config.dtype, device).train()
        self.is_moe = bool(moe_routers(self.model))
        self.replay = self.config.router_replay == "R3" and self.is_moe
        self.policy_version = read_policy_version(self.model_path)
        self.policy_loss_fn = get_policy_loss_fn(self.config.policy_loss)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.config.lr,
                                           weight_decay=self.config.weight_decay)
        self.optimizer_resumed = self.config.resume_optimizer and load_optimizer_state(self.optimizer,
                                                                                       self.model_path)
        # Counted on from the checkpoint's own steps: `save` writes the total, so a chain of train stages (and
        # the warm start before them) numbers its optimizer steps on one increasing axis.
        self.steps = checkpoint_train_steps(self.model_path)
        self.history: list[OptimizerStep] = []  # every optimizer step this trainer took, in order

    def global_batch_info(self, batch: TrainBatch) -> dict:
        masks = [np.asarray(m) for m in batch.response_mask]
        # labels start at token 1: a token-0 mask never enters the loss
        counts = [int(m[1:].sum()) for m in masks]
        info = {"dp_size": 1, "batch_num_tokens": max(sum(counts), 1),
                "global_batch_size": max(sum(1 for c in counts if c > 0), 1)}
        if self.config.loss_agg_mode == "seq-mean-token-sum-norm":
            info["loss_scale_factor"] = max(len(ids) for ids in batch.input_ids) - 1
        return info

    def micro_loss(self, micro: MicroBatch, actor_config) -> tuple[torch.Tensor, dict, torch.Tensor, torch.Tensor]:
        """verl's policy loss (+ entropy and KL terms) for one micro-batch, scaled to the global batch."""
        from verl.trainer.ppo.core_algos import agg_loss, kl_penalty

        routed = micro.routed_experts if self.replay else None
        if self.replay and routed is None:
            raise RoutingReplayError("R3 replay is on but the micro-batch carries no routing record")
        logprobs, entropy = token_logprobs(self.model, micro.input_ids.to(self.device),
                                           micro.response_mask.to(self.device), routed,
                                           entropy_grad=self.config.entropy_coeff > 0)
        mask = micro.response_mask.to(self.device)
        pg_loss, pg_metrics = self.policy_loss_fn(
            old_log_prob=micro.old_logprobs.to(self.device), log_prob=logprobs,
            advantages=micro.advantages.to(self.device), response_mask=mask,
            loss_agg_mode=self.config.loss_agg_mode, config=actor_config, rollout_is_weights=None)
        loss = pg_loss
        info = actor_config.global_batch_info
        if self.config.entropy_coeff > 0:
            loss = loss - self.config.entropy_coeff * agg_loss(entropy, mask, self.config.loss_agg_mode, **info)
        if self.config.kl_coef > 0:
            if micro.ref_logprobs is None:
                raise TrainError("train.kl_coef > 0 needs TrainBatch.ref_logprobs (a reference policy's log-probs)")
            kl = kl_penalty(logprobs, micro.ref_logprobs.to(self.device), self.config.kl_type)
            loss = loss + self.config.kl_coef * agg_loss(kl, mask, self.config.loss_agg_mode, **info)
        return loss, pg_metrics, logprobs, entropy

    def step(self, batch: TrainBatch, on_pass: PassObserver | None = None) -> dict[str, float]:
        """One optimizer step per epoch over the batch's sequences with signal (micro-batches accumulate gradients).

        `on_pass(done, total)` is called after each micro-batch pass (an epoch's forward and backward, or the
        measuring forward after the last step): a step takes minutes on a CPU, and a watcher wants to see it move.

        Metrics: the loss terms and diagnostics of the first epoch over the trained sequences (`trained_sequences`),
        the signal counts (`signal_counts`), and `optimizer_steps`: 0 when no sequence was left to train (then
        nothing was computed and the weights are unchanged), else `epochs`. Each optimizer step's own metrics
        (every epoch's) are appended to `history`. With `negative_advantage_weight` below 1, negative advantages are
        scaled by it first (at 0, rollouts below their group's mean are not computed at all); the signal counts are
        the batch's own, before scaling.
        """
        if len(batch) == 0:
            raise TrainError("empty TrainBatch")
        given = batch
        if self.config.negative_advantage_weight != 1.0:
            batch = batch.with_negative_advantages_scaled(self.config.negative_advantage_weight)
        trained = trained_sequences(batch, self.config)
        counts = signal_counts(given, trained)
        skipped_tokens = float(sum(batch.label_tokens(i) for i in set(range(len(batch))) - set(trained)))
        if not trained:
            # The policy loss of zero advantages is exactly 0 and its gradient too: no optimizer step, so weight
            # decay and Adam's state do not move the policy either.
            return {**counts, "loss": 0.0, "grad_norm": 0.0, "response_tokens": 0.0,
                    "response_tokens_skipped": skipped_tokens, "micro_batches": 0.0, "optimizer_steps": 0.0}
        # The whole batch's counts: the skipped sequences stay in the loss's denominators (their terms are 0), so the
        # gradient is verl's on the whole batch.
        info = self.global_batch_info(batch)
        actor_config = verl_actor_config(self.config, info)
        plan = plan_micro_batches([len(batch.input_ids[i]) for i in trained], self.config.micro_batch_tokens)
        groups = [[trained[j] for j in group] for group in plan]
        passes = PassCounter(len(groups) * (self.config.epochs + int(self.config.measure_update)), on_pass)
        metrics: dict[str, float] = {}
        before: dict[int, float] = {}  # each trained sequence's log-prob before the first step (epoch 0's forward)
        for epoch in range(self.config.epochs):
            started = time.monotonic()
            self.optimizer.zero_grad(set_to_none=True)
            total_loss, tokens, weighted, train_lp, inference_lp, drift_tokens, drift_total = self.backward_epoch(
                batch, groups, actor_config, epoch, before, passes)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
            learning_rate = float(self.optimizer.param_groups[0]["lr"])
            self.optimizer.step()
            self.steps += 1
            train_all = np.concatenate(train_lp) if train_lp else np.zeros(0)
            inference_all = np.concatenate(inference_lp) if inference_lp else np.zeros(0)
            correlation = pearson(train_all, inference_all)
            record = OptimizerStep(
                step=self.steps, epoch=epoch, loss=total_loss, entropy=weighted["entropy"] / max(tokens, 1),
                kl_to_inference=weighted["kl_to_inference"] / max(tokens, 1),
                logprob_pearson=None if np.isnan(correlation) else correlation, grad_norm=float(grad_norm),
                learning_rate=learning_rate, clip_fraction=weighted["clipfrac"] / max(tokens, 1),
                response_tokens=tokens, step_seconds=time.monotonic() - started)
            self.history.append(record)
            if epoch == 0:
                delta = np.abs(train_all - inference_all)
                metrics = {
                    "loss": total_loss,
                    "clip_fraction": record.clip_fraction,
                    "entropy": record.entropy,
                    "grad_norm": record.grad_norm,
                    "kl_to_inference": record.kl_to_inference,
                    "logprob_abs_diff_mean": float(delta.mean()) if len(delta) else 0.0,
                    "logprob_abs_diff_max": float(delta.max()) if len(delta) else 0.0,
                    "response_tokens": float(tokens),
                    "response_tokens_skipped": skipped_tokens,
                    "micro_batches": float(len(groups)),
                    "optimizer_steps": float(self.config.epochs),
                    **counts,
                }
                # measured or absent: a NaN would say "measured, no number"
                if not np.isnan(correlation):
                    metrics["logprob_pearson"] = correlation
                if drift_total:
                    metrics["routing_differs_share"] = drift_tokens / drift_total
            else:
                metrics[f"loss_epoch{epoch}"] = total_loss
        metrics["learning_rate"] = float(self.optimizer.param_groups[0]["lr"])  # `lego status` flags 0
        if self.config.measure_update:
            metrics.update(self.update_effect(batch, groups, before, passes))
        return metrics

    def backward_epoch(self, batch: TrainBatch, groups: list[list[int]], actor_config, epoch: int,
                       before: dict[int, float], passes: PassCounter | None = None) -> tuple:
        """One epoch's forward and backward passes over the micro-batches `groups` (gradients accumulate), and
        what they measured: (loss, response tokens, token-weighted clip fraction / entropy / KL to inference,
        train and inference log-probs of the response tokens, routing-drift tokens and their total). In epoch 0
        each sequence's summed log-prob goes to `before`."""
        from verl.trainer.ppo.core_algos import kl_penalty
        from verl.utils.torch_functional import masked_mean

        total_loss, tokens = 0.0, 0
        weighted = {"clipfrac": 0.0, "entropy": 0.0, "kl_to_inference": 0.0}
        train_lp, inference_lp = [], []
        drift_tokens = drift_total = 0.0
        for group in groups:
            micro = collate(batch, group, need_routing=self.replay)
            loss, pg_metrics, logprobs, entropy = self.micro_loss(micro, actor_config)
            loss.backward()
            mask = micro.response_mask.to(logprobs.device)
            n = float(mask.sum())
            total_loss += float(loss.detach())
            tokens += int(n)
            with torch.no_grad():
                inference = micro.inference_logprobs.to(logprobs.device)
                weighted["clipfrac"] += pg_metrics.get("actor/pg_clipfrac", 0.0) * n
                if n:
                    weighted["entropy"] += float(masked_mean(entropy, mask)) * n
                    kl = kl_penalty(logprobs.detach(), inference, "low_var_kl")
                    weighted["kl_to_inference"] += float(masked_mean(kl, mask)) * n
                selected = mask.bool()
                if epoch == 0:
                    before.update(zip(group, (logprobs.detach() * mask).sum(dim=1).tolist(), strict=True))
                train_lp.append(logprobs.detach()[selected].cpu().numpy())
                inference_lp.append(inference[selected].cpu().numpy())
                measure = self.config.measure_routing_drift and micro.routed_experts is not None
                if epoch == 0 and measure:
                    share = routing_difference_share(self.model, micro.input_ids.to(self.device),
                                                     micro.routed_experts, micro.real_tokens.to(self.device))
                    counted = float(micro.real_tokens.sum())
                    drift_tokens += share * counted
                    drift_total += counted
            if passes is not None:
                passes.advance()
        return total_loss, tokens, weighted, train_lp, inference_lp, drift_tokens, drift_total

    def update_effect(self, batch: TrainBatch, groups: list[list[int]], before: dict[int, float],
                      passes: PassCounter | None = None) -> dict[str, float]:
        """What the step did to the trained sequences' log-probs (summed over each one's sampled tokens), from
        before its first optimizer step to after its last, by the sign of the sequence's advantage:
        `logprob_change_positive` / `_negative`, the mean change; `logprob_change_likeliest_positive`, the mean over
        groups of the change of the positive sequence the policy found most likely before the step.

        Why the last one: a policy that resolves a task mostly one way (a memorized solution) needs that way's
        probability to rise. The mean over positive sequences can rise while it falls: a rare success, whose tokens
        the policy found unlikely, carries far larger gradients than the near-certain tokens of the usual one, so
        the step moves toward the rare one (measured in configs/learn.yaml's comment). One no-grad forward pass over
        the trained sequences."""
        after: dict[int, float] = {}
        self.model.eval()
        try:
            with torch.no_grad():
                for group in groups:
                    micro = collate(batch, group, need_routing=self.replay)
                    logprobs, _ = token_logprobs(self.model, micro.input_ids.to(self.device),
                                                 micro.response_mask.to(self.device),
                                                 micro.routed_experts if self.replay else None, with_entropy=False)
                    mask = micro.response_mask.to(logprobs.device)
                    after.update(zip(group, (logprobs * mask).sum(dim=1).tolist(), strict=True))
                    if passes is not None:
                        passes.advance()
        finally:
            self.model.train()
        signs = {i: np.sign(sequence_advantage(batch, i)) for i in after}
        out: dict[str, float] = {}
        for name, sign in (("positive", 1.0), ("negative", -1.0)):
            changes = [after[i] - before[i] for i in after if signs[i] == sign]
            if changes:
                out[f"logprob_change_{name}"] = float(np.mean(changes))
        likeliest: dict[str, int] = {}
        for i in after:
            if signs[i] > 0:
                group_id = batch.group_ids[i] if batch.group_ids is not None else ""
                if group_id not in likeliest or before[i] > before[likeliest[group_id]]:
                    likeliest[group_id] = i
        if likeliest:
            out["logprob_change_likeliest_positive"] = float(np.mean([after[i] - before[i]
                                                                      for i in likeliest.values()]))
        return out

    def save(self, out_dir: str | Path) -> Path:
        """Write the model as the next policy version (a transformers checkpoint + lego_model.json)."""
        out = Path(out_dir)
        partial = out.with_name(out.name + ".partial")
        for stale in (partial, out):
            if stale.exists():
                shutil.rmtree(stale)
        self.model.save_pretrained(partial)
        for name in TOKENIZER_FILES:
            source = self.model_path / name
            if source.is_file() and not (partial / name).exists():
                shutil.copy2(source, partial / name)
        marker = {}
        if (self.model_path / MARKER).is_file():
            marker = json.loads((self.model_path / MARKER).read_text())
        marker.pop("fingerprint", None)  # a trained checkpoint is no longer the seeded init
        marker.update({"policy_version": self.policy_version + 1, "parent": str(self.model_path),
                       "train_steps": self.steps})
        (partial / MARKER).write_text(json.dumps(marker, indent=2))
        if self.config.resume_optimizer:
            torch.save(self.optimizer.state_dict(), partial / OPTIMIZER_STATE)
        partial.rename(out)
        self.policy_version += 1
        self.model_path = out
        return out
