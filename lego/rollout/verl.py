"""verl's agent-loop entry (configs/gpu/agent_loops.yaml): one rollout of the configured harness with verl's
server engine, graded by the verifier. Config: $LEGO_CONFIG (a name or path; default `default`)."""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any

from lego.records import Trajectory
from lego.rollout.attempt import run_rollout
from lego.rollout.requests import rollout_id
from lego.rollout.resources import rollout_resources
from lego.tasksets.task import Task

_worker: dict[str, Any] = {}  # what one verl worker process opens once: config, Docker engine, verifier


async def run_rollout_for_verl(task: Task, engine) -> tuple[Trajectory, float | None]:
    from lego.config import load_config
    from lego.sandbox.daemon import connect
    from lego.sandbox.image import ensure_base_image
    from lego.verify.grader import Verifier
    from lego.workdir import WorkDir

    if not _worker:
        config = load_config(os.environ.get("LEGO_CONFIG", "default"))
        work = WorkDir.create(config.project.work_dir)
        engine_info = connect(work.docker_root, config.docker.host, config.docker.start_private_daemon)
        base = await asyncio.to_thread(ensure_base_image, engine_info.client, config.docker)
        _worker.update(config=config, work=work, docker=engine_info, base_image=base,
                       verifier=Verifier(engine_info.client, base, config.sandbox, config.verify))
    config, work, info = _worker["config"], _worker["work"], _worker["docker"]
    async with rollout_resources(config, work, engine, docker_client=info.client, docker_host=info.base_url,
                                 base_image=_worker["base_image"]) as (adapter, resources):
        # verl samples each rollout once: a data run of its own per call keeps the one id format.
        trajectory = await run_rollout(task, adapter, resources=resources, config=config,
                                       rollout_id=rollout_id(f"verl-{uuid.uuid4().hex[:10]}", task.instance_id, 0))
    outcome = await asyncio.to_thread(_worker["verifier"].verify, task, trajectory)
    trajectory.metadata["outcome"] = outcome.kind.value
    return trajectory, outcome.reward
