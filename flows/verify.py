from prefect import flow
from prefect.futures import wait

from flows import stages
from flows.task_runner import make_task_runner
from lego.pipeline.artifacts import StageResult
from lego.pipeline.pipeline_run import get_run
from lego.pipeline.verify_stage import shard_ids


@flow(name="lego-stage-verify")
def verify_flow(run_id: str, iteration: int = 0) -> StageResult:
    run = get_run(run_id)
    plan = stages.verify_plan(run_id, iteration)
    settings = run.config.pipeline
    shards = settings.verify_shards or settings.rollout_shards
    if plan.cached is None and plan.todo and shards > 1:
        config_json = run.config.model_dump_json()
        futures = [stages.verify_shard.submit(config_json, str(run.work.root), run_id, plan, part)
                   for part in shard_ids(plan.todo, shards)]
        run.follow_grading(plan, lambda timeout: not wait(futures, timeout=timeout).not_done)
        for future in futures:
            future.result()
    return stages.verify_finish(run_id, plan)


def verify_flow_for(config):
    """The verify flow on the configured task runner."""
    return verify_flow.with_options(task_runner=make_task_runner(config))
