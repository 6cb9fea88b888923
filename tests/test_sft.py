"""The warm start's fine-tuning on the real tiny Qwen3-MoE: a fixed number of steps, or fewer when a pass over the
demonstrations reaches `warmstart.stop_at_loss`."""
# ruff: noqa: F811  (pytest fixtures imported from fixtures_model are parameters here)

from __future__ import annotations

import numpy as np
from fixtures_model import tiny_model_path  # noqa: F401

from lego.config import WarmStartConfig
from lego.data.batches import TrainingSample
from lego.train.sft import fine_tune
from lego.train.trainer import checkpoint_train_steps


def demonstration(index: int) -> TrainingSample:
    prompt = [151644, 872, 198, 9707 + index, 151645, 198, 151644, 77091, 198]
    reply = [785 + index, 4226, 374, 220, 19, 13, 151645]
    ids = np.array(prompt + reply, dtype=np.int32)
    mask = np.array([0] * len(prompt) + [1] * len(reply), dtype=np.uint8)
    return TrainingSample(rollout_id=f"r{index}", task_id=f"t{index}", iteration=0, segment_index=0, thread="main",
                          token_ids=ids, response_mask=mask, logprobs=np.zeros(len(ids), np.float32), advantage=1.0,
                          routed_experts=None, reward=1.0, is_cheat=False, policy_version=0)


def test_fine_tuning_stops_at_the_first_pass_whose_mean_loss_reaches_the_target(tiny_model_path, tmp_path):
    samples = [demonstration(0), demonstration(1)]
    _, fixed = fine_tune(tiny_model_path, samples, WarmStartConfig(steps=12, lr=1e-2), tmp_path / "fixed")
    assert len(fixed) == 12
    losses = [step["loss"] for step in fixed]
    passes = [(losses[i] + losses[i + 1]) / 2 for i in range(0, 12, 2)]
    target = passes[len(passes) // 2]  # reached halfway (or earlier) by the same seeded run
    first = next(i for i, loss in enumerate(passes) if loss <= target)
    assert first < len(passes) - 1
    checkpoint, stopped = fine_tune(tiny_model_path, samples, WarmStartConfig(steps=12, lr=1e-2, stop_at_loss=target),
                                    tmp_path / "stopped")
    assert len(stopped) == 2 * (first + 1)  # whole passes only
    np.testing.assert_allclose([step["loss"] for step in stopped], losses[:len(stopped)], rtol=1e-4)
    assert checkpoint_train_steps(checkpoint) == len(stopped)


def test_a_cosine_schedule_takes_the_rate_from_lr_down_to_zero_at_the_last_step(tiny_model_path, tmp_path):
    samples = [demonstration(0), demonstration(1)]
    _, constant = fine_tune(tiny_model_path, samples, WarmStartConfig(steps=8, lr=1e-2), tmp_path / "constant")
    assert [step["learning_rate"] for step in constant] == [1e-2] * 8
    _, cosine = fine_tune(tiny_model_path, samples, WarmStartConfig(steps=8, lr=1e-2, lr_schedule="cosine"),
                          tmp_path / "cosine")
    rates = [step["learning_rate"] for step in cosine]
    np.testing.assert_allclose(rates, [1e-2 * 0.5 * (1 + np.cos(np.pi * k / 8)) for k in range(8)], rtol=1e-6)
    assert cosine[0]["loss"] == constant[0]["loss"]  # the same first step; the schedule only changes what follows


def test_a_step_batch_of_n_takes_n_demonstrations_a_step_and_each_once_a_pass(tiny_model_path, tmp_path):
    from lego.train.sft import _step_indices

    settings = WarmStartConfig(steps=10, step_batch=3)
    steps = _step_indices(7, settings, seed=0)
    for _ in range(3):  # three passes of ceil(7 / 3) = 3 steps: 3, 3 and the remaining 1; the last ends the pass
        one_pass = [next(steps) for _ in range(3)]
        assert [len(indices) for indices, _ in one_pass] == [3, 3, 1]
        assert [ends for _, ends in one_pass] == [False, False, True]
        assert sorted(index for indices, _ in one_pass for index in indices) == list(range(7))
    samples = [demonstration(index) for index in range(5)]
    _, history = fine_tune(tiny_model_path, samples, WarmStartConfig(steps=4, step_batch=2, lr=1e-2), tmp_path / "b")
    assert [step["tokens"] for step in history] == [14.0, 14.0, 7.0, 14.0]  # 7 sampled tokens a demonstration
