"""One Prefect task per stage (rollout has plan / shard / finish: shards fan out over the task runner)."""

from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from lego.config import LegoConfig
from lego.pipeline.artifacts import StageContext, StageResult
from lego.pipeline.attempts import execute_requests
from lego.pipeline.dataset_stage import run_dataset_stage
from lego.pipeline.evaluate_stage import run_evaluate_stage
from lego.pipeline.filter_stage import run_filter_stage
from lego.pipeline.rollout_stage import RolloutPlan, finish_rollouts, plan_rollouts
from lego.pipeline.runners import RolloutRequest, load_runner
from lego.pipeline.session import get_session
from lego.pipeline.taskset_stage import run_tasks_stage
from lego.pipeline.train_stage import run_train_stage
from lego.pipeline.verify_stage import run_verify_stage
from lego.workdir import WorkDir


@task(name="tasks", cache_policy=NO_CACHE)
def tasks_task(run_id: str) -> StageResult:
    session = get_session(run_id)
    return session.record(run_tasks_stage(session.ctx))


@task(name="filter", cache_policy=NO_CACHE)
def filter_task(run_id: str) -> StageResult:
    session = get_session(run_id)
    return session.record(run_filter_stage(session.ctx, session.result("tasks"), session.policy(0)))


@task(name="rollout-plan", cache_policy=NO_CACHE)
def rollout_plan_task(run_id: str, iteration: int) -> RolloutPlan:
    session = get_session(run_id)
    return plan_rollouts(session.ctx, session.task_list(), session.result("tasks"), session.policy(iteration),
                         iteration)


@task(name="rollout-shard", cache_policy=NO_CACHE)
def rollout_shard_task(config_json: str, work_root: str, run_id: str, plan: RolloutPlan,
                       requests: list[RolloutRequest]) -> int:
    """Self-contained (no session lookup) so that it can run in another process (Ray)."""
    config = LegoConfig.model_validate_json(config_json)
    ctx = StageContext(config=config, work=WorkDir(Path(work_root)), run_id=run_id,
                       runner=load_runner(config.pipeline.runner))
    execute_requests(ctx, plan.tasks, requests, plan.policy, data_run_id=plan.data_run_id, stage="rollout",
                     iteration=plan.iteration, taskset_root=plan.taskset_root)
    return len(requests)


@task(name="rollout-finish", cache_policy=NO_CACHE)
def rollout_finish_task(run_id: str, plan: RolloutPlan) -> StageResult:
    session = get_session(run_id)
    return session.record(finish_rollouts(session.ctx, plan))


@task(name="verify", cache_policy=NO_CACHE)
def verify_task(run_id: str, iteration: int) -> StageResult:
    session = get_session(run_id)
    return session.record(run_verify_stage(session.ctx, session.result("rollout", iteration), session.task_list(),
                                           session.result("tasks")))


@task(name="dataset", cache_policy=NO_CACHE)
def dataset_task(run_id: str, iteration: int) -> StageResult:
    session = get_session(run_id)
    return session.record(run_dataset_stage(session.ctx, session.result("verify", iteration)))


@task(name="train", cache_policy=NO_CACHE)
def train_task(run_id: str, iteration: int) -> StageResult:
    session = get_session(run_id)
    return session.record(run_train_stage(session.ctx, session.result("dataset", iteration),
                                          session.policy(iteration)))


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate_task(run_id: str, iteration: int) -> StageResult:
    """Evaluates the policy produced by iteration `iteration`'s train stage."""
    session = get_session(run_id)
    return session.record(run_evaluate_stage(session.ctx, session.result("tasks"), session.policy(iteration + 1),
                                             iteration))
