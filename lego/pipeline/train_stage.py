"""Stage `train`: one policy update on the iteration's training set (verl losses, R3 replay); the next policy
version is a checkpoint directory inside the artifact.

The artifact's metrics.json holds the stage's metrics and, under `steps`, each optimizer step's own (the trainer's
`OptimizerStep`, numbered on the policy's cumulative step count), so a cached stage can still be plotted per step;
the train_steps table gets one row per optimizer step."""

from __future__ import annotations

import json
import time
from pathlib import Path

from lego.data import codec
from lego.data.batches import iter_training_samples, training_batch_fields
from lego.data.catalog import Catalog
from lego.data.writer import DatasetWriter
from lego.pipeline.artifacts import StageContext, StageOutput, StageResult, run_cached
from lego.pipeline.dataset_stage import read_advantages
from lego.pipeline.policy import Policy

STAGE = "train"
STEPS_KEY = "steps"  # metrics.json: the list of optimizer steps


def training_batch(ctx: StageContext, dataset: StageResult):
    """The TrainBatch of the rollouts in the loss, with the advantages the dataset artifact froze (None when there
    is none)."""
    from lego.train.trainer import TrainBatch

    advantages = {row["rollout_id"]: row for row in read_advantages(dataset) if row["in_loss"]}
    if not advantages:
        return None
    with Catalog.open(ctx.work, ctx.config, in_memory=True) as catalog:
        samples = list(iter_training_samples(catalog, dataset.data["data_run_id"], dataset.iteration or 0,
                                             advantages=advantages))
    if not samples:
        return None
    fields = training_batch_fields(samples)
    if ctx.config.train.adv_estimator == "success_mass":
        from lego.train.success_mass import success_mass_advantages

        fields["advantages"] = success_mass_advantages(samples)
    elif ctx.config.train.credit == "forks":
        from lego.train.credit import place_credit_at_forks

        fields["advantages"] = place_credit_at_forks(samples)
    return TrainBatch(**fields)


def run_train_stage(ctx: StageContext, dataset: StageResult, policy: Policy) -> StageResult:
    iteration = dataset.iteration or 0
    inputs = {"dataset": dataset.key, "policy": policy.key, "train": ctx.config.section_dict("train"),
              "seed": ctx.config.project.seed, "device": ctx.config.engine.device}

    def compute(directory: Path) -> StageOutput:
        from lego.train.trainer import Trainer

        batch = training_batch(ctx, dataset)
        if batch is None:
            ctx.log(f"train/{iteration}: no rollout in the loss; the policy stays at version {policy.version}")
            (directory / "metrics.json").write_text(json.dumps({"trained": False, STEPS_KEY: []}))
            return StageOutput(metrics={"trained": 0.0, "sequences": 0.0},
                               outputs={"train_metrics": directory / "metrics.json"},
                               data={**policy.as_data(), "trained": False})
        started = time.monotonic()
        trainer = Trainer(policy.path, ctx.config.train, device=ctx.config.engine.device, seed=ctx.config.project.seed)
        metrics = trainer.step(batch)
        if not metrics["optimizer_steps"]:
            # Every GRPO group had equal rewards: nothing moves the policy, so it keeps its version.
            ctx.log(f"train/{iteration}: {int(metrics.get('groups_with_signal', 0))} of "
                    f"{int(metrics.get('groups', 0))} groups had signal; no update, the policy stays at version "
                    f"{policy.version}")
            (directory / "metrics.json").write_text(json.dumps({**metrics, STEPS_KEY: []}, indent=2))
            return StageOutput(metrics={**metrics, "trained": 0.0, "seconds": time.monotonic() - started},
                               outputs={"train_metrics": directory / "metrics.json"},
                               data={**policy.as_data(), "trained": False})
        if "logprob_change_likeliest_positive" in metrics:
            ctx.log(f"train/{iteration}: the update moved the log-probs of the rollouts with a positive advantage by "
                    f"{metrics['logprob_change_positive']:+.2f} nats on average, of each group's likeliest success by "
                    f"{metrics['logprob_change_likeliest_positive']:+.2f}"
                    + (f", of those with a negative one by {metrics['logprob_change_negative']:+.2f}"
                       if "logprob_change_negative" in metrics else ""))
        checkpoint = trainer.save(directory / "checkpoint")
        duration = time.monotonic() - started
        tokens = int(sum(len(ids) for ids in batch.input_ids))
        steps = [codec.TrainStep(step=record.step, policy_version=trainer.policy_version, loss=record.loss,
                                 num_sequences=len(batch), num_tokens=tokens, duration_s=record.step_seconds,
                                 metrics=record.metrics())
                 for record in trainer.history]
        DatasetWriter(ctx.work, f"train-{directory.name[:16]}").append_train_steps(steps, iteration)
        (directory / "metrics.json").write_text(json.dumps(
            {**metrics, STEPS_KEY: [record.model_dump() for record in trainer.history]}, indent=2, default=str))
        new_policy = Policy(checkpoint, trainer.policy_version, f"train:{directory.name}")
        return StageOutput(metrics={**metrics, "trained": 1.0, "tokens": tokens, "seconds": duration},
                           outputs={"checkpoint": checkpoint, "train_metrics": directory / "metrics.json"},
                           data={**new_policy.as_data(), "trained": True})

    return run_cached(ctx, STAGE, iteration, inputs, compute)

