"""The difficulty window and GRPO advantages in SQL, against hand-computed values and verl's own function."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lego.config import LegoConfig
from lego.data.batches import iter_training_samples, training_batch_fields
from lego.data.catalog import Catalog
from lego.data.queries import kept_task_ids
from lego.data.sql import SQLTemplateError, load_sql, sql_literal
from lego.data.synthetic import synthetic_trajectory
from lego.data.writer import DatasetWriter
from lego.records import Outcome, OutcomeKind
from lego.workdir import WorkDir

R, U, C, X, T = (OutcomeKind.resolved, OutcomeKind.unresolved, OutcomeKind.cheat, OutcomeKind.infra_error,
                 OutcomeKind.agent_timeout)  # X: infra error


def write_groups(work: WorkDir, groups: dict[str, list[OutcomeKind | None]], stage: str, iteration: int = 0,
                 temperature: float = 1.0, run_id: str = "run") -> list:
    """One rollout per entry; None leaves the rollout ungraded."""
    rng = np.random.default_rng(iteration)
    writer = DatasetWriter(work, run_id)
    trajectories, outcomes = [], []
    for task_id, kinds in groups.items():
        for index, kind in enumerate(kinds):
            trajectory = synthetic_trajectory(rng, f"{stage}-{iteration}-{task_id}-{index}", task_id,
                                              iteration=iteration, sample_index=index, tokens_per_segment=40)
            trajectory.segments[0].response_mask[-10:] = 1  # every sequence has sampled tokens
            trajectory.metadata["temperature"] = temperature
            trajectories.append(trajectory)
            if kind is not None:
                outcomes.append(Outcome(trajectory.rollout_id, task_id, kind))
    writer.append_trajectories(trajectories, stage=stage)
    writer.append_outcomes(outcomes, iteration=iteration, stage="verify")
    return trajectories


def difficulty(work: WorkDir, config: LegoConfig) -> dict[str, tuple]:
    with Catalog.open(work, config) as catalog:
        rows = catalog.rows("SELECT task_id, valid_attempts, solved, verdict FROM task_difficulty")
    return {row["task_id"]: (row["valid_attempts"], row["solved"], row["verdict"]) for row in rows}


def test_difficulty_window_default_and_configured(tmp_path):
    work = WorkDir(tmp_path)
    write_groups(work, {
        "none-solved": [U, U, C, T],
        "half": [R, U, R, U],
        "all-solved": [R, R, R, R],
        "three-of-three-plus-infra": [R, R, R, X],
        "one-of-one-plus-infra": [R, X, X, X],
        "all-infra": [X, X, X, X],
        "three-of-four": [R, R, R, U],
        "one-of-four": [R, U, U, U],
    }, stage="filter")
    # attempts sampled at another temperature do not count
    write_groups(work, {"half": [R, R, R, R]}, stage="filter", iteration=1, temperature=0.2)
    verdicts = difficulty(work, LegoConfig())  # attempts=4: keep 1..3 solved of 4
    assert verdicts == {
        "none-solved": (4, 0, "too_hard"),
        "half": (4, 2, "keep"),
        "all-solved": (4, 4, "too_easy"),
        "three-of-three-plus-infra": (3, 3, "too_easy"),
        "one-of-one-plus-infra": (1, 1, "too_easy"),
        "all-infra": (0, 0, "no_valid_attempts"),
        "three-of-four": (4, 3, "keep"),
        "one-of-four": (4, 1, "keep"),
    }
    narrow = LegoConfig.model_validate({"filter": {"attempts": 4, "min_solved": 2, "max_solved": 2}})
    kept = {task for task, (_, _, verdict) in difficulty(work, narrow).items() if verdict == "keep"}
    assert kept == {"half"}
    with Catalog.open(work, LegoConfig()) as catalog:
        assert kept_task_ids(catalog, "run") == ["half", "one-of-four", "three-of-four"]
    other_temperature = LegoConfig.model_validate({"sampling": {"temperature": 0.2}})
    assert difficulty(work, other_temperature)["half"] == (4, 4, "too_easy")


def verl_advantages(rewards: list[float], groups: list[str], norm: bool, epsilon: float = 1e-6) -> np.ndarray:
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    length = 5
    token_level_rewards = torch.zeros(len(rewards), length)
    token_level_rewards[:, -1] = torch.tensor(rewards)
    response_mask = torch.ones(len(rewards), length)
    advantages, _ = compute_grpo_outcome_advantage(token_level_rewards, response_mask, np.array(groups, dtype=object),
                                                   epsilon=epsilon, norm_adv_by_std_in_grpo=norm)
    return advantages[:, 0].numpy()


GROUPS = {
    "mixed": [R, U, C, X],  # cheat counts 0, infra excluded from the stats
    "all-same": [U, U, T],  # std 0: advantage 0
    "two-valid": [R, X, U, None],  # ungraded also excluded
    "one-valid": [R, X, X],  # below min_valid_per_group=2: dropped
    "skewed": [R, U, U, U, U, R],
}


def sql_advantages(work: WorkDir, config: LegoConfig) -> dict[str, dict]:
    with Catalog.open(work, config) as catalog:
        return {row["rollout_id"]: row for row in catalog.rows("SELECT * FROM advantages")}


@pytest.mark.parametrize("norm", [True, False])
def test_advantages_match_hand_computed_and_verl(tmp_path, norm):
    work = WorkDir(tmp_path)
    trajectories = write_groups(work, GROUPS, stage="rollout")
    config = LegoConfig.model_validate({"data": {"norm_adv_by_std": norm}})
    rows = sql_advantages(work, config)
    by_task = {task: [rows[t.rollout_id] for t in trajectories if t.task_id == task] for task in GROUPS}

    # hand-computed: "mixed" valid rewards [1, 0, 0]: mean 1/3, unbiased std sqrt(1/3)
    mixed = by_task["mixed"]
    assert mixed[0]["group_mean"] == pytest.approx(1 / 3)
    assert mixed[0]["group_std"] == pytest.approx(math.sqrt(1 / 3))
    expected = (2 / 3) / (math.sqrt(1 / 3) + 1e-6) if norm else 2 / 3
    assert mixed[0]["advantage"] == pytest.approx(expected, rel=1e-12)
    assert mixed[2]["is_cheat"] and mixed[2]["reward"] == 0.0 and mixed[2]["in_loss"]
    assert (mixed[3]["in_loss"], mixed[3]["excluded_reason"], mixed[3]["advantage"]) == (False, "infra_error", None)
    assert [row["group_valid"] for row in mixed] == [3] * 4 and mixed[0]["group_size"] == 4
    assert by_task["two-valid"][3]["excluded_reason"] == "not_graded"
    assert all(row["advantage"] == 0.0 for row in by_task["all-same"])
    assert all(not row["in_loss"] for row in by_task["one-valid"])
    assert by_task["one-valid"][0]["excluded_reason"] == "group_too_small"

    # verl on exactly the samples Lego keeps (infra/ungraded removed, small groups dropped)
    kept = [row for row in rows.values() if row["in_loss"]]
    reference = verl_advantages([row["reward"] for row in kept], [row["task_id"] for row in kept], norm)
    np.testing.assert_allclose([row["advantage"] for row in kept], reference, rtol=1e-6, atol=1e-6)

    # infra samples never reach the trainer
    samples = list(iter_training_samples(Catalog.open(work, config), "run", 0))
    assert {s.rollout_id for s in samples} == {row["rollout_id"] for row in kept}
    fields = training_batch_fields(samples)
    assert len(fields["input_ids"]) == len(kept) and fields["routed_experts"][0].dtype == np.uint8
    from lego.train.trainer import TrainBatch

    assert len(TrainBatch(**fields)) == len(kept)


def test_single_sample_groups_follow_verl_when_allowed(tmp_path):
    work = WorkDir(tmp_path)
    write_groups(work, {"alone": [R, X], "pair": [R, U]}, stage="rollout")
    config = LegoConfig.model_validate({"data": {"min_valid_per_group": 1}})
    kept = [row for row in sql_advantages(work, config).values() if row["in_loss"]]
    assert len(kept) == 3
    alone = next(row for row in kept if row["task_id"] == "alone")
    assert (alone["group_mean"], alone["group_std"]) == (0.0, 1.0)
    reference = verl_advantages([row["reward"] for row in kept], [row["task_id"] for row in kept], True)
    np.testing.assert_allclose([row["advantage"] for row in kept], reference, rtol=1e-6, atol=1e-6)


def test_groups_are_per_iteration(tmp_path):
    work = WorkDir(tmp_path)
    write_groups(work, {"t": [R, U]}, stage="rollout", iteration=0)
    write_groups(work, {"t": [R, R, U]}, stage="rollout", iteration=1)
    rows = sql_advantages(work, LegoConfig())
    assert sorted({(row["iteration"], row["group_valid"]) for row in rows.values()}) == [(0, 2), (1, 3)]


def test_sql_placeholders_must_match_parameters():
    with pytest.raises(SQLTemplateError, match="missing: \\['epsilon'"):
        load_sql("advantages", stage="rollout", min_valid=2, norm_by_std=True)
    with pytest.raises(SQLTemplateError, match="no SQL file"):
        load_sql("nonexistent")
    assert sql_literal("it's") == "'it''s'" and sql_literal(None) == "NULL" and sql_literal(False) == "FALSE"
