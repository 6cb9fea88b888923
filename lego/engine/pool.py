"""Engines kept between the stages of one process: the next stage's policy goes into the running engine.

A vLLM worker takes tens of seconds to start on CPU and a tenth of a second to take new weights in place
(docs/benchmarks.md, "vLLM weight update in place"). So the stages that sample (warm start, rollouts, evaluation)
lease their engine here instead of starting one: after train/N, rollout/N+1 gets the engine that sampled rollout/N,
with train/N's checkpoint loaded into it (`Engine.load_checkpoint`, which tags the new policy version).

Only an engine whose class sets `keep_warm = True` stays between leases. Any other engine is closed when it is
handed back, so no second copy of the model stays in memory beside the trainer's. The transformers engine is one:
it loads the tiny policy in well under a second.

An engine is kept only for the engine settings it was made with. It is closed, not kept, when the stage that
leased it raised: it may be mid-request. `close_engines()` ends what is kept (the end of a pipeline run, and at
exit).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from lego.config import LegoConfig
from lego.engine import factory
from lego.engine.base import Engine

log = logging.getLogger(__name__)


def _settings(config: LegoConfig) -> tuple:
    """What an engine is made with, apart from its weights: a kept engine serves only a lease with the same."""
    engine = config.engine
    return (engine.kind, engine.dtype, engine.device, engine.max_batch_size, engine.batch_wait_ms,
            config.model.context_length)


def _close(engine: Engine) -> None:
    close = getattr(engine, "close", None)
    if close is not None:
        close()


class EnginePool:
    """At most one idle engine per engine settings; see the module docstring."""

    def __init__(self) -> None:
        self._idle: dict[tuple, Engine] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def lease(self, config: LegoConfig, model_path: str | Path, policy_version: int,
              report: Callable[[str], None] = log.info) -> Iterator[Engine]:
        """The engine `config.engine` names, serving the checkpoint at `model_path` as `policy_version`: a kept
        engine with those weights loaded in place, else a new one. `report` gets a line saying which."""
        settings = _settings(config)
        with self._lock:
            engine = self._idle.pop(settings, None)
        try:
            if engine is None:
                started = time.monotonic()
                engine = factory.make_engine(config, model_path)
                report(f"started the {config.engine.kind} engine on policy version {engine.policy_version} "
                       f"({time.monotonic() - started:.1f} s)")
            elif (Path(getattr(engine, "model_path", "")) != Path(model_path)
                  or engine.policy_version != policy_version):
                started = time.monotonic()
                engine.load_checkpoint(model_path, policy_version)
                report(f"policy version {policy_version} loaded into the running {config.engine.kind} engine "
                       f"({time.monotonic() - started:.2f} s)")
            else:
                report(f"the running {config.engine.kind} engine already serves policy version {policy_version}")
        except BaseException:
            if engine is not None:
                _close(engine)
            raise
        try:
            yield engine
        except BaseException:
            _close(engine)
            raise
        if getattr(engine, "keep_warm", False):
            with self._lock:
                engine, self._idle[settings] = self._idle.get(settings), engine
        if engine is not None:
            _close(engine)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = list(self._idle.values()), {}
        for engine in idle:
            _close(engine)


ENGINES = EnginePool()
atexit.register(ENGINES.close)


def lease_engine(config: LegoConfig, model_path: str | Path, policy_version: int,
                 report: Callable[[str], None] = log.info):
    """`EnginePool.lease` on this process's pool."""
    return ENGINES.lease(config, model_path, policy_version, report)


def close_engines() -> None:
    """Close the engines this process keeps (the end of a pipeline run)."""
    ENGINES.close()
