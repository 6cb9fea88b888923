from prefect import flow

from lego.pipeline.artifacts import StageResult
from tasks.stages import warmstart_task


@flow(name="lego-stage-warmstart")
def warmstart_flow(run_id: str) -> StageResult:
    return warmstart_task(run_id)
