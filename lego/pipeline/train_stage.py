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
from lego.errors import LegoError
from lego.pipeline.artifacts import StageContext, StageOutput, StageResult, run_cached
from lego.pipeline.dataset_stage import read_advantages
from lego.pipeline.policy import Policy

STAGE = "train"
STEPS_KEY = "steps"  # metrics.json: the list of optimizer steps


class PassProgress:
    """The train step's micro-batch passes on the run's progress board (none without one): minutes of CPU work
    otherwise show nothing between the stage's start and end lines."""

    def __init__(self, ctx: StageContext, label: str) -> None:
        self.ctx, self.label, self.step = ctx, label, None

    def __enter__(self):
        return self.observe

    def observe(self, done: int, total: int) -> None:
        if self.ctx.progress is None:
            return
        if self.step is None:
            self.step = self.ctx.progress.start(self.label, total, verb="micro-batch passes")
        self.step.update(done, {})

    def __exit__(self, *exc) -> None:
        if self.step is not None:
            self.step.finish()


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
    elif ctx.config.train.adv_estimator == "rft":
        # rejection-sampling fine-tuning: the likelihood of each resolved rollout, the others left out
        fields["advantages"] = [1.0 if sample.reward > 0 else 0.0 for sample in samples]
    elif ctx.config.train.credit == "forks":
        from lego.train.credit import place_credit_at_forks

        fields["advantages"] = place_credit_at_forks(samples)
    return TrainBatch(**fields)


def demonstration_samples(ctx: StageContext, warmstart: StageResult) -> list:
    """The warm start's demonstrations graded resolved, as training samples (advantage 1): `train.adv_estimator:
    sft` trains on them instead of the iteration's rollouts."""
    data_run_id = warmstart.data["data_run_id"]
    with Catalog.open(ctx.work, ctx.config, in_memory=True) as catalog:
        resolved = catalog.rows("SELECT rollout_id FROM latest_outcomes WHERE run_id = ? AND kind = 'resolved'",
                                [data_run_id])
        rows = {row["rollout_id"]: {"advantage": 1.0, "reward": 1.0, "is_cheat": False, "policy_version": 0}
                for row in resolved}
        return list(iter_training_samples(catalog, data_run_id, 0, stage="warmstart", advantages=rows)) if rows else []


def _fine_tune_on_demonstrations(ctx: StageContext, warmstart: StageResult | None, policy: Policy,
                                 directory: Path) -> StageOutput:
    """`train.adv_estimator: sft`: `train.epochs` full-batch supervised steps at `train.lr` on the demonstrations."""
    from lego.config import WarmStartConfig
    from lego.train.sft import fine_tune

    if warmstart is None:
        raise LegoError("train.adv_estimator sft continues the warm start's fine-tuning: set warmstart.enabled")
    samples = demonstration_samples(ctx, warmstart)
    settings = WarmStartConfig(enabled=True, steps=ctx.config.train.epochs, step_batch="all", lr=ctx.config.train.lr,
                               grad_clip=ctx.config.train.grad_clip)
    started = time.monotonic()
    checkpoint, history = fine_tune(
        policy.path, samples, settings, directory / "checkpoint", device=ctx.config.engine.device,
        seed=ctx.config.project.seed,
        on_step=lambda step, metrics: ctx.log(f"{STAGE}: sft step {step + 1}/{settings.steps} on "
                                              f"{len(samples)} demonstrations, loss {metrics['loss']:.4f}"))
    (directory / "metrics.json").write_text(json.dumps({"sft": True, STEPS_KEY: []}))
    new_policy = Policy.from_path(checkpoint, key=f"train:{directory.name}")
    metrics = {"trained": 1.0, "optimizer_steps": float(len(history)), "sequences": float(len(samples)),
               "loss": history[-1]["loss"], "grad_norm": history[-1]["grad_norm"],
               "learning_rate": history[-1]["learning_rate"], "seconds": time.monotonic() - started}
    return StageOutput(metrics=metrics, outputs={"checkpoint": checkpoint, "train_metrics": directory / "metrics.json"},
                       data={**new_policy.as_data(), "trained": True})


def run_train_stage(ctx: StageContext, iteration: int, dataset: StageResult | None, policy: Policy,
                    warmstart: StageResult | None = None) -> StageResult:
    """`dataset`: the iteration's rollouts; none under `train.adv_estimator: sft`, which trains on `warmstart`'s
    demonstrations instead."""
    sft = not ctx.config.train.trains_on_rollouts
    inputs = {"policy": policy.key, "train": ctx.config.section_dict("train"), "seed": ctx.config.project.seed,
              "device": ctx.config.engine.device}
    if sft:
        if warmstart is not None:
            inputs["demonstrations"] = warmstart.key
    elif dataset is None:
        raise LegoError(f"train/{iteration} under train.adv_estimator {ctx.config.train.adv_estimator} trains on the "
                        "iteration's rollouts: run its rollout, verify and dataset stages first")
    else:
        inputs["dataset"] = dataset.key

    def compute(directory: Path) -> StageOutput:
        from lego.train.trainer import Trainer

        if sft:
            return _fine_tune_on_demonstrations(ctx, warmstart, policy, directory)
        batch = training_batch(ctx, dataset)
        if batch is None:
            ctx.log(f"train/{iteration}: no rollout in the loss; the policy stays at version {policy.version}")
            (directory / "metrics.json").write_text(json.dumps({"trained": False, STEPS_KEY: []}))
            return StageOutput(metrics={"trained": 0.0, "sequences": 0.0},
                               outputs={"train_metrics": directory / "metrics.json"},
                               data={**policy.as_data(), "trained": False})
        started = time.monotonic()
        trainer = Trainer(policy.path, ctx.config.train, device=ctx.config.engine.device, seed=ctx.config.project.seed)
        with PassProgress(ctx, f"{STAGE}/{iteration}") as on_pass:
            metrics = trainer.step(batch, on_pass=on_pass)
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

