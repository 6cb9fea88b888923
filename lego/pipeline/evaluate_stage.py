"""Stage `evaluate`: the harness on the evaluation split at the current policy, graded by the verifier: resolved
rate with a Wilson interval, infra failures reported apart."""

from __future__ import annotations

from pathlib import Path

from lego.data.catalog import Catalog
from lego.data.codec import EvalResult
from lego.data.writer import DatasetWriter
from lego.evaluate.report import summarize_outcomes
from lego.pipeline.artifacts import StageContext, StageOutput, StageResult, run_cached
from lego.pipeline.attempts import attempt_and_grade
from lego.pipeline.policy import Policy
from lego.pipeline.rollout_stage import rollout_settings
from lego.pipeline.verify_stage import grading_settings, write_outcomes

STAGE = "evaluate"


def run_evaluate_stage(ctx: StageContext, tasks_result: StageResult, policy: Policy, iteration: int) -> StageResult:
    inputs = {"tasks": tasks_result.key, "policy": policy.key, "eval": ctx.config.section_dict("eval"),
              **rollout_settings(ctx), **grading_settings(ctx)}

    def compute(directory: Path) -> StageOutput:
        data_run_id = f"eval-{directory.name[:16]}"
        _, outcomes = attempt_and_grade(ctx, tasks_result, "eval_tasks", policy, data_run_id=data_run_id, stage=STAGE,
                                        samples=ctx.config.eval.samples_per_task, iteration=iteration)
        with Catalog.open(ctx.work, ctx.config, in_memory=True) as catalog:
            rows = catalog.rows("SELECT rollout_id, num_turns, num_tokens FROM rollouts WHERE run_id = ? AND "
                                "stage = ? AND iteration = ?", [data_run_id, STAGE, iteration])
        stats = {row["rollout_id"]: (int(row["num_turns"] or 0), int(row["num_tokens"] or 0)) for row in rows}
        report = summarize_outcomes(outcomes, stats, harness=ctx.config.harness.name,
                                    policy_version=policy.version, confidence=ctx.config.eval.confidence)
        DatasetWriter(ctx.work, data_run_id).append_eval_results(
            [EvalResult(o.task_id, ctx.config.harness.name, policy.version, o.kind, o.rollout_id) for o in outcomes],
            iteration)
        (directory / "report.json").write_text(report.model_dump_json(indent=2))
        return StageOutput(metrics=report.metrics(),
                           outputs={"eval_report": directory / "report.json",
                                    "eval_outcomes": write_outcomes(directory / "outcomes.json", outcomes)},
                           data={"data_run_id": data_run_id, **policy.as_data(), "harness": ctx.config.harness.name})

    return run_cached(ctx, STAGE, iteration, inputs, compute)
