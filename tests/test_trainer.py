"""The trainer on real sampled trajectories of the tiny Qwen3-MoE: verl's losses, accumulation, checkpoints."""
# ruff: noqa: F811  (pytest fixtures imported from fixtures_model are parameters here)

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import torch
from fixtures_model import fp32_engine, tiny_model_path  # noqa: F401

from lego.config import TrainConfig
from lego.engine.base import SamplingParams
from lego.engine.checkpoint import MARKER, load_model, policy_version
from lego.train import trainer as trainer_module
from lego.train.replay import RoutingReplayError, replay_routing
from lego.train.trainer import TrainBatch, Trainer, TrainError, collate, plan_micro_batches, token_logprobs

PROMPTS = [[151644, 872, 198, 9707 + i, 11, 151645, 198, 151644, 77091, 198] for i in range(4)]


@pytest.fixture(scope="module")
def batch(fp32_engine) -> TrainBatch:
    async def sample():
        return await asyncio.gather(*[fp32_engine.generate(p, SamplingParams(max_tokens=6 + 3 * i, seed=i))
                                      for i, p in enumerate(PROMPTS)])

    results = asyncio.run(sample())
    ids, masks, logprobs, routing = [], [], [], []
    for prompt, result in zip(PROMPTS, results, strict=True):
        ids.append(np.array(prompt + result.token_ids, dtype=np.int32))
        masks.append(np.array([0] * len(prompt) + [1] * len(result.token_ids), dtype=np.uint8))
        logprobs.append(np.array([0.0] * len(prompt) + result.logprobs, dtype=np.float32))
        routing.append(result.routed_experts)
    return TrainBatch(ids, masks, logprobs, [1.0, -1.0, 0.5, -0.5], routing)


def reference_loss(model_path, batch: TrainBatch, config: TrainConfig):
    """verl's loss on the whole batch at once, from a plain full-logits forward with the recorded routing."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig

    model = load_model(model_path, "float32").train()
    width = max(len(ids) for ids in batch.input_ids)
    size = len(batch)
    ids = torch.zeros((size, width), dtype=torch.long)
    mask, old, adv = (torch.zeros((size, width)) for _ in range(3))
    routed = torch.zeros((size, width, *batch.routed_experts[0].shape[1:]), dtype=torch.uint8)
    for row in range(size):
        n = len(batch.input_ids[row])
        ids[row, :n] = torch.as_tensor(batch.input_ids[row].astype(np.int64))
        mask[row, :n] = torch.as_tensor(batch.response_mask[row].astype(np.float32))
        old[row, :n] = torch.as_tensor(batch.inference_logprobs[row])
        adv[row, :n] = batch.advantages[row]
        routed[row, :n] = torch.as_tensor(batch.routed_experts[row])
    with replay_routing(model, routed):
        logits = model(input_ids=ids).logits.float()
    logprobs = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    actor = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                        clip_ratio_low=config.clip_ratio_low, clip_ratio_high=config.clip_ratio_high,
                        loss_agg_mode=config.loss_agg_mode, policy_loss=PolicyLossConfig(loss_mode=config.policy_loss))
    loss, _ = get_policy_loss_fn(config.policy_loss)(
        old_log_prob=old[:, 1:], log_prob=logprobs, advantages=(adv * mask)[:, 1:], response_mask=mask[:, 1:],
        loss_agg_mode=config.loss_agg_mode, config=actor)
    loss.backward()
    return float(loss.detach()), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(("policy_loss", "agg"), [("vanilla", "token-mean"), ("gspo", "seq-mean-token-mean")])
def test_loss_and_gradients_equal_verl_on_the_whole_batch(tiny_model_path, batch, policy_loss, agg):
    # a small token budget splits the batch into several micro-batches: accumulation must not change anything
    config = TrainConfig(policy_loss=policy_loss, loss_agg_mode=agg, micro_batch_tokens=64, lr=1e-9,
                         measure_routing_drift=False)
    trainer = Trainer(tiny_model_path, config)
    trainer.optimizer.step = lambda: None  # keep the gradients for comparison
    metrics = trainer.step(batch)
    assert metrics["micro_batches"] > 1
    expected_loss, expected_grads = reference_loss(tiny_model_path, batch, config)
    assert metrics["loss"] == pytest.approx(expected_loss, abs=1e-6)
    grads = {name: p.grad for name, p in trainer.model.named_parameters() if p.grad is not None}
    assert grads.keys() == expected_grads.keys()
    scale = min(1.0, config.grad_clip / max(metrics["grad_norm"], 1e-12))  # the trainer clipped its gradients
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad * scale, atol=1e-6, rtol=1e-4, msg=name)


def test_metrics_on_policy_batch(tiny_model_path, batch):
    metrics = Trainer(tiny_model_path, TrainConfig()).step(batch)
    assert metrics["logprob_pearson"] > 0.9999
    assert metrics["logprob_abs_diff_max"] < 1e-3
    assert metrics["kl_to_inference"] < 1e-6
    assert metrics["clip_fraction"] == 0.0  # first step is exactly on-policy
    assert metrics["routing_differs_share"] == 0.0  # fp32 engine and fp32 trainer route alike
    assert metrics["entropy"] > 0 and metrics["grad_norm"] > 0
    assert metrics["response_tokens"] == sum(int(m.sum()) for m in batch.response_mask)
    assert metrics["learning_rate"] == TrainConfig().lr  # the optimizer's rate, read by `lego status`


def test_a_few_steps_lower_the_loss(tiny_model_path, batch):
    trainer = Trainer(tiny_model_path, TrainConfig(lr=1e-3, measure_routing_drift=False))
    losses = [trainer.step(batch)["loss"] for _ in range(4)]
    assert losses[-1] < losses[0] - 1e-3
    assert trainer.step(batch)["clip_fraction"] > 0  # the policy moved away from the sampling policy


def test_each_optimizer_step_keeps_its_own_metrics(tiny_model_path, batch, tmp_path):
    config = TrainConfig(lr=1e-3, epochs=3, micro_batch_tokens=64, measure_routing_drift=False)
    trainer = Trainer(tiny_model_path, config)
    seen = []
    metrics = trainer.step(batch, on_pass=lambda done, total: seen.append((done, total)))
    steps = trainer.history
    assert [(s.step, s.epoch) for s in steps] == [(1, 0), (2, 1), (3, 2)] and trainer.steps == 3
    # a watcher sees every micro-batch pass: three epochs' and the measuring pass after them, counted to the end
    passes = int(metrics["micro_batches"]) * (config.epochs + 1)
    assert seen == [(done, passes) for done in range(1, passes + 1)]
    assert "routing_differs_share" not in metrics  # not measured: absent, not NaN
    first = steps[0]
    # the returned metrics are the first epoch's, and each later epoch's loss is its own step's
    for name in ("loss", "entropy", "kl_to_inference", "logprob_pearson", "grad_norm", "clip_fraction"):
        assert getattr(first, name) == metrics[name], name
    assert [s.loss for s in steps[1:]] == [metrics["loss_epoch1"], metrics["loss_epoch2"]]
    assert all(s.learning_rate == config.lr and s.response_tokens == metrics["response_tokens"] for s in steps)
    # after the first step the policy is no longer the sampling policy: its log-probs drift from the inference ones
    assert first.kl_to_inference < 1e-6 < steps[2].kl_to_inference
    assert steps[2].logprob_pearson < first.logprob_pearson
    assert set(first.metrics()) == {"epoch", "loss", "entropy", "kl_to_inference", "logprob_pearson", "grad_norm",
                                    "learning_rate", "clip_fraction", "response_tokens", "step_seconds"}

    # a trainer on the saved policy counts on from its steps
    out = trainer.save(tmp_path / "policy-1")
    assert json.loads((out / MARKER).read_text())["train_steps"] == 3
    follower = Trainer(out, TrainConfig(lr=1e-3, measure_routing_drift=False))
    follower.step(batch)
    assert [s.step for s in follower.history] == [4]
    assert json.loads((follower.save(tmp_path / "policy-2") / MARKER).read_text())["train_steps"] == 4


def test_checkpoint_round_trips_into_the_engine(tiny_model_path, batch, tmp_path):
    from lego.engine.transformers_engine import TransformersEngine

    trainer = Trainer(tiny_model_path, TrainConfig(lr=1e-2, measure_routing_drift=False))
    trainer.step(batch)
    out = trainer.save(tmp_path / "policy-1")
    assert policy_version(out) == 1 == trainer.policy_version
    assert "fingerprint" not in json.loads((out / MARKER).read_text())
    engine = TransformersEngine(tiny_model_path, dtype="float32")
    try:
        ids = [int(t) for t in batch.input_ids[0]]
        before = asyncio.run(engine.score(ids))
        engine.load_checkpoint(str(out), 1)
        assert engine.policy_version == 1
        after = asyncio.run(engine.score(ids))
        result = asyncio.run(engine.generate(PROMPTS[0], SamplingParams(max_tokens=4, seed=0)))
    finally:
        engine.close()
    assert np.abs(np.array(after) - np.array(before)).max() > 1e-3
    assert len(result.token_ids) == 4
    assert Trainer(out, TrainConfig()).policy_version == 1


def test_replay_needs_a_routing_record(tiny_model_path, batch):
    missing = TrainBatch(batch.input_ids, batch.response_mask, batch.inference_logprobs, batch.advantages,
                         [None] * len(batch))
    with pytest.raises(RoutingReplayError, match="no routing record"):
        Trainer(tiny_model_path, TrainConfig()).step(missing)
    short = [r[:-1] for r in batch.routed_experts]
    with pytest.raises(RoutingReplayError, match="one row per token"):
        TrainBatch(batch.input_ids, batch.response_mask, batch.inference_logprobs, batch.advantages, short)


def test_misaligned_batch_and_kl_without_reference_raise(tiny_model_path, batch):
    with pytest.raises(TrainError, match="sequence 0"):
        TrainBatch(batch.input_ids, [m[:-1] for m in batch.response_mask], batch.inference_logprobs,
                   batch.advantages, batch.routed_experts)
    with pytest.raises(TrainError, match="ref_logprobs"):
        Trainer(tiny_model_path, TrainConfig(kl_coef=0.1)).step(batch)


def test_micro_batch_plan_respects_the_token_budget():
    assert plan_micro_batches([10, 10, 10, 40, 5], 30) == [[0, 1, 2], [3], [4]]
    assert plan_micro_batches([10, 30, 10], 60) == [[0, 1], [2]]


def with_advantages(batch: TrainBatch, advantages: list, group_ids: list[str] | None = None) -> TrainBatch:
    return TrainBatch(batch.input_ids, batch.response_mask, batch.inference_logprobs, advantages,
                      batch.routed_experts, group_ids=group_ids)


def forwarded_sequences(trainer: Trainer, batch: TrainBatch) -> tuple[list, list[int]]:
    """A hook on the embedding that names each batch sequence the model runs on (rows match by their tokens)."""
    seen: list[int] = []

    def hook(_module, inputs, _output) -> None:
        for row in inputs[0]:
            for i, ids in enumerate(batch.input_ids):
                if torch.equal(row[:len(ids)], torch.as_tensor(ids.astype(np.int64))):
                    seen.append(i)
                    break
            else:
                raise AssertionError("the model ran on a sequence that is not in the batch")

    return [trainer.model.model.embed_tokens.register_forward_hook(hook)], seen


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_zero_advantage_sequences_are_skipped_and_the_gradient_stays_verls(tiny_model_path, batch, agg, monkeypatch):
    monkeypatch.setattr(trainer_module, "LOGIT_ROWS", 5)  # the LM head in several row chunks per micro-batch
    mixed = with_advantages(batch, [1.0, 0.0, -0.5, 0.0], ["a", "b", "a", "b"])  # group b has no variance
    config = TrainConfig(loss_agg_mode=agg, micro_batch_tokens=64, lr=1e-9, measure_routing_drift=False)
    trainer = Trainer(tiny_model_path, config)
    trainer.optimizer.step = lambda: None  # keep the gradients for comparison
    handles, seen = forwarded_sequences(trainer, mixed)
    try:
        metrics = trainer.step(mixed)
    finally:
        for handle in handles:
            handle.remove()
    # each trained sequence twice (the step's forward, then measure_update's after it); the skipped 1 and 3 never
    assert sorted(seen) == [0, 0, 2, 2]
    assert (metrics["sequences"], metrics["sequences_with_signal"], metrics["sequences_skipped"]) == (4, 2, 2)
    assert (metrics["groups"], metrics["groups_with_signal"], metrics["groups_skipped"]) == (2, 1, 1)
    assert metrics["optimizer_steps"] == 1
    assert metrics["response_tokens"] == sum(int(mixed.response_mask[i].sum()) for i in (0, 2))
    assert metrics["response_tokens_skipped"] == sum(int(mixed.response_mask[i].sum()) for i in (1, 3))
    # the skipped sequences still count in the loss's mean: the step is verl's on the whole batch
    expected_loss, expected_grads = reference_loss(tiny_model_path, mixed, config)
    assert metrics["loss"] == pytest.approx(expected_loss, abs=1e-6)
    scale = min(1.0, config.grad_clip / max(metrics["grad_norm"], 1e-12))
    for name, param in trainer.model.named_parameters():
        if name in expected_grads:
            torch.testing.assert_close(param.grad, expected_grads[name] * scale, atol=1e-6, rtol=1e-4, msg=name)


def test_a_batch_without_signal_computes_nothing_and_keeps_the_weights(tiny_model_path, batch):
    # per-token advantages that are non-zero only on prompt tokens carry no signal either
    on_prompt = [np.where(mask == 0, 1.0, 0.0).astype(np.float32) for mask in batch.response_mask]
    for advantages in ([0.0, 0.0, 1e-12, -0.0], on_prompt):
        flat = with_advantages(batch, advantages, ["a", "a", "b", "b"])
        assert flat.has_signal() == [False] * 4
        trainer = Trainer(tiny_model_path, TrainConfig(lr=1e-2, weight_decay=0.1))
        before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
        handles, seen = forwarded_sequences(trainer, flat)
        try:
            metrics = trainer.step(flat)
        finally:
            for handle in handles:
                handle.remove()
        assert seen == []
        assert metrics["optimizer_steps"] == 0 and trainer.steps == 0
        assert (metrics["sequences_with_signal"], metrics["sequences_skipped"]) == (0, 4)
        assert (metrics["groups_with_signal"], metrics["groups_skipped"]) == (0, 2)
        assert metrics["loss"] == 0.0 and metrics["grad_norm"] == 0.0
        for name, param in trainer.model.named_parameters():
            assert torch.equal(param.detach(), before[name]), name


@pytest.mark.parametrize("term", ["entropy_coeff", "kl_coef"])
def test_entropy_and_kl_terms_still_train_zero_advantage_sequences(tiny_model_path, batch, term):
    flat = with_advantages(batch, [0.0] * 4)
    if term == "kl_coef":
        # a reference policy other than the current one, so the KL term has a gradient
        flat.ref_logprobs = [lp - 0.5 * mask for lp, mask in zip(batch.inference_logprobs, batch.response_mask,
                                                                 strict=True)]
    metrics = Trainer(tiny_model_path, TrainConfig(**{term: 0.1}, measure_routing_drift=False)).step(flat)
    assert (metrics["sequences_with_signal"], metrics["sequences_trained"], metrics["sequences_skipped"]) == (0, 4, 0)
    assert "groups" not in metrics  # the batch names no groups
    assert metrics["optimizer_steps"] == 1 and metrics["grad_norm"] > 0


def test_log_probs_and_entropies_in_row_chunks_equal_a_full_forward(tiny_model_path, batch, monkeypatch):
    monkeypatch.setattr(trainer_module, "LOGIT_ROWS", 5)
    model = load_model(tiny_model_path, "float32")
    micro = collate(batch, list(range(len(batch))), need_routing=False)
    with torch.no_grad():
        logprobs, entropy = token_logprobs(model, micro.input_ids, micro.response_mask, None)
        full = torch.log_softmax(model(input_ids=micro.input_ids).logits[:, :-1].float(), -1)
    mask = micro.response_mask.bool()
    assert int(mask.sum()) > 3 * 5
    expected = full.gather(-1, micro.input_ids[:, 1:, None])[..., 0]
    torch.testing.assert_close(logprobs[mask], expected[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy[mask], -(full.exp() * full).sum(-1)[mask], atol=1e-4, rtol=1e-5)
    assert not logprobs[~mask].any() and not entropy[~mask].any()
