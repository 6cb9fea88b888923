"""Run manifests: <work>/runs/<run_id>/manifest.json lists the stage results (keys, paths) a run used.

`lego stage NAME --from RUN` reads it to find the upstream artifacts; a resumed run continues it.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from lego.errors import LegoError
from lego.pipeline.artifacts import StageResult, write_json_atomic
from lego.workdir import WorkDir


class RunNotFoundError(LegoError):
    """No manifest for the run id."""


class RunManifest(BaseModel):
    run_id: str
    created_at: str
    status: str = "running"  # running | completed | failed
    config: dict[str, Any] = Field(default_factory=dict)
    stage_impl: str | None = None
    mlflow_run_id: str | None = None
    from_run: str | None = None
    stages: dict[str, StageResult] = Field(default_factory=dict)  # "taskset", "rollout/0", ...
    summary: dict[str, Any] = Field(default_factory=dict)

    def record(self, result: StageResult) -> None:
        self.stages[result.label()] = result

    def get(self, stage: str, iteration: int | None = None) -> StageResult | None:
        return self.stages.get(stage if iteration is None else f"{stage}/{iteration}")


def runs_dir(work: WorkDir) -> Path:
    return work.root / "runs"


def manifest_path(work: WorkDir, run_id: str) -> Path:
    return runs_dir(work) / run_id / "manifest.json"


def new_run_id() -> str:
    return f"run-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def save_manifest(work: WorkDir, manifest: RunManifest) -> Path:
    path = manifest_path(work, manifest.run_id)
    write_json_atomic(path, manifest.model_dump_json(indent=2))
    return path


def load_manifest(work: WorkDir, run_id: str) -> RunManifest:
    if run_id == "latest":
        run_id = latest_run_id(work)
    path = manifest_path(work, run_id)
    if not path.is_file():
        known = ", ".join(sorted(p.name for p in runs_dir(work).glob("*") if p.is_dir())[-5:]) or "none yet"
        raise RunNotFoundError(f"no run {run_id!r} in {runs_dir(work)} (recent runs: {known}); "
                               "run `lego run` first or pass one of those ids")
    return RunManifest.model_validate_json(path.read_text())


def latest_run_id(work: WorkDir) -> str:
    manifests = sorted(runs_dir(work).glob("*/manifest.json"), key=lambda p: p.stat().st_mtime)
    if not manifests:
        raise RunNotFoundError(f"no run recorded under {runs_dir(work)}; run `lego run` first")
    return manifests[-1].parent.name
