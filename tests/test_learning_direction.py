"""The direction of learning, end to end on the real tiny Qwen3-MoE: trajectories sampled by the engine, one train
step, the new policy version served by the engine.

A positive advantage must raise the log-probs of a trajectory's sampled tokens and a negative one lower them, with
and without R3 routing replay; flipping the advantages must flip the moves (so no sign, mask or shift error can
pass). The engine that loads the saved checkpoint must then give the new weights' log-probs and report the new
policy version. Sampling is in bfloat16 (the default engine dtype) and training in float32, so some tokens route
differently at inference and in training, and R3 has something to replay.
"""
# ruff: noqa: F811  (pytest fixtures imported from fixtures_model are parameters here)

from __future__ import annotations

import asyncio
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures_model import tiny_model_path  # noqa: F401

from lego.config import TrainConfig
from lego.engine.base import SamplingParams
from lego.engine.checkpoint import load_model, policy_version
from lego.engine.transformers_engine import TransformersEngine
from lego.train.replay import replay_routing
from lego.train.trainer import TrainBatch, Trainer

PROMPTS = [[151644, 872, 198, 9707 + i, 11, 151645, 198, 151644, 77091, 198] for i in range(3)]
SAMPLED = 16
# Adam's first step moves every weight by about lr: at 1e-3 one step moves each trajectory's mean sampled-token
# log-prob by ~0.3 nats on this model; MOVE asks for a clear share of that, far above float noise.
LR = 1e-3
MOVE = 0.05
# bfloat16 decoding with a KV cache against one bfloat16 forward of the whole sequence differs by ~2e-3 here; the
# trained weights move these log-probs by ~0.1.
SERVE_TOLERANCE = 0.02


@pytest.fixture(scope="module")
def sampled(tiny_model_path) -> TrainBatch:
    """Three trajectories sampled by the bfloat16 engine, with their log-probs and routing (advantages set later)."""
    engine = TransformersEngine(tiny_model_path, dtype="bfloat16", max_batch_size=4, batch_wait_ms=20)
    try:
        async def sample():
            return await asyncio.gather(*[engine.generate(prompt, SamplingParams(max_tokens=SAMPLED, seed=i))
                                          for i, prompt in enumerate(PROMPTS)])

        results = asyncio.run(sample())
    finally:
        engine.close()
    ids, masks, logprobs, routing = [], [], [], []
    for prompt, result in zip(PROMPTS, results, strict=True):
        assert len(result.token_ids) == SAMPLED
        ids.append(np.array(prompt + result.token_ids, dtype=np.int32))
        masks.append(np.array([0] * len(prompt) + [1] * SAMPLED, dtype=np.uint8))
        logprobs.append(np.array([0.0] * len(prompt) + result.logprobs, dtype=np.float32))
        routing.append(result.routed_experts)
    return TrainBatch(ids, masks, logprobs, [0.0] * len(PROMPTS), routing)


def with_advantages(batch: TrainBatch, advantages: list[float]) -> TrainBatch:
    return TrainBatch(batch.input_ids, batch.response_mask, batch.inference_logprobs, advantages,
                      batch.routed_experts, group_ids=["pair", "pair", "flat"])


def mean_sampled_logprob(trainer: Trainer, batch: TrainBatch, i: int) -> float:
    """Mean log-prob of sequence i's sampled tokens under the trainer's weights, from a plain full-logits forward
    (not the trainer's own collate and log-prob code), with the recorded routing replayed when the trainer
    replays it."""
    ids = torch.as_tensor(batch.input_ids[i].astype(np.int64))[None]
    routing = torch.as_tensor(batch.routed_experts[i])[None] if trainer.replay else None
    with torch.no_grad(), (replay_routing(trainer.model, routing) if routing is not None else nullcontext()):
        logits = trainer.model(input_ids=ids).logits[0, :-1].float()
    logprobs = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
    return float(logprobs[torch.as_tensor(batch.response_mask[i][1:]).bool()].mean())


def direct_logprobs(path: Path, token_ids: list[int]) -> np.ndarray:
    """Per-token log-probs (position 0 -> 0.0) from one plain forward of the checkpoint at `path`, as the engine
    loads it (bfloat16, its own routing)."""
    model = load_model(path, "bfloat16")
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([token_ids])).logits[0, :-1].float()
    picked = torch.log_softmax(logits, -1).gather(-1, torch.tensor(token_ids[1:])[:, None])[:, 0]
    return np.concatenate([[0.0], picked.numpy()])


@pytest.mark.parametrize("router_replay", ["R3", "disabled"])
def test_one_step_moves_each_trajectory_the_way_its_advantage_says(tiny_model_path, sampled, router_replay):
    for sign in (1.0, -1.0):
        batch = with_advantages(sampled, [sign, -sign, 0.0])
        config = TrainConfig(lr=LR, router_replay=router_replay, measure_routing_drift=sign > 0)
        trainer = Trainer(tiny_model_path, config)
        assert trainer.replay == (router_replay == "R3")
        before = [mean_sampled_logprob(trainer, batch, i) for i in range(2)]
        metrics = trainer.step(batch)
        after = [mean_sampled_logprob(trainer, batch, i) for i in range(2)]
        moves = [sign * (after[0] - before[0]), -sign * (after[1] - before[1])]
        assert min(moves) > MOVE, f"advantages ({sign}, {-sign}) moved the log-probs by {after[0] - before[0]:.4f}, " \
                                  f"{after[1] - before[1]:.4f}"
        # the step's own report of what it did, against the independent measurement (summed over sampled tokens)
        changes = [batch.label_tokens(i) * (after[i] - before[i]) for i in range(2)]
        positive, negative = (0, 1) if sign > 0 else (1, 0)
        assert metrics["logprob_change_positive"] == pytest.approx(changes[positive], abs=1e-3)
        assert metrics["logprob_change_negative"] == pytest.approx(changes[negative], abs=1e-3)
        assert metrics["logprob_change_likeliest_positive"] == pytest.approx(changes[positive], abs=1e-3)
        assert (metrics["sequences_with_signal"], metrics["sequences_skipped"]) == (2, 1)
        assert (metrics["groups"], metrics["groups_with_signal"]) == (2, 1)
        assert metrics["optimizer_steps"] == 1
        if sign > 0:  # bf16 inference and fp32 training route some tokens apart: R3 has work to do
            assert metrics["routing_differs_share"] > 0


def test_the_engine_serves_the_new_policy_version(tiny_model_path, sampled, tmp_path):
    batch = with_advantages(sampled, [1.0, -1.0, 0.0])
    trainer = Trainer(tiny_model_path, TrainConfig(lr=LR))
    trainer.step(batch)
    checkpoint = trainer.save(tmp_path / "policy-1")
    assert policy_version(checkpoint) == trainer.policy_version == 1
    tokens = [[int(t) for t in ids] for ids in batch.input_ids[:2]]
    engine = TransformersEngine(tiny_model_path, dtype="bfloat16")
    try:
        assert engine.policy_version == 0
        served_before = [np.array(asyncio.run(engine.score(t))) for t in tokens]
        engine.load_checkpoint(str(checkpoint), trainer.policy_version)
        assert engine.policy_version == 1
        served_after = [np.array(asyncio.run(engine.score(t))) for t in tokens]
        generated = asyncio.run(engine.generate(PROMPTS[0], SamplingParams(max_tokens=SAMPLED, seed=7)))
    finally:
        engine.close()

    # the served log-probs are the saved checkpoint's, for the trained tokens and for a fresh generation
    for t, served in zip(tokens, served_after, strict=True):
        np.testing.assert_allclose(served, direct_logprobs(checkpoint, t), atol=1e-5)
    full = PROMPTS[0] + generated.token_ids
    new = direct_logprobs(checkpoint, full)[len(PROMPTS[0]):]
    old = direct_logprobs(tiny_model_path, full)[len(PROMPTS[0]):]
    assert np.abs(np.array(generated.logprobs) - new).max() < SERVE_TOLERANCE
    assert np.abs(np.array(generated.logprobs) - old).max() > 2 * SERVE_TOLERANCE

    # and through the engine, the positive trajectory became likelier and the negative one less likely
    mask = [m.astype(bool) for m in batch.response_mask[:2]]
    moves = [float(served_after[i][mask[i]].mean() - served_before[i][mask[i]].mean()) for i in range(2)]
    assert moves[0] > MOVE and moves[1] < -MOVE, moves


def test_negative_advantages_are_scaled_by_their_weight(tiny_model_path, sampled):
    """At weight 0 only the rollouts above their group's mean are computed and the rest keep their place in the
    loss's denominators: the step equals one where their advantages were 0. At 0.5 the step lies between."""
    per_token = np.where(sampled.response_mask[1] > 0, -2.0, 0.0).astype(np.float32)
    batch = with_advantages(sampled, [1.0, per_token, 0.0])
    halved = batch.with_negative_advantages_scaled(0.5)
    assert halved.advantages[0] == 1.0 and halved.advantages[2] == 0.0
    np.testing.assert_array_equal(halved.advantages[1], per_token / 2)

    def moved(weight: float, advantages: list) -> tuple[list[float], dict]:
        trainer = Trainer(tiny_model_path, TrainConfig(lr=LR, negative_advantage_weight=weight,
                                                       measure_routing_drift=False))
        given = with_advantages(sampled, advantages)
        before = [mean_sampled_logprob(trainer, given, i) for i in range(2)]
        metrics = trainer.step(given)
        return [mean_sampled_logprob(trainer, given, i) - before[i] for i in range(2)], metrics

    positives_only, metrics = moved(0.0, [1.0, per_token, 0.0])
    assert (metrics["sequences_with_signal"], metrics["sequences_trained"]) == (2, 1)
    assert metrics["groups_with_signal"] == 1  # the group had variance; only its better rollout was computed
    zeroed, _ = moved(1.0, [1.0, 0.0, 0.0])
    np.testing.assert_allclose(positives_only, zeroed, atol=1e-6)
    assert positives_only[0] > MOVE
    half, _ = moved(0.5, [1.0, per_token, 0.0])
    full, _ = moved(1.0, [1.0, per_token, 0.0])
    assert full[1] < half[1] < positives_only[1]


def test_the_update_report_follows_each_groups_likeliest_success(tiny_model_path, sampled):
    """Two successes in one group: the mean change covers both, the likeliest-success change only the one the policy
    found more likely before the step (the usual way a memorizing policy resolves the task)."""
    batch = with_advantages(sampled, [1.0, 0.5, 0.0])
    trainer = Trainer(tiny_model_path, TrainConfig(lr=LR, measure_routing_drift=False))
    before = [mean_sampled_logprob(trainer, batch, i) * batch.label_tokens(i) for i in range(2)]
    metrics = trainer.step(batch)
    changes = [mean_sampled_logprob(trainer, batch, i) * batch.label_tokens(i) - before[i] for i in range(2)]
    assert metrics["logprob_change_positive"] == pytest.approx(np.mean(changes), abs=1e-3)
    likeliest = int(np.argmax(before))
    assert metrics["logprob_change_likeliest_positive"] == pytest.approx(changes[likeliest], abs=1e-3)
    assert "logprob_change_negative" not in metrics
    unmeasured = Trainer(tiny_model_path, TrainConfig(lr=LR, measure_routing_drift=False, measure_update=False))
    assert "logprob_change_positive" not in unmeasured.step(batch)
