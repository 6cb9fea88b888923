from prefect import flow

from flows.task_runner import make_task_runner
from lego.pipeline.artifacts import StageResult
from lego.pipeline.rollout_stage import shard
from lego.pipeline.session import get_session
from tasks.stages import rollout_finish_task, rollout_plan_task, rollout_shard_task


@flow(name="lego-stage-rollout")
def rollout_flow(run_id: str, iteration: int = 0) -> StageResult:
    session = get_session(run_id)
    plan = rollout_plan_task(run_id, iteration)
    if plan.cached is None and plan.pending:
        config_json = session.config.model_dump_json()
        futures = [rollout_shard_task.submit(config_json, str(session.work.root), run_id, plan, part)
                   for part in shard(plan.pending, session.config.pipeline.rollout_shards)]
        for future in futures:
            future.result()
    return rollout_finish_task(run_id, plan)


def rollout_flow_for(config):
    """The rollout flow on the configured task runner."""
    return rollout_flow.with_options(task_runner=make_task_runner(config))
