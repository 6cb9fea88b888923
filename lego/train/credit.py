"""Where a rollout's advantage goes among its tokens.

GRPO gives every sampled token of a rollout the same advantage, (r_i - mean) / std of its group. `train.credit:
forks` keeps that total and moves it to where the group's outcomes split: the rollouts of one GRPO group sample
from the same prompt, so their token sequences form a prefix tree. The value of a prefix is the mean reward of the
rollouts that share it (the Monte Carlo estimate from the samples at hand), and a token's advantage is the value
after it minus the value before it. Along one sequence these differences telescope to r_i minus the group's mean,
so the sum over a sequence is GRPO's advantage exactly; but the tokens every member shares get nothing, the token
where a failed rollout leaves the successful ones gets the whole blame, and the tokens after it, which no other
member shares, get nothing either (one sample's value before and after a token is the same number).

Why it exists: a policy that reproduces a memorized solution fails by sampling one unlikely token and then
continuing off its demonstration; GRPO blames every token after the fork, so the negative advantages push down
the very continuations the successful rollouts also need, while the successes' own tokens, already near
probability 1, carry almost no gradient. Measured in configs/learn.yaml's comment. Where rollouts diverge at their
first tokens (the usual case for open-ended agent work) this concentrates the credit on a few early tokens and
learns little: keep the default, `sequence`, there.

Segments are compared within a group by (thread, order of that thread's segments in the rollout), so a
sub-agent's segment is compared with the sub-agents of the other rollouts, never with a main thread. A
divergence at a token the policy did not sample (an observation that differs between rollouts with the same
actions) moves no credit onto any action: that is the environment's randomness, not the policy's choice.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Protocol

import numpy as np

# Rewards closer than this are equal: no member of a group with one reward can carry a scale.
_EQUAL = 1e-9


class CreditSample(Protocol):
    """What the placement needs of a training sample (lego.data.batches.TrainingSample has it)."""

    rollout_id: str
    task_id: str
    thread: str
    segment_index: int
    token_ids: np.ndarray
    advantage: float
    reward: float


def common_prefix_lengths(sequence: np.ndarray, others: Sequence[np.ndarray]) -> np.ndarray:
    """For each of `others`, how many leading tokens it shares with `sequence`."""
    lengths = np.empty(len(others), dtype=np.int64)
    for k, other in enumerate(others):
        n = min(len(sequence), len(other))
        differs = np.nonzero(sequence[:n] != other[:n])[0]
        lengths[k] = differs[0] if len(differs) else n
    return lengths


def fork_advantages(token_ids: Sequence[np.ndarray], rewards: Sequence[float], scale: float) -> list[np.ndarray]:
    """Per-token advantages of sequences that share a root: value after each token minus value before it, where a
    prefix's value is the mean reward of the sequences that contain it; times `scale` (GRPO's 1/std)."""
    rewards_array = np.asarray(rewards, dtype=np.float64)
    root_value = float(rewards_array.mean())
    placed = []
    for sequence in token_ids:
        shared = common_prefix_lengths(sequence, token_ids)  # its own entry is its whole length
        length = len(sequence)
        # members[t]: the sequences that share tokens 0..t with this one; their mean reward is the value after t.
        # Sorting the prefix lengths lets each position's member set be a suffix of that order.
        order = np.argsort(shared, kind="stable")
        sorted_lengths = shared[order]
        suffix_sums = np.cumsum(rewards_array[order][::-1])[::-1]
        counts = len(order) - np.arange(len(order))
        positions = np.arange(length)
        first_member = np.searchsorted(sorted_lengths, positions, side="right")  # first k with length > t
        value_after = suffix_sums[first_member] / counts[first_member]
        value_before = np.concatenate([[root_value], value_after[:-1]])
        placed.append(((value_after - value_before) * scale).astype(np.float32))
    return placed


def place_credit_at_forks(samples: Sequence[CreditSample]) -> list[np.ndarray]:
    """Token-level advantages for `samples` (one GRPO iteration's training sequences), in their order.

    The scale of each group is GRPO's: a member's advantage over its reward's distance from the group's mean."""
    groups: dict[str, dict[str, float]] = defaultdict(dict)  # task -> rollout -> reward
    advantages: dict[str, dict[str, float]] = defaultdict(dict)
    for sample in samples:
        groups[sample.task_id][sample.rollout_id] = float(sample.reward)
        advantages[sample.task_id][sample.rollout_id] = float(sample.advantage)
    scales: dict[str, float] = {}
    for task, rewards in groups.items():
        mean = float(np.mean(list(rewards.values())))
        scales[task] = next((advantages[task][rollout] / (reward - mean) for rollout, reward in rewards.items()
                             if abs(reward - mean) > _EQUAL), 0.0)

    # Segments that are compared with each other: same group, same thread, same place among that thread's segments.
    seen: dict[tuple[str, str], int] = defaultdict(int)
    keys = []
    for sample in sorted(samples, key=lambda s: (s.rollout_id, s.segment_index)):
        occurrence = seen[(sample.rollout_id, sample.thread)]
        seen[(sample.rollout_id, sample.thread)] += 1
        keys.append(((sample.task_id, sample.thread, occurrence), sample))
    by_key: dict[tuple[str, str, int], list[CreditSample]] = defaultdict(list)
    for key, sample in keys:
        by_key[key].append(sample)

    placed: dict[tuple[str, int], np.ndarray] = {}
    for (task, _thread, _occurrence), members in by_key.items():
        tokens = [np.asarray(member.token_ids) for member in members]
        rewards = [groups[task][member.rollout_id] for member in members]
        for member, values in zip(members, fork_advantages(tokens, rewards, scales[task]), strict=True):
            placed[(member.rollout_id, member.segment_index)] = values
    return [placed[(sample.rollout_id, sample.segment_index)] for sample in samples]
