"""The success-mass advantage estimator (lego/train/success_mass.py): each found success weighted by its share of
the probability of its group's found successes, split among its copies; failures get 0."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from pydantic import ValidationError

from lego.config import TrainConfig
from lego.train.success_mass import success_mass_advantages


@dataclass
class Sample:
    rollout_id: str
    task_id: str
    token_ids: np.ndarray
    response_mask: np.ndarray
    logprobs: np.ndarray
    reward: float
    iteration: int = 0
    thread: str = "main"
    segment_index: int = 0


def sample(rollout_id: str, task_id: str, tokens: list[int], sampled_logprobs: list[float], reward: float,
           **kw) -> Sample:
    """A segment whose first two tokens are prompt (mask 0, a log-prob that must not count) and the rest sampled."""
    ids = np.array([1, 2, *tokens], dtype=np.int32)
    mask = np.array([0, 0] + [1] * len(tokens), dtype=np.uint8)
    logprobs = np.array([-50.0, -50.0, *sampled_logprobs], dtype=np.float32)
    return Sample(rollout_id, task_id, ids, mask, logprobs, reward, **kw)


def test_a_found_success_gets_its_share_of_the_success_mass_split_among_its_copies():
    usual, rare = [10, 11, 12], [10, 13, 12]
    samples = [sample(f"a{i}", "a", usual, [-0.1, -0.2, -0.2], 1.0) for i in range(3)]
    samples += [sample("a3", "a", rare, [-0.1, -6.0, -3.9], 1.0),
                sample("a4", "a", [10, 14], [-0.1, -7.0], 0.0)]
    advantages = success_mass_advantages(samples)
    usual_mass, rare_mass = math.exp(-0.5), math.exp(-10.0)
    share = usual_mass / (usual_mass + rare_mass)
    assert advantages[:3] == pytest.approx([share / 3] * 3, rel=1e-5)
    assert advantages[3] == pytest.approx(1 - share, rel=1e-4)
    assert advantages[4] == 0.0
    assert sum(advantages) == pytest.approx(1.0)


def test_groups_are_apart_and_a_group_without_success_has_no_signal():
    samples = [sample("a0", "a", [5], [-1.0], 1.0), sample("a1", "a", [6], [-1.0], 1.0),
               sample("b0", "b", [5], [-0.1], 0.0), sample("b1", "b", [6], [-0.1], 0.0),
               sample("c0", "c", [5], [-0.1], 1.0, iteration=1)]
    advantages = success_mass_advantages(samples)
    # every rollout of a succeeded: still signal, shared by likelihood (here equal)
    assert advantages[:2] == pytest.approx([0.5, 0.5])
    assert advantages[2:4] == [0.0, 0.0]
    assert advantages[4] == pytest.approx(1.0)  # same task, another iteration: another group


def test_a_rollout_is_weighed_by_all_its_segments_and_each_segment_gets_its_advantage():
    two_segments = [sample("a0", "a", [7, 8], [-1.0, -1.0], 1.0, segment_index=0),
                    sample("a0", "a", [9], [-3.0], 1.0, segment_index=1)]
    one_segment = [sample("a1", "a", [7, 8], [-1.0, -1.0], 1.0)]  # the same first segment, nothing after
    advantages = success_mass_advantages(two_segments + one_segment)
    mass0, mass1 = math.exp(-5.0), math.exp(-2.0)
    assert advantages[0] == advantages[1] == pytest.approx(mass0 / (mass0 + mass1), rel=1e-5)
    assert advantages[2] == pytest.approx(mass1 / (mass0 + mass1), rel=1e-5)


def test_partial_rewards_weigh_in_and_negative_rewards_count_as_zero():
    samples = [sample("a0", "a", [1], [-1.0], 0.5), sample("a1", "a", [2], [-1.0], 1.0),
               sample("a2", "a", [3], [-1.0], -1.0)]
    assert success_mass_advantages(samples) == pytest.approx([1 / 3, 2 / 3, 0.0])


def test_extreme_log_probabilities_do_not_overflow():
    samples = [sample("a0", "a", [1], [-2000.0], 1.0), sample("a1", "a", [2], [-2001.0], 1.0)]
    advantages = success_mass_advantages(samples)
    assert advantages == pytest.approx([1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1))])


def test_it_cannot_be_combined_with_fork_credit():
    with pytest.raises(ValidationError, match="train.credit: sequence"):
        TrainConfig(adv_estimator="success_mass", credit="forks")
    assert TrainConfig(adv_estimator="success_mass").credit == "sequence"
