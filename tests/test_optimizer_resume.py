"""The optimizer's state travels with the policy checkpoint: train stages chained through saved checkpoints are one
optimization, exactly as one trainer taking all the steps."""
# ruff: noqa: F811  (pytest fixtures imported from fixtures_model are parameters here)

from __future__ import annotations

import numpy as np
import pytest
import torch
from fixtures_model import tiny_model_path  # noqa: F401

from lego.config import TrainConfig
from lego.engine.checkpoint import load_model
from lego.train.trainer import OPTIMIZER_STATE, TrainBatch, Trainer, TrainError, collate, token_logprobs


@pytest.fixture(scope="module")
def batch(tiny_model_path) -> TrainBatch:
    """Four on-policy sequences (the model's own log-probs as the inference ones), two advantages of each sign."""
    rng = np.random.default_rng(0)
    ids = [rng.integers(100, 5000, size=24 + 4 * i).astype(np.int32) for i in range(4)]
    masks = [np.array([0] * 12 + [1] * (len(row) - 12), dtype=np.uint8) for row in ids]
    partial = TrainBatch(ids, masks, [np.zeros(len(row), np.float32) for row in ids], [1.0, -1.0, 0.5, -0.5])
    model = load_model(tiny_model_path, "float32").eval()
    logprobs = []
    with torch.no_grad():
        for i in range(len(ids)):
            micro = collate(partial, [i], need_routing=False)
            lp, _ = token_logprobs(model, micro.input_ids, micro.response_mask, None, with_entropy=False)
            logprobs.append(np.concatenate([[0.0], lp[0].numpy()]).astype(np.float32))
    return TrainBatch(ids, masks, logprobs, partial.advantages)


def config(**overrides) -> TrainConfig:
    return TrainConfig(**{"lr": 1e-3, "router_replay": "disabled", "measure_routing_drift": False, **overrides})


def weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {name: param.detach().clone() for name, param in trainer.model.named_parameters()}


def test_chained_stages_are_one_optimization(tiny_model_path, batch, tmp_path):
    whole = Trainer(tiny_model_path, config())
    whole.step(batch)
    whole.step(batch)

    first = Trainer(tiny_model_path, config())
    assert not first.optimizer_resumed  # a fresh checkpoint has no optimizer state
    first.step(batch)
    saved = first.save(tmp_path / "v1")
    assert (saved / OPTIMIZER_STATE).is_file()
    second = Trainer(saved, config())
    assert second.optimizer_resumed
    second.step(batch)

    expected, got = weights(whole), weights(second)
    assert all(torch.allclose(expected[name], got[name], atol=1e-7) for name in expected)


def test_the_stage_own_hyperparameters_win_over_the_saved_ones(tiny_model_path, batch, tmp_path):
    first = Trainer(tiny_model_path, config())
    first.step(batch)
    saved = first.save(tmp_path / "v1")
    second = Trainer(saved, config(lr=3e-4, weight_decay=0.01))
    assert second.optimizer_resumed
    assert second.optimizer.param_groups[0]["lr"] == 3e-4
    assert second.optimizer.param_groups[0]["weight_decay"] == 0.01
    steps = {float(state["step"]) for state in second.optimizer.state.values()}
    assert steps == {1.0}  # the moments and the step count are the first stage's


def test_a_fresh_optimizer_when_resuming_is_off(tiny_model_path, batch, tmp_path):
    whole = Trainer(tiny_model_path, config())
    whole.step(batch)
    whole.step(batch)

    first = Trainer(tiny_model_path, config(resume_optimizer=False))
    first.step(batch)
    saved = first.save(tmp_path / "v1")
    assert not (saved / OPTIMIZER_STATE).exists()
    second = Trainer(saved, config(resume_optimizer=False))
    assert not second.optimizer_resumed
    second.step(batch)
    expected, got = weights(whole), weights(second)
    assert not all(torch.allclose(expected[name], got[name], atol=1e-7) for name in expected)


def test_a_state_that_does_not_fit_is_a_clear_error(tiny_model_path, batch, tmp_path):
    first = Trainer(tiny_model_path, config())
    first.step(batch)
    saved = first.save(tmp_path / "v1")
    state = torch.load(saved / OPTIMIZER_STATE, weights_only=True)
    state["param_groups"][0]["params"] = state["param_groups"][0]["params"][:-1]  # one parameter short
    torch.save(state, saved / OPTIMIZER_STATE)
    with pytest.raises(TrainError, match="resume_optimizer"):
        Trainer(saved, config())
