"""Stage `verify`: every rollout graded in a fresh sandbox; outcomes stored beside the trajectories."""

from __future__ import annotations

import json
from pathlib import Path

from lego.pipeline.artifacts import StageContext, StageOutput, StageResult, run_cached
from lego.pipeline.grading import grade_attempts
from lego.pipeline.taskset_stage import read_tasks
from lego.records import Outcome, OutcomeKind

STAGE = "verify"


def grading_settings(ctx: StageContext) -> dict:
    config = ctx.config
    return {"verify": config.section_dict("verify"), "sandbox": config.section_dict("sandbox"),
            "base_image": config.section_dict("docker")["base_image_packages"],
            "debian_suite": config.docker.debian_suite}


def outcome_metrics(outcomes: list[Outcome]) -> dict[str, float]:
    """Outcome counts by kind, rates over the graded (infra errors left out), and the cheat rules that fired."""
    counts = {kind.value: 0 for kind in OutcomeKind}
    rules: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome.kind.value] += 1
        for rule in outcome.cheat_rules:
            rules[rule] = rules.get(rule, 0) + 1
    graded = len(outcomes) - counts["infra_error"]
    metrics = {f"outcome.{kind}": float(count) for kind, count in counts.items()}
    # each anti-cheat rule that fired, by how many rollouts it fired on (a rollout can fire several)
    metrics.update({f"cheat_rule.{rule}": float(count) for rule, count in sorted(rules.items())})
    metrics["cheat_rules_fired"] = float(sum(rules.values()))
    metrics.update({"graded": graded, "outcomes": len(outcomes),
                    "infra_error_rate": counts["infra_error"] / len(outcomes) if outcomes else 0.0})
    if graded:
        metrics["resolved_rate"] = counts["resolved"] / graded
        metrics["cheat_rate"] = counts["cheat"] / graded
    return metrics


def write_outcomes(path: Path, outcomes: list[Outcome]) -> Path:
    rows = [{"rollout_id": o.rollout_id, "task_id": o.task_id, "kind": o.kind.value, "reward": o.reward,
             "cheat_rules": o.cheat_rules, "attempts": o.attempts, "check": (o.evidence or {}).get("check")}
            for o in outcomes]
    path.write_text(json.dumps(rows, indent=2, default=str))
    return path


def run_verify_stage(ctx: StageContext, rollout: StageResult, task_list: StageResult) -> StageResult:
    iteration = rollout.iteration or 0
    inputs = {"rollout": rollout.key, **grading_settings(ctx)}

    def compute(directory: Path) -> StageOutput:
        tasks = read_tasks(task_list.outputs.get("kept_tasks") or task_list.outputs["train_tasks"])
        outcome_stage = f"verify-{directory.name[:8]}"
        outcomes = grade_attempts(ctx, tasks, data_run_id=rollout.data["data_run_id"], rollout_stage="rollout",
                                  outcome_stage=outcome_stage, iteration=iteration, label=f"{STAGE}/{iteration}")
        return StageOutput(metrics=outcome_metrics(outcomes),
                           outputs={"outcomes": write_outcomes(directory / "outcomes.json", outcomes)},
                           data={"data_run_id": rollout.data["data_run_id"], "outcome_stage": outcome_stage})

    return run_cached(ctx, STAGE, iteration, inputs, compute)
