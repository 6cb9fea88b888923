"""Benchmarks: `lego bench NAME` runs one and prints JSON. Each lives in its own module and registers here."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from lego.config import LegoConfig
from lego.errors import LegoError
from lego.workdir import WorkDir

Benchmark = Callable[[LegoConfig, WorkDir], dict[str, Any]]
BENCHMARKS: dict[str, Benchmark] = {}
# name -> module that registers it (imported lazily: benchmarks pull heavy dependencies)
MODULES = {
    "sandbox": "lego.bench.sandbox",
    "decoys": "lego.bench.decoys",
    "proxy": "lego.bench.proxy",
    "dataset": "lego.bench.dataset",
    "rollout": "lego.bench.rollout",
    "r3": "lego.bench.r3",
    "learn": "lego.bench.learn",
    "train": "lego.bench.train",
}


def register(name: str) -> Callable[[Benchmark], Benchmark]:
    def decorate(function: Benchmark) -> Benchmark:
        BENCHMARKS[name] = function
        return function

    return decorate


def run_benchmark(name: str, config: LegoConfig, work: WorkDir) -> dict[str, Any]:
    if name not in MODULES:
        raise LegoError(f"unknown benchmark {name!r}; choose one of {', '.join(sorted(MODULES))}")
    try:
        importlib.import_module(MODULES[name])
    except ModuleNotFoundError as exc:
        raise LegoError(f"benchmark {name!r} is not built yet ({exc.name} is missing)") from exc
    return BENCHMARKS[name](config, work)
