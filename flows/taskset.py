from prefect import flow

from lego.pipeline.artifacts import StageResult
from tasks.stages import taskset_task


@flow(name="lego-stage-taskset")
def taskset_flow(run_id: str) -> StageResult:
    return taskset_task(run_id)
