"""What runs a rollout and what grades one: the real harness-in-sandbox stack, or an injected stand-in.

The pipeline wiring only needs two capabilities: persist trajectories for a list of rollout requests
(lego.pipeline.attempts.RolloutRunner), and grade one trajectory (lego.pipeline.grading.GradingRunner).
`load_runner(None)` gives the real ones (lego.rollout + lego.verify on the local Docker engine);
`load_runner("package.module:Name")` instantiates another implementation (tests use this to exercise the wiring
in seconds beside the end-to-end test of the real stages).

Each real capability lives beside the step that calls it, and the stages import those steps, never this module:
a stage's cache key covers what it imports (lego.pipeline.keys), so grading keys the verifier and not the rollout
stack.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Sequence
from typing import Protocol

from lego.data.writer import DatasetWriter
from lego.errors import LegoError
from lego.pipeline.artifacts import StageContext
from lego.pipeline.attempts import RolloutRunner, harness_rollouts
from lego.pipeline.grading import Grader, GradingRunner, verifier_grader
from lego.pipeline.policy import Policy
from lego.rollout.requests import RolloutRequest
from lego.tasksets.task import Task


class StageRunner(RolloutRunner, GradingRunner, Protocol):
    """Both capabilities: what a StageContext's `runner` is."""


class RealRunner:
    """The harness in a Docker sandbox through the proxy (lego.rollout), graded in a fresh sandbox (lego.verify)."""

    def rollout(self, ctx: StageContext, tasks: Sequence[Task], requests: Sequence[RolloutRequest], policy: Policy,
                *, stage: str, iteration: int, writer: DatasetWriter, gold: bool = False) -> None:
        harness_rollouts(ctx, tasks, requests, policy, stage=stage, iteration=iteration, writer=writer, gold=gold)

    def grader(self, ctx: StageContext) -> contextlib.AbstractContextManager[Grader]:
        return verifier_grader(ctx)


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
