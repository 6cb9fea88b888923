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

from lego.data.batches import iter_training_samples
from lego.data.catalog import Catalog
from lego.errors import LegoError
from lego.pipeline.artifacts import StageContext, StageOutput, StageResult, run_cached
from lego.pipeline.attempts import run_attempts
from lego.pipeline.grading import grade_attempts
from lego.pipeline.policy import Policy
from lego.pipeline.rollout_stage import rollout_settings
from lego.pipeline.taskset_stage import read_tasks
from lego.pipeline.verify_stage import grading_settings
from lego.records import OutcomeKind

STAGE = "warmstart"


def run_warmstart_stage(ctx: StageContext, tasks_result: StageResult, policy: Policy) -> StageResult:
    inputs = {"tasks": tasks_result.key, "policy": policy.key, "warmstart": ctx.config.section_dict("warmstart"),
              **rollout_settings(ctx), **grading_settings(ctx)}

    def compute(directory: Path) -> StageOutput:
        from lego.train.sft import fine_tune

        tasks = read_tasks(tasks_result.outputs["train_tasks"])
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
        log_every = max(1, ctx.config.warmstart.steps // 10)

        def on_step(step: int, metrics: dict[str, float]) -> None:
            if step % log_every == 0 or step == ctx.config.warmstart.steps - 1:
                ctx.log(f"{STAGE}: step {step + 1}/{ctx.config.warmstart.steps} loss {metrics['loss']:.4f} "
                        f"accuracy {metrics['token_accuracy']:.3f}")

        checkpoint, history = fine_tune(policy.path, samples, ctx.config.warmstart, directory / "checkpoint",
                                        device=ctx.config.engine.device, seed=ctx.config.project.seed,
                                        on_step=on_step)
        (directory / "sft_steps.json").write_text(json.dumps(history))
        if len(history) < ctx.config.warmstart.steps:
            ctx.log(f"{STAGE}: stopped after {len(history)} steps: a pass over the demonstrations reached "
                    f"warmstart.stop_at_loss={ctx.config.warmstart.stop_at_loss}")
        new_policy = Policy.from_path(checkpoint, key=f"warmstart:{directory.name}")
        last = history[-1]
        return StageOutput(
            metrics={"demonstrations": len(outcomes), "resolved_demonstrations": len(resolved),
                     "sequences": len(samples), "steps": len(history), "final_loss": last["loss"],
                     "final_token_accuracy": last["token_accuracy"],
                     "seconds_training": sum(step["seconds"] for step in history)},
            outputs={"checkpoint": checkpoint, "sft_steps": directory / "sft_steps.json"},
            data={**new_policy.as_data(), "data_run_id": data_run_id})

    return run_cached(ctx, STAGE, None, inputs, compute)
