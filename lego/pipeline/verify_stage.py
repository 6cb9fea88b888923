"""Stage `verify`: every rollout graded in a fresh sandbox; outcomes stored beside the trajectories."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from lego.data.catalog import Catalog
from lego.data.reader import iter_trajectory_headers
from lego.pipeline.artifacts import StageContext, StageOutput, StageResult, load_result, run_cached
from lego.pipeline.grading import grade_attempts
from lego.pipeline.keys import code_version, key_of
from lego.pipeline.stored import stored_outcomes
from lego.pipeline.taskset_stage import read_tasks
from lego.records import Outcome, OutcomeKind
from lego.tasksets.task import Task

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


@dataclass
class VerifyPlan:
    """What a fanned-out grading needs: the result's key, its outcome stage, and the rollouts still ungraded."""

    key: str
    inputs: dict
    iteration: int
    data_run_id: str
    outcome_stage: str
    tasks: list[Task]
    todo: list[str] = field(default_factory=list)
    cached: StageResult | None = None


def plan_verify(ctx: StageContext, rollout: StageResult, task_list: StageResult) -> VerifyPlan:
    """The key (as run_cached makes it), the cache check, and the rollout ids without an outcome yet."""
    iteration = rollout.iteration or 0
    inputs = {"rollout": rollout.key, **grading_settings(ctx)}
    key = key_of({"stage": STAGE, "iteration": iteration, "code": code_version(STAGE), **inputs})
    tasks = read_tasks(task_list.outputs.get("kept_tasks") or task_list.outputs["train_tasks"])
    plan = VerifyPlan(key, inputs, iteration, rollout.data["data_run_id"], f"verify-{key[:8]}", tasks)
    if not ctx.force:
        plan.cached = load_result(ctx.work, STAGE, key)
        if plan.cached is not None:
            return plan
    graded = stored_outcomes(ctx, plan.data_run_id, plan.outcome_stage, iteration)
    with Catalog.open(ctx.work, ctx.config, in_memory=True) as catalog:
        plan.todo = [header.rollout_id for header in iter_trajectory_headers(catalog, plan.data_run_id, "rollout",
                                                                             iteration)
                     if header.rollout_id not in graded]
    return plan


def grade_shard(ctx: StageContext, plan: VerifyPlan, rollout_ids: list[str]) -> int:
    """Grade these rollouts of the plan on this process's engine; a retried shard grades only what is ungraded."""
    before = stored_outcomes(ctx, plan.data_run_id, plan.outcome_stage, plan.iteration)
    grade_attempts(ctx, plan.tasks, data_run_id=plan.data_run_id, rollout_stage="rollout",
                   outcome_stage=plan.outcome_stage, iteration=plan.iteration, only=set(rollout_ids))
    return len([rollout_id for rollout_id in rollout_ids if rollout_id not in before])


def finish_verify(ctx: StageContext, plan: VerifyPlan, label: str | None = None) -> StageResult:
    """The stage's result from the stored outcomes; what no shard graded is graded here."""
    if plan.cached is not None:
        return plan.cached

    def compute(directory: Path) -> StageOutput:
        assert directory.name == plan.key, "verify key drifted between plan and finish"
        outcomes = grade_attempts(ctx, plan.tasks, data_run_id=plan.data_run_id, rollout_stage="rollout",
                                  outcome_stage=plan.outcome_stage, iteration=plan.iteration,
                                  label=label or f"{STAGE}/{plan.iteration}")
        return StageOutput(metrics=outcome_metrics(outcomes),
                           outputs={"outcomes": write_outcomes(directory / "outcomes.json", outcomes)},
                           data={"data_run_id": plan.data_run_id, "outcome_stage": plan.outcome_stage})

    return run_cached(ctx, STAGE, plan.iteration, plan.inputs, compute)


def run_verify_stage(ctx: StageContext, rollout: StageResult, task_list: StageResult) -> StageResult:
    """The whole stage in this process (a flow may fan `grade_shard` out between plan and finish instead)."""
    return finish_verify(ctx, plan_verify(ctx, rollout, task_list))


def shard_ids(rollout_ids: list[str], shards: int) -> list[list[str]]:
    """Round-robin, at most `shards` non-empty parts."""
    parts: list[list[str]] = [[] for _ in range(max(1, min(shards, len(rollout_ids))))]
    for index, rollout_id in enumerate(rollout_ids):
        parts[index % len(parts)].append(rollout_id)
    return [part for part in parts if part]
