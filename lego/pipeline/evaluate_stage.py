"""Stage `evaluate` (and `baseline`, the same before RL): the harness on the evaluation split (and the training
split, with eval.splits) at a policy, graded by the verifier: resolved rate with a Wilson interval, infra failures
reported apart. The eval split's metrics are unprefixed; the train split's are prefixed `train.`."""

from __future__ import annotations

from pathlib import Path

from lego.pipeline.artifacts import StageContext, StageOutput, StageResult, run_cached
from lego.pipeline.evaluation import EvalPolicy, evaluate_policy
from lego.pipeline.policy import Policy
from lego.pipeline.rollout_stage import rollout_settings
from lego.pipeline.taskset_stage import read_tasks
from lego.pipeline.verify_stage import grading_settings, write_outcomes

STAGE = "evaluate"


SPLIT_TASKS = {"eval": "eval_tasks", "train": "train_tasks"}


def run_evaluate_stage(ctx: StageContext, tasks_result: StageResult, policy: Policy, iteration: int | None,
                       stage: str = STAGE) -> StageResult:
    """`iteration`: the RL iteration whose policy this is (None for `baseline`, the policy before RL)."""
    inputs = {"tasks": tasks_result.key, "policy": policy.key, "eval": ctx.config.section_dict("eval"),
              **rollout_settings(ctx), **grading_settings(ctx)}

    def compute(directory: Path) -> StageOutput:
        metrics: dict[str, float] = {}
        outputs: dict[str, Path] = {}
        data: dict = {**policy.as_data(), "harness": ctx.config.harness.name}
        for split in ctx.config.eval.splits:
            suffix = "" if split == "eval" else f"-{split}"
            data_run_id = f"eval{suffix}-{directory.name[:16]}"
            report, outcomes = _evaluate_split(ctx, tasks_result, policy, split, data_run_id, iteration or 0)
            (directory / f"report{suffix}.json").write_text(report.model_dump_json(indent=2))
            outputs[f"eval_report{suffix}"] = directory / f"report{suffix}.json"
            outputs[f"eval_outcomes{suffix}"] = write_outcomes(directory / f"outcomes{suffix}.json", outcomes)
            prefix = "" if split == "eval" else f"{split}."
            metrics.update({f"{prefix}{name}": value for name, value in report.metrics().items()})
            data[f"data_run_id{suffix.replace('-', '_')}"] = data_run_id
        return StageOutput(metrics=metrics, outputs=outputs, data=data)

    return run_cached(ctx, stage, iteration, inputs, compute)


def _evaluate_split(ctx: StageContext, tasks_result: StageResult, policy: Policy, split: str, data_run_id: str,
                    iteration: int):
    """`lego eval`'s code (lego.pipeline.evaluation) with the pipeline's harness, on one split of its task list."""
    harness = ctx.config.harness.name
    evaluation = evaluate_policy(ctx, read_tasks(tasks_result.outputs[SPLIT_TASKS[split]]), EvalPolicy.of(policy),
                                 data_run_ids={harness: data_run_id}, stage=STAGE, iteration=iteration,
                                 samples=ctx.config.eval.samples_for(split), label=lambda _: f"{STAGE}/{iteration} {split}")
    result = evaluation.harnesses[harness]
    return result.report, result.outcomes
