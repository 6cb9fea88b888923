"""Content keys: what a stage's result depends on, hashed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from lego import REPO_ROOT
from lego.cache import content_hash

LEGO_DIR = REPO_ROOT / "lego"
SQL_DIR = REPO_ROOT / "sql"
SOURCE_SUFFIXES = (".py", ".sql", ".jinja", ".yaml")

# The source each stage runs: a change there invalidates the stage's cached artifacts (and what follows).
STAGE_SOURCES: dict[str, tuple[str, ...]] = {
    "tasks": ("lego/tasksets/load.py", "lego/tasksets/task.py", "lego/pipeline/taskset_stage.py"),
    "filter": ("lego/rollout.py", "lego/harness", "lego/proxy", "lego/engine", "lego/sandbox", "lego/verify",
               "sql/difficulty.sql", "lego/pipeline/filter_stage.py", "lego/pipeline/attempts.py"),
    "rollout": ("lego/rollout.py", "lego/harness", "lego/proxy", "lego/engine", "lego/sandbox",
                "lego/pipeline/rollout_stage.py", "lego/pipeline/attempts.py"),
    "verify": ("lego/verify", "lego/sandbox", "lego/pipeline/verify_stage.py", "lego/pipeline/attempts.py"),
    "dataset": ("lego/data", "sql", "lego/pipeline/dataset_stage.py"),
    "train": ("lego/train", "lego/engine/checkpoint.py", "lego/pipeline/train_stage.py"),
    "evaluate": ("lego/rollout.py", "lego/harness", "lego/proxy", "lego/engine", "lego/sandbox", "lego/verify",
                 "lego/evaluate", "lego/pipeline/evaluate_stage.py", "lego/pipeline/attempts.py"),
}

_code_cache: dict[str, str] = {}


def _source_files(relative: str) -> list[Path]:
    path = REPO_ROOT / relative
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SOURCE_SUFFIXES
                      and "__pycache__" not in p.parts)
    return []


def code_version(stage: str, extra: tuple[str, ...] = ()) -> str:
    """A hash of the source files of a stage (names and bytes). Computed once per process."""
    cache_key = stage + "|" + "|".join(extra)
    if cache_key not in _code_cache:
        digest = hashlib.sha256()
        for relative in (*STAGE_SOURCES[stage], *extra):
            for path in _source_files(relative):
                digest.update(str(path.relative_to(REPO_ROOT)).encode())
                digest.update(hashlib.sha256(path.read_bytes()).digest())
        _code_cache[cache_key] = digest.hexdigest()[:16]
    return _code_cache[cache_key]


def key_of(parts: dict[str, Any]) -> str:
    return content_hash(json.dumps(parts, sort_keys=True, default=str), length=20)


def checkpoint_key(path: Path, full_hash_limit_bytes: int = 512 * 1024 * 1024) -> str:
    """Identify a policy checkpoint by content: small checkpoints are hashed whole; big ones by their config,
    marker and weight-file names, sizes and modification times (hashing hundreds of GB per run is not an option)."""
    path = Path(path)
    files = sorted(p for p in path.rglob("*") if p.is_file())
    total = sum(p.stat().st_size for p in files)
    digest = hashlib.sha256()
    for file in files:
        digest.update(str(file.relative_to(path)).encode())
        if total <= full_hash_limit_bytes or file.suffix in (".json", ".jinja", ".txt"):
            with open(file, "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
        else:
            stat = file.stat()
            digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:20]
