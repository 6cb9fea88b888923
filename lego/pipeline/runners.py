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
from typing import Protocol

from lego.data.writer import DatasetWriter
from lego.errors import LegoError
from lego.pipeline.policy import Policy
from lego.records import Outcome, Trajectory
from lego.rollout.requests import RolloutRequest
from lego.tasksets.task import Task

Grader = Callable[[Task, Trajectory], Outcome]


class StageRunner(Protocol):
    def rollout(self, ctx, tasks: Sequence[Task], requests: Sequence[RolloutRequest], policy: Policy, *,
                stage: str, iteration: int, writer: DatasetWriter, gold: bool = False) -> None:
        """Run the requests and persist one trajectory per request with `writer` (stage, iteration). `gold`: the
        policy does not sample; a scripted policy answers with each task's gold solution in the harness's own
        tools (HarnessAdapter.gold_replies), scored by `policy` (the warm start's demonstrations)."""

    def grader(self, ctx) -> contextlib.AbstractContextManager[Grader]:
        """A grading function, valid inside the context."""


class RealRunner:
    """The harness in a Docker sandbox through the proxy (lego.rollout), graded in a fresh sandbox (lego.verify)."""

    def rollout(self, ctx, tasks, requests, policy, *, stage, iteration, writer, gold=False) -> None:
        import asyncio

        from lego.engine import make_engine
        from lego.rollout.batch import run_rollouts

        engine = make_engine(ctx.config, policy.path)
        try:
            asyncio.run(run_rollouts(requests, tasks, ctx.config, ctx.work, engine, writer=writer, stage=stage,
                                     iteration=iteration,
                                     engine_for=gold_engines(ctx.config, engine) if gold else None))
        finally:
            close = getattr(engine, "close", None)
            if close is not None:
                close()

    @contextlib.contextmanager
    def grader(self, ctx) -> Iterator[Grader]:
        from lego.sandbox.daemon import docker_engine
        from lego.sandbox.image import ensure_base_image
        from lego.verify import Verifier

        config = ctx.config
        with docker_engine(ctx.work.docker_root, config.docker.host, config.docker.start_private_daemon) as engine:
            base_image = ensure_base_image(engine.client, config.docker)
            verifier = Verifier(engine.client, base_image, config.sandbox, config.verify)
            yield verifier.verify


def gold_engines(config, scorer):
    """A scripted engine per task that answers with the task's gold patch in the harness's own tools, its tokens
    scored by `scorer` (the policy: real log-probs and routing)."""
    from lego.engine.scripted import ScriptedEngine
    from lego.engine.tokenizer import load_tokenizer
    from lego.harness.base import apply_patch_command, get_harness

    adapter, tokenizer = get_harness(config.harness.name), load_tokenizer()
    return lambda task: ScriptedEngine(scorer, tokenizer, adapter.gold_replies(apply_patch_command(task.patch)))


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
