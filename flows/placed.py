"""A train or evaluate stage placed on the Ray cluster by `pipeline.placement`: one Ray task with that resource
request (a GPU node for training, a node with an engine for evaluation) computes the stage into the shared work
dir; the flow's process resolves its inputs and records its result."""

from prefect import flow

from flows import stages
from flows.task_runner import make_task_runner
from lego.errors import ConfigError
from lego.pipeline.artifacts import StageResult
from lego.pipeline.pipeline_run import get_run


@flow(name="lego-stage-placed")
def placed_flow(run_id: str, stage: str, iteration: int = 0) -> StageResult:
    import ray
    from prefect_ray.context import remote_options

    run = get_run(run_id)
    _, inputs = stages.PLACEABLE[stage]
    placement = run.config.pipeline.placement[stage]
    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    if (unmet := placement.unmet_by(nodes)) is not None:
        raise ConfigError(
            f"pipeline.placement.{stage} asks for {placement.ray_options()}, and no live node of the Ray cluster has "
            f"it (short of {unmet}); start a node that has (`ray start --resources '{{\"trainer\": 1}}'`, a GPU "
            f"node), or change pipeline.placement.{stage}")
    with remote_options(**placement.ray_options()):
        future = stages.placed_stage.submit(run.config.model_dump_json(), str(run.work.root), run_id, stage,
                                            inputs(run, iteration))
    return run.record(future.result())


def run_iterated_stage(run_id: str, config, stage: str, iteration: int) -> StageResult:
    """Train or evaluate: where the config places it, else in this process."""
    if stage in config.pipeline.placement:
        return placed_flow.with_options(task_runner=make_task_runner(config))(run_id, stage, iteration)
    task = stages.train if stage == "train" else stages.evaluate
    return task(run_id, iteration)
