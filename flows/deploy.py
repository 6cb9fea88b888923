"""Deployments: the pipeline (and chosen stages) served on cron schedules from config.schedule.

`lego deploy` blocks while serving; a scheduled run starts with no one at the keyboard. Stop serving (Ctrl-C)
before stopping the Prefect server it talks to.
"""

from __future__ import annotations

from prefect import serve

from flows.pipeline import pipeline_flow, stage_flow
from lego.config import LegoConfig


def _schedule(cron: str | None, interval_s: float | None) -> dict:
    return {"interval": interval_s} if interval_s else {"cron": cron}


def build_deployments(config: LegoConfig, config_ref: str, overrides: list[str]) -> list:
    name = config.project.name
    deployments = [pipeline_flow.to_deployment(
        name=f"{name}-pipeline", parameters={"config": config_ref, "overrides": overrides},
        tags=["lego", name], **_schedule(config.schedule.cron, config.schedule.interval_s))]
    for stage, cron in config.schedule.stages.items():
        deployments.append(stage_flow.to_deployment(
            name=f"{name}-stage-{stage}",
            parameters={"stage": stage, "config": config_ref, "overrides": overrides, "from_run": "latest"},
            tags=["lego", name, stage], cron=cron))
    return deployments


def serve_deployments(config: LegoConfig, config_ref: str, overrides: list[str]) -> None:
    # One flow run at a time: the pipeline and its stages share one work dir and catalog, and a schedule that fires
    # while a run is still going must queue the next run, not pile runs up on the same machine.
    serve(*build_deployments(config, config_ref, overrides), print_starting_message=True, limit=1)
