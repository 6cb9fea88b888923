"""`train.adv_estimator: success_mass`: raise the probability of the successes a group found, each by how likely
the policy already finds it.

GRPO estimates the policy gradient as the mean of (r_i - mean) * grad log pi(tau_i) over a group's samples: unbiased,
but on a policy that has memorized a solution its variance swamps the signal. Such a policy resolves a task mostly
one way and fails by sampling one of many unlikely tokens somewhere along ~350 near-certain ones; its usual success
has tokens near probability 1, whose gradients are near 0, while a rare success (a few unlikely tokens it happened
to get away with) has gradients about a hundred times larger. The step then goes almost entirely to the rare success
and the usual one's probability does not rise (measured in configs/learn.yaml's comment: over the step sizes that
did not break the policy, the usual success moved by -0.21 to +0.05 nats while rare ones gained up to 36).

This estimator takes the gradient of log sum_{tau in S} r(tau) pi(tau), where S is the set of distinct trajectories
the group sampled: the log of the reward mass the policy puts on what it found (the memory term of MAPO, Liang et
al. 2018, with the group as the memory). Its gradient is

    sum_{tau in S} [r(tau) pi(tau) / sum_{S} r pi] * grad log pi(tau)

so a found success's advantage is its share of the group's found success mass, split evenly among the group's
copies of it. pi(tau) is the sampling policy's probability of everything the rollout sampled (the recorded inference
log-probs, over all its segments). What it means in practice:
- a rollout with reward 0 gets 0: nothing is pushed down (as `negative_advantage_weight: 0`);
- a group where every rollout succeeded still has signal: its likelier successes are raised (the policy sharpens
  toward them), where GRPO sees no variance;
- a group without a success has none;
- a success the policy found very unlikely gets almost nothing, so it cannot take the step.
It is biased toward what the policy already does (a lower bound of the expected reward, restricted to the samples):
meant for a policy that already resolves its tasks sometimes, as after a warm start. Negative rewards count as 0.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Protocol

import numpy as np


class MassSample(Protocol):
    """What the estimator needs of a training sample (lego.data.batches.TrainingSample has it)."""

    rollout_id: str
    task_id: str
    iteration: int
    thread: str
    segment_index: int
    token_ids: np.ndarray
    response_mask: np.ndarray
    logprobs: np.ndarray
    reward: float


def success_mass_advantages(samples: Sequence[MassSample]) -> list[float]:
    """Each sample's advantage (the same for every segment of one rollout); see the module docstring."""
    segments: dict[str, list[MassSample]] = defaultdict(list)
    for sample in samples:
        segments[sample.rollout_id].append(sample)
    # per group, per distinct (trajectory, reward): its rollouts, its log-probability and reward. The reward is part
    # of the key so that a copy graded differently (a flaky test) is no copy: a rollout with reward 0 gets 0.
    groups: dict[tuple[int, str], dict[tuple[bytes, float], list]] = defaultdict(dict)
    for rollout_id, parts in segments.items():
        parts.sort(key=lambda part: (part.thread, part.segment_index))
        trajectory = b"\x00".join(part.thread.encode() + b"\x01" + np.asarray(part.token_ids, np.int64).tobytes()
                                  for part in parts)
        logprob = float(sum(float(np.sum(np.asarray(part.logprobs, np.float64)
                                         * (np.asarray(part.response_mask) > 0))) for part in parts))
        reward = max(float(parts[0].reward), 0.0)
        group = groups[(parts[0].iteration, parts[0].task_id)]
        entry = group.setdefault((trajectory, reward), [[], logprob, reward])
        entry[0].append(rollout_id)
    advantage: dict[str, float] = {}
    for group in groups.values():
        masses = {key: math.log(reward) + logprob for key, (_, logprob, reward) in group.items() if reward > 0}
        if not masses:
            continue
        total = max(masses.values())
        total += math.log(sum(math.exp(mass - total) for mass in masses.values()))
        for key, mass in masses.items():
            rollouts = group[key][0]
            for rollout_id in rollouts:
                advantage[rollout_id] = math.exp(mass - total) / len(rollouts)
    return [advantage.get(sample.rollout_id, 0.0) for sample in samples]
