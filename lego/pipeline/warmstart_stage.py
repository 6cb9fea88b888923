"""Stage `warmstart`: supervised fine-tuning on gold demonstrations before RL.

The configured harness, unmodified, runs each training task through the proxy under a scripted policy that
applies the task's gold patch with the harness's own tools and finishes its own way (HarnessAdapter.gold_replies):
the demonstrations are in the harness's exact format because they went through it. Each is graded by the
verifier; only the resolved ones are kept, and the policy is fine-tuned on their sampled tokens
(lego.train.sft). The result is the policy that RL starts from (iteration 0's rollouts sample from it).
"""

from __future__ import annotations

import json
from pathlib import Path

from lego.cache import cache_dir, content_hash, sha256_file
from lego.data.batches import iter_training_samples
from lego.data.catalog import Catalog
from lego.errors import LegoError
from lego.pipeline.artifacts import StageContext, StageOutput, StageResult, run_cached
from lego.pipeline.attempts import run_attempts
from lego.pipeline.grading import grade_attempts
from lego.pipeline.policy import Policy
from lego.pipeline.rollout_stage import rollout_settings
from lego.pipeline.taskset_stage import demonstrated, read_tasks
from lego.pipeline.verify_stage import grading_settings
from lego.records import OutcomeKind
from lego.tasksets.task import Task

STAGE = "warmstart"


def portable_task_key(tasks: list[Task]) -> str:
    """The tasks' content without where this clone keeps them: a bundle by its bytes, not its path, so that the
    warm start's key is the same in every clone and work dir of this machine (its result is shared)."""
    parts = []
    for task in tasks:
        environment = task.environment.model_copy(
            update={"bundle": sha256_file(Path(task.environment.bundle)) if task.environment.bundle else None})
        parts.append(task.model_copy(update={"environment": environment}).model_dump_json())
    return content_hash(*parts)


def warmstart_inputs(ctx: StageContext, tasks: list[Task], policy: Policy) -> dict:
    """What the warm start's result depends on. Its demonstrations are scripted, not sampled: the sampling
    temperature and top-p shape no token of them (their log-probs are the temperature-1 policy's), so a run that
    samples RL at another temperature reuses the same warm start. max_tokens stays: it can cut a gold reply."""
    settings = rollout_settings(ctx)
    settings["sampling"] = {"max_tokens": ctx.config.sampling.max_tokens}
    return {"tasks": portable_task_key(tasks), "policy": policy.key,
            "warmstart": ctx.config.section_dict("warmstart"), **settings, **grading_settings(ctx)}


def demonstrated_tasks(ctx: StageContext, tasks_result: StageResult) -> list[Task]:
    return demonstrated(ctx.config, read_tasks(tasks_result.outputs["train_tasks"]))


def run_warmstart_stage(ctx: StageContext, tasks_result: StageResult, policy: Policy) -> StageResult:
    tasks = demonstrated_tasks(ctx, tasks_result)
    inputs = warmstart_inputs(ctx, tasks, policy)
    # Shared by every work dir and clone of this machine, as the base image and the tokenizer are; not a run's
    # whose attempts come from a stand-in runner (pipeline.runner): its demonstrations are not the harness's.
    shared = cache_dir(STAGE) if ctx.config.pipeline.runner is None else None

    def compute(directory: Path) -> StageOutput:
        from lego.train.sft import fine_tune

        data_run_id = f"warmstart-{directory.name[:16]}"
        run_attempts(ctx, tasks, policy, samples=1, data_run_id=data_run_id, stage=STAGE, iteration=0, gold=True,
                     label=STAGE)
        outcomes = grade_attempts(ctx, tasks, data_run_id=data_run_id, rollout_stage=STAGE,
                                  outcome_stage=f"{STAGE}-verify", iteration=0, label=f"{STAGE} grading")
        resolved = {o.rollout_id: o for o in outcomes if o.kind == OutcomeKind.resolved}
        ctx.log(f"{STAGE}: {len(resolved)} of {len(outcomes)} gold demonstrations graded resolved")
        if not resolved:
            kinds = sorted({o.kind.value for o in outcomes})
            raise LegoError(f"no gold demonstration of {len(outcomes)} was graded resolved (outcomes: {kinds}); "
                            f"see the {STAGE} rollouts with `lego data show`: a reply cut by sampling.max_tokens "
                            "or a harness that did not finish are the usual causes")
        demonstrations = {rollout_id: {"advantage": 1.0, "reward": 1.0, "is_cheat": False,
                                       "policy_version": policy.version} for rollout_id in resolved}
        with Catalog.open(ctx.work, ctx.config, in_memory=True) as catalog:
            samples = list(iter_training_samples(catalog, data_run_id, 0, stage=STAGE, advantages=demonstrations))
        settings = ctx.config.warmstart
        log_every = max(1, settings.steps // 10)
        progress = ctx.progress.start(f"{STAGE} fine-tuning", settings.steps, verb="steps (at most)") \
            if ctx.progress is not None else None

        def on_step(step: int, metrics: dict[str, float]) -> None:
            if progress is not None:
                progress.advance("steps")
            if step % log_every == 0 or step == settings.steps - 1:
                ctx.log(f"{STAGE}: step {step + 1}/{settings.steps} loss {metrics['loss']:.4f} "
                        f"accuracy {metrics['token_accuracy']:.3f} least likely demonstration "
                        f"{metrics['least_likely_demonstration_logprob']:.2f} nats")

        try:
            checkpoint, history = fine_tune(policy.path, samples, settings, directory / "checkpoint",
                                            device=ctx.config.engine.device, seed=ctx.config.project.seed,
                                            on_step=on_step)
        finally:
            if progress is not None:
                progress.finish()
        (directory / "sft_steps.json").write_text(json.dumps(history))
        if len(history) < settings.steps:
            ctx.log(f"{STAGE}: stopped after {len(history)} steps: a pass over the demonstrations reached "
                    f"warmstart.stop_at_probability={settings.stop_at_probability} or "
                    f"warmstart.stop_at_loss={settings.stop_at_loss}")
        new_policy = Policy.from_path(checkpoint, key=f"warmstart:{directory.name}")
        last = history[-1]
        return StageOutput(
            metrics={"demonstrations": len(outcomes), "resolved_demonstrations": len(resolved),
                     "sequences": len(samples), "steps": len(history), "final_loss": last["loss"],
                     "final_token_accuracy": last["token_accuracy"],
                     "least_likely_demonstration_logprob": last["least_likely_demonstration_logprob"],
                     "seconds_training": sum(step["seconds"] for step in history)},
            outputs={"checkpoint": checkpoint, "sft_steps": directory / "sft_steps.json"},
            data={**new_policy.as_data(), "data_run_id": data_run_id})

    return run_cached(ctx, STAGE, None, inputs, compute, shared=shared)
