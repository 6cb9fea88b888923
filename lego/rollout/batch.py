"""Many rollouts on one worker: the requests, `rollout.concurrency` at a time over one proxy, each trajectory
persisted as soon as it ends, so a crash or Ctrl-C loses none that finished (the caller runs only the requests
not stored yet: lego.pipeline.attempts)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import docker

from lego.config import LegoConfig
from lego.data.writer import DatasetWriter
from lego.errors import LegoError
from lego.records import Trajectory
from lego.rollout.attempt import run_rollout
from lego.rollout.requests import RolloutRequest
from lego.rollout.resources import rollout_resources
from lego.tasksets.task import Task


async def run_rollouts(requests: Sequence[RolloutRequest], tasks: Sequence[Task], config: LegoConfig, work, engine,
                       *, writer: DatasetWriter, stage: str, iteration: int, harness: str | None = None,
                       docker_client: docker.DockerClient | None = None, docker_host: str | None = None,
                       base_image: str | None = None,
                       engine_for: Callable[[Task], object] | None = None) -> list[Trajectory]:
    """Run `requests` (their tasks among `tasks`) and persist each trajectory with `writer` under (stage,
    iteration); returns the trajectories in the order they ended. `engine_for`: see RolloutResources.

    Nothing is printed per rollout: the pipeline shows each stage's progress from what is stored
    (lego.pipeline.progress), whichever worker or process stored it."""
    by_id = {task.instance_id: task for task in tasks}
    unknown = sorted({request.task_id for request in requests} - by_id.keys())
    if unknown:
        raise LegoError(f"rollout requests name tasks that are not in the task list: {unknown[:5]}")
    finished: list[Trajectory] = []
    if not requests:
        return finished
    async with rollout_resources(config, work, engine, harness=harness, docker_client=docker_client,
                                 docker_host=docker_host, base_image=base_image) as (adapter, resources):
        resources.engine_for = engine_for
        semaphore = asyncio.Semaphore(config.rollout.concurrency)
        lock = asyncio.Lock()

        async def one(request: RolloutRequest) -> None:
            async with semaphore:
                trajectory = await run_rollout(by_id[request.task_id], adapter, resources=resources, config=config,
                                               rollout_id=request.rollout_id, iteration=iteration,
                                               sample_index=request.sample_index, seed=request.seed)
            async with lock:
                await asyncio.to_thread(writer.append_trajectories, [trajectory], stage)
                finished.append(trajectory)

        await asyncio.gather(*(one(request) for request in requests))
    return finished
