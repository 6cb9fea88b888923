"""`lego bench sandbox`: what a sandbox costs, beside a bare `docker run` measured in the same run.

Over the bundled tasks (all of them, or the first `tasks.limit`): sandbox start (container with limits, read-only root, repository copied onto its
tmpfs), close, exec round trip (`true` through the Docker API with Lego's timeout wrapper), and a full
verification of the gold patch (fresh sandbox, patches, decoys, pytest, grading), after each task's decoy plan
(made once per task and cached; its own time is reported apart). The baseline is
`docker run --rm --network none BASE true` through the docker CLI (DOCKER_HOST pointed at the same
engine), or the SDK's equivalent where the CLI is not installed; the result says which.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Any

import numpy as np

from lego.bench import register
from lego.config import LegoConfig
from lego.workdir import WorkDir

BARE_RUNS = 10
EXECS_PER_TASK = 10


def _stats(values: list[float], scale: float = 1.0, digits: int = 3) -> dict[str, Any]:
    array = np.asarray(values, dtype=float) * scale
    return {"n": int(array.size), "median": round(float(np.median(array)), digits),
            "p95": round(float(np.percentile(array, 95)), digits), "min": round(float(array.min()), digits),
            "max": round(float(array.max()), digits)}


def _bare_docker_run(engine, image: str) -> tuple[list[float], str]:
    docker_cli = shutil.which("docker")
    times = []
    if docker_cli:
        env = {**os.environ, **engine.env()}
        for _ in range(BARE_RUNS):
            started = time.perf_counter()
            subprocess.run([docker_cli, "run", "--rm", "--network", "none", image, "true"], env=env, check=True,
                           capture_output=True)
            times.append(time.perf_counter() - started)
        return times, f"docker CLI ({docker_cli}) with DOCKER_HOST={engine.base_url}"
    for _ in range(BARE_RUNS):
        started = time.perf_counter()
        engine.client.containers.run(image, ["true"], remove=True, network_mode="none")
        times.append(time.perf_counter() - started)
    return times, "docker SDK containers.run(remove=True, network_mode='none') (no docker CLI installed)"


@register("sandbox")
def bench_sandbox(config: LegoConfig, work: WorkDir) -> dict[str, Any]:
    from lego.sandbox.daemon import docker_engine
    from lego.sandbox.docker_sandbox import DockerSandboxFactory
    from lego.sandbox.image import ensure_base_image
    from lego.sandbox.task_image import ensure_task_image
    from lego.tasksets.load import load_tasks
    from lego.verify.grader import Verifier

    total_started = time.perf_counter()
    # All bundled tasks (tasks.limit=N takes the first N, for a quick check).
    tasks = load_tasks("bundled", "all", strict=True, limit=config.tasks.limit).tasks
    with docker_engine(work.docker_root, config.docker.host, config.docker.start_private_daemon) as engine:
        base = ensure_base_image(engine.client, config.docker)
        build_started = time.perf_counter()
        images = {task.instance_id: ensure_task_image(engine.client, task, base) for task in tasks}
        image_seconds = time.perf_counter() - build_started
        # Warm the engine (first container start pays for page cache and layer mounts) before measuring.
        engine.client.containers.run(base, ["true"], remove=True, network_mode="none")
        bare, bare_via = _bare_docker_run(engine, base)

        factory = DockerSandboxFactory(engine.client, config.sandbox, base_image=base)
        starts, closes, execs = [], [], []
        for task in tasks:
            started = time.perf_counter()
            sandbox = factory.open(images[task.instance_id], task.environment.workdir, purpose="bench")
            starts.append(time.perf_counter() - started)
            try:
                for _ in range(EXECS_PER_TASK):
                    started = time.perf_counter()
                    result = sandbox.exec("true", timeout=30)
                    execs.append(time.perf_counter() - started)
                    assert result.exit_code == 0, result.output
            finally:
                started = time.perf_counter()
                sandbox.close()
                closes.append(time.perf_counter() - started)

        verifier = Verifier(engine.client, base, config.sandbox, config.verify, factory=factory)
        # Each task's decoys are validated once under its gold patch and cached (a cold cache pays it here).
        plan_times = []
        for task in tasks:
            started = time.perf_counter()
            verifier.pytest_grading.decoy_plan(task)
            plan_times.append(time.perf_counter() - started)
        verify_times, per_task = [], {}
        for task in tasks:
            started = time.perf_counter()
            outcome = verifier.verify(task, diff=task.patch, actions=[])
            seconds = time.perf_counter() - started
            verify_times.append(seconds)
            per_task[task.instance_id] = {"seconds": round(seconds, 3), "kind": outcome.kind.value,
                                          "attempts": outcome.attempts,
                                          "decoys": outcome.evidence.get("decoys", {}).get("count", 0)}
        docker_version = engine.client.version().get("Version")
        base_url, private = engine.base_url, engine.private

    start_stats = _stats(starts)
    bare_stats = _stats(bare)
    return {
        "benchmark": "sandbox",
        "engine": {"base_url": base_url, "private_dockerd": private, "docker_version": docker_version},
        "base_image": base,
        "tasks": len(tasks),
        "task_images_seconds": round(image_seconds, 2),
        "limits": config.sandbox.model_dump(),
        "bare_docker_run_s": {**bare_stats, "command": f"docker run --rm --network none {base} true",
                              "via": bare_via},
        "sandbox_start_s": start_stats,
        "sandbox_close_s": _stats(closes),
        "exec_roundtrip_ms": _stats(execs, scale=1000, digits=1),
        "decoy_plan_s": _stats(plan_times),
        "verify_gold_s": _stats(verify_times),
        "verify_per_task": per_task,
        "verify_resolved": sum(1 for entry in per_task.values() if entry["kind"] == "resolved"),
        "start_over_bare_median": round(start_stats["median"] / bare_stats["median"], 2),
        "wall_seconds": round(time.perf_counter() - total_started, 1),
    }
