from prefect import flow

from lego.pipeline.artifacts import StageResult
from tasks.stages import baseline_task, evaluate_task


@flow(name="lego-stage-evaluate")
def evaluate_flow(run_id: str, iteration: int = 0) -> StageResult:
    return evaluate_task(run_id, iteration)


@flow(name="lego-stage-baseline")
def baseline_flow(run_id: str) -> StageResult:
    return baseline_task(run_id)
