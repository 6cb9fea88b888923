"""One Prefect task per stage, each calling its lego.pipeline function and recording the result in the run.

A flow calls these directly (flow -> stage task -> lego.pipeline); rollout and verify have three (plan / shard /
finish) because their shards fan out over the task runner (flows/rollout.py, flows/verify.py). Caching is Lego's
own (artifacts keyed by a content hash, lego.pipeline.keys), so every task uses Prefect's NO_CACHE: a Prefect cache
entry whose artifact was deleted must not count.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from lego.config import LegoConfig
from lego.pipeline.artifacts import StageContext, StageResult
from lego.pipeline.attempts import execute_requests, pending_requests
from lego.pipeline.baseline_stage import run_baseline_stage
from lego.pipeline.dataset_stage import run_dataset_stage
from lego.pipeline.evaluate_stage import run_evaluate_stage
from lego.pipeline.filter_stage import run_filter_stage
from lego.pipeline.pipeline_run import PipelineRun, get_run
from lego.pipeline.rollout_stage import RolloutPlan, finish_rollouts, plan_rollouts
from lego.pipeline.runners import load_runner
from lego.pipeline.taskset_stage import run_taskset_stage
from lego.pipeline.train_stage import run_train_stage
from lego.pipeline.verify_stage import VerifyPlan, finish_verify, grade_shard, plan_verify
from lego.pipeline.warmstart_stage import run_warmstart_stage
from lego.rollout.requests import RolloutRequest
from lego.workdir import WorkDir


@task(name="taskset", cache_policy=NO_CACHE)
def taskset(run_id: str) -> StageResult:
    run = get_run(run_id)
    return run.record(run_taskset_stage(run.ctx))


@task(name="warmstart", cache_policy=NO_CACHE)
def warmstart(run_id: str) -> StageResult:
    run = get_run(run_id)
    return run.record(run_warmstart_stage(run.ctx, run.result("taskset"), run.initial_policy()))


@task(name="baseline", cache_policy=NO_CACHE)
def baseline(run_id: str) -> StageResult:
    """Evaluates the policy RL starts from (iteration 0 samples from it)."""
    run = get_run(run_id)
    return run.record(run_baseline_stage(run.ctx, run.result("taskset"), run.policy(0)))


@task(name="filter", cache_policy=NO_CACHE)
def filter_by_difficulty(run_id: str) -> StageResult:
    run = get_run(run_id)
    return run.record(run_filter_stage(run.ctx, run.result("taskset"), run.policy(0)))


@task(name="rollout-plan", cache_policy=NO_CACHE)
def rollout_plan(run_id: str, iteration: int) -> RolloutPlan:
    run = get_run(run_id)
    return plan_rollouts(run.ctx, run.task_list(), run.policy(iteration), iteration)


@task(name="rollout-shard", cache_policy=NO_CACHE)
def rollout_shard(config_json: str, work_root: str, run_id: str, plan: RolloutPlan,
                       requests: list[RolloutRequest]) -> int:
    """Self-contained (no run lookup) so that it can run in another process (Ray)."""
    config = LegoConfig.model_validate_json(config_json)
    ctx = StageContext(config=config, work=WorkDir(Path(work_root)), run_id=run_id,
                       runner=load_runner(config.pipeline.runner))
    # A retried shard (Ray reruns the task of a worker that died) runs only what is not stored yet: a lost worker
    # costs its unfinished rollouts, and none is stored twice.
    pending = pending_requests(ctx, requests, plan.data_run_id, "rollout", plan.iteration)
    execute_requests(ctx, plan.tasks, pending, plan.policy, data_run_id=plan.data_run_id, stage="rollout",
                     iteration=plan.iteration)
    return len(pending)


@task(name="rollout-finish", cache_policy=NO_CACHE)
def rollout_finish(run_id: str, plan: RolloutPlan) -> StageResult:
    run = get_run(run_id)
    return run.record(finish_rollouts(run.ctx, plan))


@task(name="verify-plan", cache_policy=NO_CACHE)
def verify_plan(run_id: str, iteration: int) -> VerifyPlan:
    run = get_run(run_id)
    return plan_verify(run.ctx, run.result("rollout", iteration), run.task_list())


@task(name="verify-shard", cache_policy=NO_CACHE)
def verify_shard(config_json: str, work_root: str, run_id: str, plan: VerifyPlan, rollout_ids: list[str]) -> int:
    """Self-contained (no run lookup) so that it can run in another process (Ray), grading on that worker's
    engine."""
    config = LegoConfig.model_validate_json(config_json)
    ctx = StageContext(config=config, work=WorkDir(Path(work_root)), run_id=run_id,
                       runner=load_runner(config.pipeline.runner))
    return grade_shard(ctx, plan, rollout_ids)


@task(name="verify-finish", cache_policy=NO_CACHE)
def verify_finish(run_id: str, plan: VerifyPlan) -> StageResult:
    run = get_run(run_id)
    return run.record(finish_verify(run.ctx, plan))


@task(name="dataset", cache_policy=NO_CACHE)
def dataset(run_id: str, iteration: int) -> StageResult:
    run = get_run(run_id)
    return run.record(run_dataset_stage(run.ctx, run.result("verify", iteration)))


def train_inputs(run: PipelineRun, iteration: int) -> tuple:
    """The train stage's inputs at the run's `iteration`: the iteration, its dataset (none for `sft`, which samples
    no rollouts), the policy it updates, the warm start's result (its demonstrations, for `sft`)."""
    dataset = run.result("dataset", iteration) if run.config.train.trains_on_rollouts else None
    return iteration, dataset, run.policy(iteration), run.manifest.get("warmstart")


def evaluate_inputs(run: PipelineRun, iteration: int) -> tuple:
    """The evaluate stage's: the task set, and the policy iteration `iteration`'s train stage produced."""
    return run.result("taskset"), run.policy(iteration + 1), iteration


PLACEABLE = {"train": (run_train_stage, train_inputs), "evaluate": (run_evaluate_stage, evaluate_inputs)}


@task(name="train", cache_policy=NO_CACHE)
def train(run_id: str, iteration: int) -> StageResult:
    run = get_run(run_id)
    return run.record(run_train_stage(run.ctx, *train_inputs(run, iteration)))


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate(run_id: str, iteration: int) -> StageResult:
    """Evaluates the policy produced by iteration `iteration`'s train stage."""
    run = get_run(run_id)
    return run.record(run_evaluate_stage(run.ctx, *evaluate_inputs(run, iteration)))


@task(name="placed-stage", cache_policy=NO_CACHE)
def placed_stage(config_json: str, work_root: str, run_id: str, stage: str, inputs: tuple) -> StageResult:
    """A train or evaluate stage computed where `pipeline.placement` puts it (a Ray task on a cluster node);
    self-contained (no run lookup), its inputs resolved by the flow's process."""
    config = LegoConfig.model_validate_json(config_json)
    ctx = StageContext(config=config, work=WorkDir(Path(work_root)), run_id=run_id,
                       runner=load_runner(config.pipeline.runner))
    compute, _ = PLACEABLE[stage]
    return compute(ctx, *inputs)
