"""`lego eval` in MLflow: the evaluation as a parent run with an `evaluate` stage run per harness.

Apart from lego.pipeline.evaluation because the pipeline's evaluate stage runs that module and never logs this
way: a stage's cache key covers the modules it imports (lego.pipeline.keys), so tracking code stays out of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from lego.pipeline.evaluation import PolicyEvaluation


def track_evaluation(tracker, eval_id: str, evaluation: PolicyEvaluation, keys: Mapping[str, str],
                     out_dir: Path) -> dict[str, str]:
    """MLflow: a parent run `eval_id` (tag lego.kind=eval) and, per harness, an `evaluate` stage run that
    `lego compare` lists (tags lego.harness, lego.policy_version, lego.policy, lego.artifact_key), with the report
    as an artifact and each attempt as a trace. Returns harness -> MLflow run id."""
    from lego.config import flatten
    from lego.track.traces import log_result_traces

    policy = evaluation.policy
    parent = tracker.client.create_run(tracker.experiment_id, run_name=eval_id, tags={
        "lego.run_id": eval_id, "lego.kind": "eval", "lego.policy": policy.label,
        "lego.policy_source": policy.source, "lego.harnesses": ",".join(evaluation.harnesses)}).info.run_id
    tracker.log_params(parent, {"policy.path": str(policy.path), "policy.version": policy.version,
                                "policy.scripted": policy.scripted or "", "temperature": evaluation.temperature,
                                "samples_per_task": evaluation.samples_per_task,
                                "tasks": len(evaluation.task_ids),
                                **{f"config.{k}": v for k, v in flatten(tracker.config.model_dump(mode="json")).items()}})
    out_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, str] = {}
    for harness, result in evaluation.harnesses.items():
        report = result.report
        run = tracker.start_stage_run(parent, eval_id, "evaluate", 0)
        tracker.set_tags(run, {"lego.harness": harness, "lego.policy_version": policy.version,
                               "lego.policy": policy.label, "lego.artifact_key": keys[harness],
                               "lego.data_run_id": result.data_run_id, "lego.cached": "false",
                               "lego.coverage_short": str(not report.covered).lower()})
        tracker.log_metrics(run, report.metrics())
        path = out_dir / f"report-{harness}.json"
        path.write_text(report.model_dump_json(indent=2))
        tracker.log_outputs(run, {"eval_report": path}, copy=True)
        log_result_traces(tracker, run_id=eval_id, stage="evaluate", iteration=0,
                          data={"data_run_id": result.data_run_id}, stage_run=run, pipeline_run=parent)
        tracker.end(run)
        runs[harness] = run
    tracker.set_tags(parent, {"lego.coverage_short": str(not evaluation.covered).lower()})
    tracker.end(parent)
    return runs
