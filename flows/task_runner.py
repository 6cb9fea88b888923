"""The task runner rollouts fan out on: Prefect's thread pool, or Ray through prefect-ray where installed."""

from __future__ import annotations

from prefect.task_runners import ThreadPoolTaskRunner

from lego.config import LegoConfig
from lego.errors import ConfigError


def make_task_runner(config: LegoConfig):
    settings = config.pipeline
    if settings.task_runner == "ray":
        try:
            from prefect_ray import RayTaskRunner
        except ImportError as exc:
            raise ConfigError("pipeline.task_runner=ray needs prefect-ray: pip install prefect-ray "
                              "(or set pipeline.task_runner=thread)") from exc
        return RayTaskRunner(address=settings.ray_address) if settings.ray_address else RayTaskRunner()
    return ThreadPoolTaskRunner(max_workers=max(settings.rollout_shards, 1))
