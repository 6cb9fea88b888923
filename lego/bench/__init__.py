"""Benchmarks: `lego bench NAME` runs one and prints JSON. Each lives in its own module and registers here.

A benchmark's own knobs are its keyword parameters after (config, work): `lego bench NAME -o KEY=VALUE` sets one
(an int parameter gets an int), so that no benchmark reads an environment variable of its own.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from lego.config import LegoConfig
from lego.errors import LegoError
from lego.workdir import WorkDir


class BenchError(LegoError):
    """A bench process failed or did not answer; the message says which and why."""


Benchmark = Callable[[LegoConfig, WorkDir], dict[str, Any]]
BENCHMARKS: dict[str, Benchmark] = {}
# name -> module that registers it (imported lazily: benchmarks pull heavy dependencies)
MODULES = {
    "sandbox": "lego.bench.sandbox",
    "decoys": "lego.bench.decoys",
    "decoy-sites": "lego.bench.decoy_sites",
    "proxy": "lego.bench.proxy",
    "dataset": "lego.bench.dataset",
    "rollout": "lego.bench.rollout",
    "r3": "lego.bench.r3",
    "learn": "lego.bench.learn",
    "train": "lego.bench.train",
    "engine": "lego.bench.engine",
}


def register(name: str) -> Callable[[Benchmark], Benchmark]:
    def decorate(function: Benchmark) -> Benchmark:
        BENCHMARKS[name] = function
        return function

    return decorate


def run_benchmark(name: str, config: LegoConfig, work: WorkDir, options: dict[str, str] | None = None) -> dict[str, Any]:
    if name not in MODULES:
        raise LegoError(f"unknown benchmark {name!r}; choose one of {', '.join(sorted(MODULES))}")
    try:
        importlib.import_module(MODULES[name])
    except ModuleNotFoundError as exc:
        raise LegoError(f"benchmark {name!r} is not built yet ({exc.name} is missing)") from exc
    function = BENCHMARKS[name]
    return function(config, work, **benchmark_options(name, function, options or {}))


def benchmark_options(name: str, function: Benchmark, options: dict[str, str]) -> dict[str, Any]:
    """`options` (KEY=VALUE strings from the command line) as the benchmark's keyword arguments."""
    parameters = list(inspect.signature(function).parameters.values())[2:]
    known = {parameter.name: parameter for parameter in parameters}
    unknown = sorted(set(options) - set(known))
    if unknown:
        takes = ", ".join(known) or "no options"
        raise LegoError(f"benchmark {name!r} has no option {', '.join(unknown)}; it takes {takes}")
    converted: dict[str, Any] = {}
    for key, raw in options.items():
        if str(known[key].annotation).startswith("int"):
            try:
                converted[key] = int(raw)
            except ValueError:
                raise LegoError(f"benchmark {name!r}: {key}={raw!r} is not a whole number") from None
        else:
            converted[key] = raw
    return converted
