"""Stage artifacts: a directory per (stage, key), complete once its result.json exists."""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field, field_validator

from lego.config import LegoConfig
from lego.pipeline.keys import code_version, key_of
from lego.workdir import WorkDir

RESULT_FILE = "result.json"


class StageResult(BaseModel):
    stage: str
    iteration: int | None = None
    key: str
    path: str  # the artifact directory
    cached: bool = False  # served from an earlier computation (set when loaded, never stored as True)
    inputs: dict[str, Any] = Field(default_factory=dict)  # what the key was computed from
    metrics: dict[str, float] = Field(default_factory=dict)
    outputs: dict[str, str] = Field(default_factory=dict)  # name -> file or directory
    data: dict[str, Any] = Field(default_factory=dict)  # stage-specific values (data run id, policy ...)
    seconds: float = 0.0
    created_at: str = ""
    host: str = ""  # the machine that computed it (a stage placed on a cluster node: that node)

    @field_validator("metrics", mode="before")
    @classmethod
    def _measured_only(cls, metrics: Any) -> Any:
        """A metric a stage could not measure (NaN, which JSON writes as null) is absent rather than a number."""
        if not isinstance(metrics, dict):
            return metrics
        return {name: value for name, value in metrics.items()
                if value is not None and not (isinstance(value, float) and not math.isfinite(value))}

    @property
    def dir(self) -> Path:
        return Path(self.path)

    def label(self) -> str:
        return self.stage if self.iteration is None else f"{self.stage}/{self.iteration}"


@dataclass
class StageOutput:
    """What a stage's computation returns; the wrapper turns it into a StageResult."""

    metrics: dict[str, float] = field(default_factory=dict)
    outputs: dict[str, Path] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    # The stage's wall time when part of it ran before `compute` (the rollout's shards); None: compute's own.
    seconds: float | None = None


class StageProgress(Protocol):
    """How far one long step of a stage is (rollouts stored, rollouts graded), with a count per kind."""

    def advance(self, kind: str) -> None:
        """One more item is done; `kind`: its termination or outcome kind."""

    def update(self, done: int, counts: Mapping[str, int]) -> None:
        """The totals so far (for a watcher that counts what is stored rather than being told)."""

    def finish(self) -> None:
        """The step ended (or failed): report where it stopped."""


class ProgressBoard(Protocol):
    """Where a run shows its stages' progress (lego.pipeline.progress: bars on a terminal, else a periodic line)."""

    def start(self, label: str, total: int, *, done: int = 0, counts: Mapping[str, int] | None = None,
              verb: str = "done") -> StageProgress:
        """A step of `total` items, `done` of them (with `counts` by kind) finished before it started."""


@dataclass
class StageContext:
    config: LegoConfig
    work: WorkDir
    run_id: str
    runner: Any  # a lego.pipeline.runners.StageRunner
    force: bool = False
    log: Callable[[str], None] = print
    # Set by the pipeline run that shows progress; None (a shard in another process, a bare call): none is shown.
    progress: ProgressBoard | None = None


def artifact_dir(work: WorkDir, stage: str, key: str) -> Path:
    return work.artifacts / stage / key


def load_result(work: WorkDir, stage: str, key: str) -> StageResult | None:
    """The complete artifact of (stage, key), or None (missing, or an output was deleted since)."""
    result = _read_result(artifact_dir(work, stage, key) / RESULT_FILE)
    if result is None or not all(Path(p).exists() for p in result.outputs.values()):
        return None
    return result.model_copy(update={"cached": True})


def _read_result(path: Path) -> StageResult | None:
    """The result file at `path`; None when there is none or it is not a complete result (a killed writer's)."""
    if not path.is_file():
        return None
    try:
        return StageResult.model_validate_json(path.read_text())
    except ValueError:
        return None


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temp, "w") as handle:
        handle.write(data if isinstance(data, str) else json.dumps(data, indent=2, default=str))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)


def _moved(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str) and (value == old or value.startswith(old + "/")):
        return new + value[len(old):]
    return value


def _relocated(result: StageResult, directory: Path) -> StageResult:
    """`result` with the paths inside its old artifact directory pointed at `directory`."""
    old, new = result.path, str(directory)
    return result.model_copy(update={
        "path": new, "outputs": {name: _moved(path, old, new) for name, path in result.outputs.items()},
        "data": {name: _moved(value, old, new) for name, value in result.data.items()}})


def share_result(work: WorkDir, result: StageResult, shared: Path) -> Path:
    """Copy a computed artifact, and the data run it stored (its `data_run_id`), into `shared`/<key> (a machine
    cache shared by every work dir and clone), unless it is there already. Complete once renamed into place."""
    target = shared / result.key
    if (target / "artifact" / RESULT_FILE).is_file():
        return target
    temp = shared / f".{result.key}.{os.getpid()}.tmp"
    shutil.rmtree(temp, ignore_errors=True)
    shutil.copytree(result.dir, temp / "artifact")
    data_run = result.data.get("data_run_id")
    if data_run and (work.data / data_run).is_dir():
        shutil.copytree(work.data / data_run, temp / "data" / data_run)
    shutil.rmtree(target, ignore_errors=True)  # an incomplete copy of an earlier, killed process
    os.replace(temp, target)
    return target


def adopt_shared_result(work: WorkDir, stage: str, key: str, shared: Path) -> StageResult | None:
    """The artifact (stage, key) from the machine cache `shared`, copied into this work dir with its paths moved
    (and its data run beside this work dir's); None when the cache has none."""
    source = shared / key
    result = _read_result(source / "artifact" / RESULT_FILE)
    if result is None:
        return None
    directory = artifact_dir(work, stage, key)
    shutil.rmtree(directory, ignore_errors=True)
    shutil.copytree(source / "artifact", directory)
    data_run = result.data.get("data_run_id")
    if data_run and (source / "data" / data_run).is_dir() and not (work.data / data_run).exists():
        shutil.copytree(source / "data" / data_run, work.data / data_run)
    result = _relocated(result, directory)
    write_json_atomic(directory / RESULT_FILE, result.model_dump_json(indent=2))
    return load_result(work, stage, key)


def run_cached(ctx: StageContext, stage: str, iteration: int | None, inputs: dict[str, Any],
               compute: Callable[[Path], StageOutput], shared: Path | None = None) -> StageResult:
    """Serve (stage, key(inputs + config + code)) from its artifact, or compute it into the artifact dir.

    `compute` writes into the final directory (not a temp one) so that a killed computation keeps what it
    finished; the result file, written last, is what makes the artifact count.

    `shared`: a machine cache for this stage (lego.cache.cache_dir): a result missing from the work dir is taken
    from there, and a computed one is put there, so that other work dirs and clones reuse it. Only for a stage
    whose key holds no path of this work dir or clone.
    """
    parts = {"stage": stage, "iteration": iteration, "code": code_version(stage), **inputs}
    key = key_of(parts)
    label = stage if iteration is None else f"{stage}/{iteration}"
    if not ctx.force:
        cached = load_result(ctx.work, stage, key)
        if cached is not None:
            ctx.log(f"{label}: served from cache ({key})")
            return cached
        if shared is not None and (adopted := adopt_shared_result(ctx.work, stage, key, shared)) is not None:
            ctx.log(f"{label}: served from the machine's cache {shared / key}")
            return adopted
    directory = artifact_dir(ctx.work, stage, key)
    (directory / RESULT_FILE).unlink(missing_ok=True)
    directory.mkdir(parents=True, exist_ok=True)
    ctx.log(f"{stage if iteration is None else f'{stage}/{iteration}'}: computing ({key})")
    started = time.monotonic()
    output = compute(directory)
    result = StageResult(
        stage=stage, iteration=iteration, key=key, path=str(directory), inputs=parts,
        metrics={k: float(v) for k, v in output.metrics.items()},
        outputs={name: str(path) for name, path in output.outputs.items()}, data=output.data,
        seconds=round(output.seconds if output.seconds is not None else time.monotonic() - started, 3),
        created_at=datetime.now(UTC).isoformat(), host=socket.gethostname(),
    )
    write_json_atomic(directory / RESULT_FILE, result.model_dump_json(indent=2))
    if shared is not None:
        share_result(ctx.work, result, shared)
    return result
