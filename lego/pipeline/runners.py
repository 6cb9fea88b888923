"""What runs a rollout and what grades one: the real harness-in-sandbox stack, or an injected stand-in.

The pipeline wiring only needs two capabilities: persist trajectories for a list of rollout requests, and grade
one trajectory. `load_runner(None)` gives the real ones (lego.rollout + lego.verify on the local Docker engine);
`load_runner("package.module:Name")` instantiates another implementation (tests use this to exercise the wiring
in seconds beside the end-to-end test of the real stages).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from lego.data.writer import DatasetWriter
from lego.errors import LegoError
from lego.pipeline.keys import checkpoint_key
from lego.records import Outcome, Trajectory
from lego.tasksets.task import Task


@dataclass(frozen=True)
class Policy:
    path: Path
    version: int
    key: str

    @classmethod
    def from_path(cls, path: str | Path, key: str | None = None) -> Policy:
        from lego.engine.checkpoint import policy_version

        path = Path(path)
        return cls(path=path, version=policy_version(path), key=key or checkpoint_key(path))

    def as_data(self) -> dict:
        return {"policy_path": str(self.path), "policy_version": self.version, "policy_key": self.key}

    @classmethod
    def from_data(cls, data: dict) -> Policy:
        return cls(Path(data["policy_path"]), int(data["policy_version"]), data["policy_key"])


@dataclass(frozen=True)
class RolloutRequest:
    task_id: str
    sample_index: int
    rollout_id: str


Grader = Callable[[Task, Trajectory], Outcome]


class StageRunner(Protocol):
    def rollout(self, ctx, tasks: Sequence[Task], requests: Sequence[RolloutRequest], policy: Policy, *,
                stage: str, iteration: int, writer: DatasetWriter, taskset_root: Path | None) -> None:
        """Run the requests and persist one trajectory per request with `writer` (stage, iteration)."""

    def grader(self, ctx, taskset_root: Path | None) -> contextlib.AbstractContextManager[Grader]:
        """A grading function, valid inside the context."""


class RealRunner:
    """The harness in a Docker sandbox through the proxy (lego.rollout), graded in a fresh sandbox (lego.verify)."""

    def rollout(self, ctx, tasks, requests, policy, *, stage, iteration, writer, taskset_root) -> None:
        import asyncio

        from lego.engine import make_engine

        engine = make_engine(ctx.config, policy.path)
        try:
            asyncio.run(self._rollouts(ctx, tasks, requests, engine, stage=stage, iteration=iteration,
                                       writer=writer, taskset_root=taskset_root))
        finally:
            close = getattr(engine, "close", None)
            if close is not None:
                close()

    @staticmethod
    async def _rollouts(ctx, tasks, requests, engine, *, stage, iteration, writer, taskset_root) -> None:
        from lego.rollout import PlannedRollout, run_planned_rollouts

        by_id = {task.instance_id: task for task in tasks}
        planned = [PlannedRollout(by_id[request.task_id], request.sample_index, request.rollout_id)
                   for request in requests]
        await run_planned_rollouts(planned, ctx.config, ctx.work, engine, writer=writer, stage=stage,
                                   iteration=iteration, taskset_root=taskset_root, log=ctx.log)

    @contextlib.contextmanager
    def grader(self, ctx, taskset_root: Path | None) -> Iterator[Grader]:
        from lego.sandbox.daemon import docker_engine
        from lego.sandbox.image import ensure_base_image
        from lego.verify import Verifier

        config = ctx.config
        with docker_engine(ctx.work.docker_root, config.docker.host, config.docker.start_private_daemon) as engine:
            base_image = ensure_base_image(engine.client, config.docker)
            verifier = Verifier(engine.client, base_image, config.sandbox, config.verify)
            yield lambda task, trajectory: verifier.verify(task, trajectory, taskset_root=taskset_root)


def load_runner(spec: str | None) -> StageRunner:
    """None: the real stack. "module:Name": that class (or factory), instantiated with no argument."""
    if not spec:
        return RealRunner()
    module_name, _, attribute = spec.partition(":")
    if not attribute:
        raise LegoError(f"stage runner {spec!r} must look like 'package.module:ClassName'")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise LegoError(f"cannot load the stage runner {spec!r}: {exc}") from exc
    return factory()
