"""Stage `baseline`: the policy RL starts from (the warm start's, else the initial one), measured as `evaluate`
measures every later policy (eval.splits), so that the learning curve has its first point before any RL update."""

from __future__ import annotations

from lego.pipeline.artifacts import StageContext, StageResult
from lego.pipeline.evaluate_stage import run_evaluate_stage
from lego.pipeline.policy import Policy

STAGE = "baseline"


def run_baseline_stage(ctx: StageContext, tasks_result: StageResult, policy: Policy) -> StageResult:
    return run_evaluate_stage(ctx, tasks_result, policy, None, stage=STAGE)
