from prefect import flow

from lego.pipeline.artifacts import StageResult
from tasks.stages import train_task


@flow(name="lego-stage-train")
def train_flow(run_id: str, iteration: int = 0) -> StageResult:
    return train_task(run_id, iteration)
