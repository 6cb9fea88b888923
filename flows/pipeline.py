"""The pipeline flow: taskset -> warmstart, filter, baseline (each optional) -> per iteration: rollout -> verify ->
dataset -> train -> every k: evaluate (`train.adv_estimator: sft` trains on the demonstrations: no rollouts). And `stage_flow`: one stage on top of an earlier run's artifacts.

Each stage is one Prefect task (flows/stages.py) calling its lego.pipeline function; rollout and verify are
subflows because their shards fan out over the task runner."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from flows import stages
from flows.placed import run_iterated_stage
from flows.rollout import rollout_flow_for
from flows.verify import verify_flow_for
from lego.errors import LegoError
from lego.pipeline.manifest import RunNotFoundError
from lego.pipeline.pipeline_run import ITERATED, STAGES, PipelineRun


def _open(config: str, overrides: list[str] | None, **kwargs) -> PipelineRun:
    from lego.config import load_config
    from lego.workdir import WorkDir

    cfg = load_config(config, overrides or [])
    logger = get_run_logger()
    return PipelineRun(cfg, WorkDir.create(cfg.project.work_dir), log=logger.info, **kwargs)


def run_stages(run: PipelineRun) -> None:
    config = run.config
    run_id = run.run_id
    stages.taskset(run_id)
    if config.warmstart.enabled:
        stages.warmstart(run_id)
    if config.filter.enabled:
        stages.filter_by_difficulty(run_id)
    if config.eval.at_start:
        stages.baseline(run_id)
    rollout = rollout_flow_for(config)
    verify = verify_flow_for(config)
    last = config.pipeline.iterations - 1
    for iteration in range(config.pipeline.iterations):
        if config.train.trains_on_rollouts:
            rollout(run_id, iteration)
            verify(run_id, iteration)
            stages.dataset(run_id, iteration)
        run_iterated_stage(run_id, config, "train", iteration)
        if (iteration + 1) % config.eval.every == 0 or iteration == last:
            run_iterated_stage(run_id, config, "evaluate", iteration)


def summarize(run: PipelineRun) -> dict[str, Any]:
    manifest = run.manifest
    stages = {label: {"cached": r.cached, "seconds": r.seconds, "key": r.key, "path": r.path}
              for label, r in manifest.stages.items()}
    evaluations = {label: r.metrics for label, r in manifest.stages.items() if r.stage in ("baseline", "evaluate")}
    return {"run_id": run.run_id, "stages": stages, "evaluations": evaluations,
            "served_from_cache": sorted(label for label, r in manifest.stages.items() if r.cached),
            "computed": sorted(label for label, r in manifest.stages.items() if not r.cached)}


def _finish(run: PipelineRun, body) -> dict[str, Any]:
    try:
        body()
    except BaseException as exc:
        run.finish("failed", {"error": f"{type(exc).__name__}: {exc}"})
        raise
    summary = summarize(run)
    run.finish("completed", summary)
    return summary


@flow(name="lego-pipeline")
def pipeline_flow(config: str = "default", overrides: list[str] | None = None, run_id: str | None = None,
                  resume: bool = False, force: bool = False) -> dict[str, Any]:
    run = _open(config, overrides, run_id=run_id, resume=resume, force=force)
    return _finish(run, lambda: run_stages(run))


STAGE_TASKS = {"taskset": stages.taskset, "warmstart": stages.warmstart, "filter": stages.filter_by_difficulty,
               "baseline": stages.baseline, "dataset": stages.dataset, "train": stages.train,
               "evaluate": stages.evaluate}


@flow(name="lego-stage")
def stage_flow(stage: str, config: str = "default", overrides: list[str] | None = None,
               from_run: str | None = "latest", iteration: int = 0, force: bool = False) -> dict[str, Any]:
    """Rerun one stage with the current config on top of `from_run`'s recorded artifacts (a new run id)."""
    if stage not in STAGES:
        raise LegoError(f"unknown stage {stage!r}; choose one of {', '.join(STAGES)}")
    try:
        run = _open(config, overrides, from_run=from_run, force=force)
    except RunNotFoundError:
        if stage != "taskset" or from_run != "latest":
            raise
        run = _open(config, overrides, force=force)  # the first stage needs no earlier run

    def body() -> None:
        if stage == "rollout":
            rollout_flow_for(run.config)(run.run_id, iteration)
        elif stage == "verify":
            verify_flow_for(run.config)(run.run_id, iteration)
        elif stage in stages.PLACEABLE:
            run_iterated_stage(run.run_id, run.config, stage, iteration)
        elif stage in ITERATED:
            STAGE_TASKS[stage](run.run_id, iteration)
        else:
            STAGE_TASKS[stage](run.run_id)

    summary = _finish(run, body)
    label = stage if stage not in ITERATED else f"{stage}/{iteration}"
    summary["stage"] = summary["stages"].get(label)
    return summary
