"""The advantage estimator a config names is the one the train stage trains with: rollouts stored and graded
through the real writer, the dataset stage's real advantages, then the real train stage on the tiny model.

A group of four identical trajectories, two resolved and two not: GRPO pushes the failures down (negative
advantages), `success_mass` gives the one distinct success its whole mass, split between its two copies, and
the failures nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_builders import Iteration, R, U, crafted_config, grade, store_rollouts

from lego.config import load_config
from lego.pipeline.artifacts import StageContext, StageResult
from lego.pipeline.dataset_stage import run_dataset_stage
from lego.pipeline.policy import Policy
from lego.pipeline.train_stage import run_train_stage, training_batch
from lego.pipeline.verify_stage import outcome_metrics
from lego.workdir import WorkDir

KINDS = [R, U, R, U]


def dataset_of(tmp_path: Path, *overrides: str) -> tuple[StageContext, StageResult]:
    config = crafted_config(tmp_path / "work", *overrides)
    work = WorkDir.create(config.project.work_dir)
    ctx = StageContext(config=config, work=work, run_id="estimator", runner=None, log=lambda message: None)
    data_run_id = "rollout-estimator-0"
    rollouts = store_rollouts(work, data_run_id, 0, Iteration(kinds={"task-a": KINDS}))
    outcomes = grade(work, data_run_id, 0, rollouts, KINDS, "verify-estimator")
    verify = StageResult(stage="verify", iteration=0, key="verify-estimator", path=str(work.artifacts / "verify"),
                         created_at="2026-01-01T00:00:00+00:00", metrics=outcome_metrics(outcomes),
                         data={"data_run_id": data_run_id, "outcome_stage": "verify-estimator"})
    return ctx, run_dataset_stage(ctx, verify)


def test_learn_config_loads_and_trains_with_success_mass():
    config = load_config("learn")
    assert config.train.adv_estimator == "success_mass"
    assert config.warmstart.enabled


def test_the_train_stage_trains_with_grpo_by_default(tmp_path):
    ctx, dataset = dataset_of(tmp_path)
    batch = training_batch(ctx, dataset)
    assert sorted(batch.advantages) == pytest.approx([-0.866, -0.866, 0.866, 0.866], abs=1e-3)


def test_the_train_stage_trains_with_success_mass_when_configured(tmp_path, tiny_model_path):
    ctx, dataset = dataset_of(tmp_path, "train.adv_estimator=success_mass", "train.router_replay=disabled")
    batch = training_batch(ctx, dataset)
    # the one distinct success takes the whole mass, split between its two copies; failures get nothing
    assert sorted(batch.advantages) == pytest.approx([0.0, 0.0, 0.5, 0.5])

    policy = Policy.from_path(tiny_model_path)
    result = run_train_stage(ctx, 0, dataset, policy)
    metrics = json.loads(Path(result.outputs["train_metrics"]).read_text())
    assert result.data["trained"] and metrics["optimizer_steps"] >= 1
    # the update report sees positive advantages only: nothing was pushed down
    assert "logprob_change_positive" in metrics and "logprob_change_negative" not in metrics
