"""`lego bench rollout`: rollouts per hour under the scripted policy, per installed harness, and where the wall time
goes (sandbox set-up, harness start, model calls, verification).

Workload: the first bundled train task, the gold patch as the scripted policy in each harness's tool-call format,
a few rollouts one after another per harness (the real tiny model scores the scripted tokens), each graded by the
verifier in a fresh sandbox. Harnesses not installed yet are reported as skipped (install them with
lego.harness.install.ensure_installed).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from lego.bench import register
from lego.config import LegoConfig
from lego.workdir import WorkDir

ROLLOUTS_PER_HARNESS = 4  # one worker's, one after another (its start counts once, as in a rollout stage)
# A comma-separated subset of the harnesses to run (all installed ones when unset). The scorer keeps the full
# log-softmax of each prompt in memory: Claude Code's ~25k-token prompt needs ~30 GB, more than a small machine has.


async def _bench_harness(name: str, config: LegoConfig, work: WorkDir, engine_info, base_image: str,
                         scorer, tokenizer, task, verifier) -> dict[str, Any]:
    from lego.engine.scripted import ScriptedEngine
    from lego.harness.base import get_harness
    from lego.pipeline.attempts import gold_command
    from lego.rollout.attempt import run_rollout
    from lego.rollout.resources import rollout_resources

    rows = []
    wall_start = time.monotonic()  # the worker's start (its proxy, its harness's forkserver) counts
    replies = get_harness(name).gold_replies(gold_command(task))
    async with rollout_resources(config, work, scorer, harness=name, docker_client=engine_info.client,
                                 docker_host=engine_info.base_url, base_image=base_image) as (adapter, resources):
        resources.engine_for = lambda _task: ScriptedEngine(scorer, tokenizer, replies)
        for index in range(ROLLOUTS_PER_HARNESS):
            trajectory = await run_rollout(task, adapter, resources=resources, config=config,
                                           rollout_id=f"bench-{name}-{index}")
            clock = time.monotonic()
            outcome = await asyncio.to_thread(verifier.verify, task, trajectory)
            rows.append({**trajectory.timings, "verify_s": time.monotonic() - clock,
                         "outcome": outcome.kind.value, "termination": trajectory.termination.value})
    wall = time.monotonic() - wall_start
    parts = {key: sum(row.get(key, 0.0) for row in rows)
             for key in ("sandbox_setup_s", "harness_start_s", "model_s", "verify_s")}
    return {
        "rollouts": len(rows), "wall_s": round(wall, 2),
        "rollouts_per_hour": round(3600 * len(rows) / wall, 1),
        "forkserver": config.harness.forkserver and bool(get_harness(name).spec.preload),
        "share_of_wall": {key.removesuffix("_s"): round(value / wall, 3) for key, value in parts.items()},
        "outcomes": [row["outcome"] for row in rows], "terminations": [row["termination"] for row in rows],
    }


@register("rollout")
def bench_rollout(config: LegoConfig, work: WorkDir, harnesses: str = "") -> dict[str, Any]:
    """`harnesses`: a comma-separated subset to run (default: every installed harness)."""
    from lego.engine.checkpoint import default_model_path, init_tiny_model
    from lego.engine.tokenizer import load_tokenizer
    from lego.engine.transformers_engine import TransformersEngine
    from lego.harness.base import get_harness, harness_names
    from lego.harness.install import is_installed
    from lego.sandbox.daemon import docker_engine
    from lego.sandbox.image import ensure_base_image
    from lego.tasksets.load import load_tasks
    from lego.verify.grader import Verifier

    task = next(task for task in load_tasks("bundled").tasks if task.split == "train")
    model_path = default_model_path(config, work)
    if not (model_path / "config.json").exists():
        init_tiny_model(config.model.init, model_path, seed=config.project.seed)
    sampling = config.sampling.model_copy(update={"max_tokens": max(config.sampling.max_tokens, 2048)})
    bench_config = config.model_copy(update={"sampling": sampling})
    scorer = TransformersEngine(model_path, dtype="float32", max_context=32768)
    tokenizer = load_tokenizer()
    results: dict[str, Any] = {"task": task.instance_id, "rollouts_per_harness": ROLLOUTS_PER_HARNESS,
                               "harnesses": {}}
    try:
        with docker_engine(work.docker_root, config.docker.host, config.docker.start_private_daemon) as info:
            base_image = ensure_base_image(info.client, config.docker)
            verifier = Verifier(info.client, base_image, config.sandbox, config.verify)
            chosen = [name.strip() for name in harnesses.split(",") if name.strip()]
            for name in harness_names():
                if chosen and name not in chosen:
                    results["harnesses"][name] = {"skipped": "not in the harnesses option"}
                    continue
                if not is_installed(get_harness(name), None):
                    results["harnesses"][name] = {"skipped": "not installed"}
                    continue
                harness_config = bench_config.model_copy(update={"harness": bench_config.harness.model_copy(
                    update={"name": name, "max_turns": 6})})
                results["harnesses"][name] = asyncio.run(_bench_harness(
                    name, harness_config, work, info, base_image, scorer, tokenizer, task, verifier))
    finally:
        scorer.close()
    return results
