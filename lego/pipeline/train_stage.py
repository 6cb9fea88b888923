"""Stage `train`: one policy update on the iteration's training set (verl losses, R3 replay); the next policy
version is a checkpoint directory inside the artifact."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow.compute as pc

from lego.data import codec
from lego.data.catalog import Catalog
from lego.data.reader import iter_segment_batches
from lego.data.writer import DatasetWriter
from lego.pipeline.artifacts import StageContext, StageOutput, StageResult, run_cached
from lego.pipeline.dataset_stage import read_advantages
from lego.pipeline.runners import Policy

STAGE = "train"


def training_batch(ctx: StageContext, dataset: StageResult):
    """The TrainBatch of the rollouts in the loss (None when there is none)."""
    from lego.train.trainer import TrainBatch

    advantages = {row["rollout_id"]: row["advantage"] for row in read_advantages(dataset) if row["in_loss"]}
    if not advantages:
        return None
    ids, masks, logprobs, advs, routing = [], [], [], [], []
    where = pc.field("rollout_id").isin(list(advantages)) & (pc.field("num_response_tokens") > 0)
    with Catalog.open(ctx.work, ctx.config, in_memory=True) as catalog:
        for batch in iter_segment_batches(catalog, dataset.data["data_run_id"], "rollout", dataset.iteration or 0,
                                          where=where):
            for rollout_id, _, segment in codec.segments_from_batch(batch):
                ids.append(segment.token_ids)
                masks.append(segment.response_mask)
                logprobs.append(segment.logprobs)
                advs.append(float(advantages[rollout_id]))
                routing.append(segment.routed_experts)
    if not ids:
        return None
    return TrainBatch(input_ids=ids, response_mask=masks, inference_logprobs=logprobs, advantages=advs,
                      routed_experts=None if all(r is None for r in routing) else routing)


def run_train_stage(ctx: StageContext, dataset: StageResult, policy: Policy) -> StageResult:
    iteration = dataset.iteration or 0
    inputs = {"dataset": dataset.key, "policy": policy.key, "train": ctx.config.section_dict("train"),
              "seed": ctx.config.project.seed, "device": ctx.config.engine.device}

    def compute(directory: Path) -> StageOutput:
        from lego.train.trainer import Trainer

        batch = training_batch(ctx, dataset)
        if batch is None:
            ctx.log(f"train/{iteration}: no rollout in the loss; the policy stays at version {policy.version}")
            (directory / "metrics.json").write_text(json.dumps({"trained": False}))
            return StageOutput(metrics={"trained": 0.0, "sequences": 0.0},
                               outputs={"train_metrics": directory / "metrics.json"},
                               data={**policy.as_data(), "trained": False})
        started = time.monotonic()
        trainer = Trainer(policy.path, ctx.config.train, device=ctx.config.engine.device, seed=ctx.config.project.seed)
        metrics = trainer.step(batch)
        checkpoint = trainer.save(directory / "checkpoint")
        duration = time.monotonic() - started
        tokens = int(sum(len(ids) for ids in batch.input_ids))
        step = codec.TrainStep(step=trainer.steps, policy_version=trainer.policy_version,
                               loss=float(metrics.get("loss", 0.0)), num_sequences=len(batch), num_tokens=tokens,
                               duration_s=duration,
                               metrics={k: float(v) for k, v in metrics.items() if v == v})  # drop NaN
        DatasetWriter(ctx.work, f"train-{directory.name[:16]}").append_train_steps([step], iteration)
        (directory / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str))
        new_policy = Policy(checkpoint, trainer.policy_version, f"train:{directory.name}")
        return StageOutput(metrics={**metrics, "trained": 1.0, "tokens": tokens, "seconds": duration},
                           outputs={"checkpoint": checkpoint, "train_metrics": directory / "metrics.json"},
                           data={**new_policy.as_data(), "trained": True})

    return run_cached(ctx, STAGE, iteration, inputs, compute)


def policy_after(train: StageResult) -> Policy:
    return Policy.from_data(train.data)
