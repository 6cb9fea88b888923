from prefect import flow

from lego.pipeline.artifacts import StageResult
from tasks.stages import dataset_task


@flow(name="lego-stage-dataset")
def dataset_flow(run_id: str, iteration: int = 0) -> StageResult:
    return dataset_task(run_id, iteration)
