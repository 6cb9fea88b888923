from prefect import flow
from prefect.futures import wait

from flows import stages
from flows.task_runner import make_task_runner
from lego.pipeline.artifacts import StageResult
from lego.pipeline.pipeline_run import get_run
from lego.pipeline.rollout_stage import shard


@flow(name="lego-stage-rollout")
def rollout_flow(run_id: str, iteration: int = 0) -> StageResult:
    run = get_run(run_id)
    plan = stages.rollout_plan(run_id, iteration)
    if plan.cached is None and plan.pending:
        config_json = run.config.model_dump_json()
        futures = [stages.rollout_shard.submit(config_json, str(run.work.root), run_id, plan, part)
                   for part in shard(plan.pending, run.config.pipeline.rollout_shards)]
        run.follow_rollouts(plan, lambda timeout: not wait(futures, timeout=timeout).not_done)
        for future in futures:
            future.result()
    return stages.rollout_finish(run_id, plan)


def rollout_flow_for(config):
    """The rollout flow on the configured task runner."""
    return rollout_flow.with_options(task_runner=make_task_runner(config))
