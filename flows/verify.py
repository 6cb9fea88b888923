from prefect import flow

from lego.pipeline.artifacts import StageResult
from tasks.stages import verify_task


@flow(name="lego-stage-verify")
def verify_flow(run_id: str, iteration: int = 0) -> StageResult:
    return verify_task(run_id, iteration)
