from prefect import flow

from lego.pipeline.artifacts import StageResult
from tasks.stages import tasks_task


@flow(name="lego-stage-tasks")
def tasks_flow(run_id: str) -> StageResult:
    return tasks_task(run_id)
