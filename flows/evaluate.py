from prefect import flow

from lego.pipeline.artifacts import StageResult
from tasks.stages import evaluate_task


@flow(name="lego-stage-evaluate")
def evaluate_flow(run_id: str, iteration: int = 0) -> StageResult:
    return evaluate_task(run_id, iteration)
