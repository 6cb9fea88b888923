"""train.credit: forks — GRPO's advantage of each rollout, moved onto the tokens where its group's outcomes split."""

from __future__ import annotations

import numpy as np
import pytest

from lego.data.batches import TrainingSample
from lego.train.credit import fork_advantages, place_credit_at_forks

PROMPT = [7, 7, 7]


def Sample(rollout_id: str, task_id: str, thread: str, segment_index: int, token_ids: np.ndarray, advantage: float,  # noqa: N802
           reward: float) -> TrainingSample:
    """A training sample as the trainer gets it, with what the placement does not read left plain."""
    zeros = np.zeros(len(token_ids))
    return TrainingSample(rollout_id, task_id, 0, segment_index, thread, token_ids, zeros.astype(np.uint8),
                          zeros.astype(np.float32), advantage, None, reward, False, 0)


def grpo(rewards: list[float]) -> list[float]:
    r = np.asarray(rewards)
    return list((r - r.mean()) / (r.std(ddof=1) + 1e-6))


def group(task: str, replies: list[list[int]], rewards: list[float], thread: str = "main") -> list[TrainingSample]:
    return [Sample(f"{task}-{i}", task, thread, 0, np.array(PROMPT + reply), adv, reward)
            for i, (reply, reward, adv) in enumerate(zip(replies, rewards, grpo(rewards), strict=True))]


def test_each_sequence_keeps_its_grpo_total():
    samples = group("t", [[1, 2, 3, 4], [1, 2, 9, 9], [1, 5, 3, 4], [1, 2, 3, 8]], [1.0, 0.0, 0.0, 1.0])
    placed = place_credit_at_forks(samples)
    for sample, values in zip(samples, placed, strict=True):
        assert values.sum() == pytest.approx(sample.advantage, abs=1e-5)


def test_credit_sits_on_the_fork_and_nowhere_else():
    # two successes share the whole demonstration; the failure leaves it at its third reply token
    samples = group("t", [[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 9, 4]], [1.0, 1.0, 0.0])
    success, _, failure = place_credit_at_forks(samples)
    fork = len(PROMPT) + 2
    assert np.all(failure[:fork] == 0) and np.all(failure[fork + 1:] == 0)  # shared prefix and the tail after the fork
    assert failure[fork] < 0 and failure[fork] == pytest.approx(samples[2].advantage, abs=1e-5)
    # the successes are credited at the same place: the token that kept them on the demonstration
    assert np.all(success[:fork] == 0) and success[fork] > 0 and np.all(success[fork + 1:] == 0)


def test_no_variance_no_credit():
    placed = place_credit_at_forks(group("t", [[1, 2], [3, 4]], [0.0, 0.0]))
    assert all(np.all(values == 0) for values in placed)


def test_groups_and_threads_are_compared_apart():
    a = group("a", [[1, 2], [1, 3]], [1.0, 0.0])
    b = group("b", [[1, 2], [1, 3]], [0.0, 1.0])  # the same tokens with the opposite outcome in another task
    sub = [Sample("a-0", "a", "sub", 1, np.array(PROMPT + [5, 6]), a[0].advantage, 1.0),
           Sample("a-1", "a", "sub", 1, np.array(PROMPT + [5, 6]), a[1].advantage, 0.0)]
    placed = place_credit_at_forks(a + b + sub)
    assert placed[0][len(PROMPT) + 1] > 0 and placed[2][len(PROMPT) + 1] < 0
    # the sub-agent segments are identical: nothing in them separates the outcomes, so they carry no credit
    assert np.all(placed[4] == 0) and np.all(placed[5] == 0)


def test_fork_values_are_prefix_means():
    # three sequences: the first token splits {0,1} from {2}; the second splits 0 from 1
    values = fork_advantages([np.array([1, 1]), np.array([1, 2]), np.array([2, 2])], [1.0, 0.0, 0.5], scale=1.0)
    assert values[0][0] == pytest.approx(0.5 - 0.5) and values[0][1] == pytest.approx(1.0 - 0.5)
    assert values[2][0] == pytest.approx(0.5 - 0.5) and values[2][1] == 0
    assert values[1][1] == pytest.approx(0.0 - 0.5)
