from prefect import flow

from lego.pipeline.artifacts import StageResult
from tasks.stages import filter_task


@flow(name="lego-stage-filter")
def filter_flow(run_id: str) -> StageResult:
    return filter_task(run_id)
