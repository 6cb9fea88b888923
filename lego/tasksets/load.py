"""Loading task sets: the bundled set, JSONL, Parquet, `datasets` (on disk or hub), Harbor task dirs.

Every source becomes rows (dicts) that are validated one by one into `Task`s. A malformed row is
reported with its row number, the field and pydantic's reason, and the other rows still load; with
`strict=True` any malformed row raises a `TaskSetError` that lists them all.

A row without a FAIL_TO_PASS test is malformed: nothing would grade it (zero tests count as a full pass, so an
empty patch resolves it). Harbor task directories carry no FAIL_TO_PASS lists: they are graded by running their
tests/test.sh and reading the reward it writes (lego/verify/harbor_grading.py), a recipe kept in provenance["harbor"].
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import socket
import tomllib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pydantic import ValidationError

from lego.tasksets.environment import load_environments_file, with_requirements
from lego.tasksets.task import NO_FAIL_TO_PASS_WHY, NoFailToPass, Task, TaskSetError

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"
BUNDLED_TASKS = BUNDLED_DIR / "tasks.jsonl"
HARBOR_REWARD_FILE = "/logs/verifier/reward.txt"
_MAX_LISTED_ERRORS = 20
# Environment fields that name a file or directory of the task set.
_ENVIRONMENT_PATHS = ("bundle", "dockerfile_dir")


@dataclass(frozen=True)
class RowError:
    row: int  # 1-based: the line of a JSONL file, the row of a table, the n-th Harbor task dir
    field: str
    reason: str

    def __str__(self) -> str:
        return f"row {self.row}: {self.field}: {self.reason}"


@dataclass
class TaskLoad:
    tasks: list[Task]
    errors: list[RowError] = field(default_factory=list)
    source: str = ""

    def __len__(self) -> int:
        return len(self.tasks)


def swebench_image(instance_id: str) -> str:
    """The public SWE-bench evaluation image name for an instance (the harness's naming rule)."""
    return f"swebench/sweb.eval.x86_64.{instance_id.lower().replace('__', '_1776_')}:latest"


# ---------------------------------------------------------------- row sources


def _jsonl_rows(path: Path) -> Iterator[tuple[int, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        yield from enumerate(json.loads(text), 1)
        return
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            yield number, RowError(number, "<row>", f"not valid JSON: {exc}")


def _parquet_rows(path: Path) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for a bad file
        raise TaskSetError(f"cannot read Parquet file {path}: {exc}") from exc
    yield from enumerate(table.to_pylist(), 1)


def _is_saved_dataset(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def _dataset_rows(dataset: Any, split: str | None) -> Iterator[tuple[int, Any]]:
    """Rows of a Dataset, or of a DatasetDict (each row tagged with its split unless it has one)."""
    if isinstance(dataset, dict):  # DatasetDict (a dict of split name -> Dataset)
        names = [split] if split in dataset else list(dataset.keys())
        number = 0
        for name in names:
            for row in dataset[name]:
                number += 1
                yield number, {"split": name, **row} if "split" not in row or row["split"] is None else row
        return
    yield from enumerate(dataset, 1)


def _hub_rows(name: str, split: str | None) -> Iterator[tuple[int, Any]]:
    if os.environ.get("HF_DATASETS_OFFLINE", "").lower() in ("1", "true", "yes", "on") or \
            os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise TaskSetError(
            f"task source {name!r} is neither 'bundled' nor an existing file or directory, and it cannot be "
            "fetched from the Hugging Face hub because HF_DATASETS_OFFLINE/HF_HUB_OFFLINE is set. Download it "
            "where the hub is reachable (datasets.load_dataset(...).save_to_disk(DIR), or export JSONL/Parquet) "
            "and set tasks.source to that path."
        )
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    host = urlparse(endpoint).hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
    except OSError as exc:
        raise TaskSetError(
            f"task source {name!r} is not a local path, and the Hugging Face hub ({host}) is unreachable from "
            f"here ({exc}). Save the dataset to disk where the hub is reachable and set tasks.source to that "
            "directory or to a JSONL/Parquet file."
        ) from None
    import datasets

    try:
        dataset = datasets.load_dataset(name, split=None if split in (None, "all") else split)
    except Exception as exc:  # datasets raises many types (ConnectionError, FileNotFoundError, ValueError...)
        raise TaskSetError(
            f"could not load {name!r} from the Hugging Face hub: {type(exc).__name__}: {exc}. Check the name "
            "and split, or point tasks.source at a local copy."
        ) from exc
    yield from _dataset_rows(dataset, split)


# ---------------------------------------------------------------- Harbor


def _dockerfile_workdir(dockerfile: Path, default: str = "/app") -> str:
    workdir = default
    for line in dockerfile.read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.strip().split(None, 1)
        if len(parts) == 2 and parts[0].upper() == "WORKDIR":
            value = parts[1].strip().strip('"')
            workdir = value if value.startswith("/") else f"{workdir.rstrip('/')}/{value}"
    return workdir


def _tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def is_harbor_task_dir(path: Path) -> bool:
    return (path / "task.toml").is_file() or (path / "instruction.md").is_file()


def harbor_task_row(task_dir: Path) -> dict[str, Any] | RowError:
    """Map one Harbor task directory onto the Task fields (errors carry row 0: the caller numbers them).

    Harbor grades by running tests/test.sh, which writes a reward to /logs/verifier/reward.txt (or
    reward.json); there are no FAIL_TO_PASS lists, so the grading recipe travels in provenance["harbor"] and
    lego/verify/harbor_grading.py runs it. A task exported by Lego (lego/tasksets/harbor_export.py) names its hidden
    test patch in `metadata.lego_test_patch` (a file in tests/): it becomes the task's test_patch, so the
    grader's cheat screening knows the hidden test files as it does for SWE-bench-format tasks.
    """
    for required in ("instruction.md", "task.toml", "environment/Dockerfile", "tests/test.sh"):
        if not (task_dir / required).is_file():
            return RowError(0, required, f"missing from Harbor task directory {task_dir}")
    try:
        config = tomllib.loads((task_dir / "task.toml").read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        return RowError(0, "task.toml", f"not valid TOML: {exc}")
    metadata = config.get("metadata", {}) or {}
    env_dir = task_dir / "environment"
    solution = task_dir / "solution" / "solve.sh"
    test_patch = ""
    if metadata.get("lego_test_patch"):
        named = (task_dir / "tests" / str(metadata["lego_test_patch"])).resolve()
        if not named.is_file() or not named.is_relative_to((task_dir / "tests").resolve()):
            return RowError(0, "metadata.lego_test_patch", f"{metadata['lego_test_patch']!r} is not a file in "
                            f"{task_dir / 'tests'}; put the test patch there or remove the key from task.toml")
        test_patch = named.read_text(encoding="utf-8")
    row = {
        "instance_id": str(metadata.get("id") or task_dir.name),
        "repo": str(metadata.get("repo") or f"harbor/{task_dir.resolve().parent.name}"),
        # Harbor environments have no commit; the environment's content hash identifies the state.
        "base_commit": f"harbor-env-{_tree_digest(env_dir)[:16]}",
        "problem_statement": (task_dir / "instruction.md").read_text(encoding="utf-8"),
        "difficulty": metadata.get("difficulty"),
        "split": metadata.get("split", "train"),
        "version": str(config.get("version", "0")),
        "environment": {
            "kind": "dockerfile",
            "dockerfile_dir": str(env_dir.resolve()),
            "workdir": _dockerfile_workdir(env_dir / "Dockerfile"),
        },
        "test_command": "bash /tests/test.sh",
        "test_patch": test_patch,
        "provenance": {
            "source": "harbor",
            "harbor": {
                "task_dir": str(task_dir.resolve()),
                "tests_dir": str((task_dir / "tests").resolve()),
                "solution": str(solution.resolve()) if solution.is_file() else None,
                "reward_file": HARBOR_REWARD_FILE,
                "verifier_timeout_s": (config.get("verifier") or {}).get("timeout_sec"),
                "agent_timeout_s": (config.get("agent") or {}).get("timeout_sec"),
                "config": config,
            },
        },
    }
    return _graded_by_its_tests(task_dir, metadata, row) if test_patch else row


def _graded_by_its_tests(task_dir: Path, metadata: dict, row: dict[str, Any]) -> dict[str, Any] | RowError:
    """A directory `lego tasks export --harbor` wrote carries its tests (tests/lego_spec.json) and its gold patch
    (solution/gold.patch): loaded back, it is graded by those tests with decoys (lego/verify/grader.py) instead of by
    test.sh, whose verdict the graded code could forge."""
    spec_file, gold = task_dir / "tests" / "lego_spec.json", task_dir / "solution" / "gold.patch"
    if metadata.get("exported_by") != "lego" or not spec_file.is_file():
        return row
    try:
        spec = json.loads(spec_file.read_text(encoding="utf-8"))
        assignments = [f"{name}={shlex.quote(str(value))}" for name, value in (spec.get("env") or {}).items()]
        command = " ".join([*assignments, "python3 -m pytest", *map(shlex.quote, spec.get("pytest_args") or [])])
        row.update(FAIL_TO_PASS=list(spec["fail_to_pass"]), PASS_TO_PASS=list(spec.get("pass_to_pass") or []),
                   test_command=command, patch=gold.read_text(encoding="utf-8") if gold.is_file() else "")
    except (ValueError, KeyError, TypeError) as exc:
        return RowError(0, "tests/lego_spec.json", f"not the spec `lego tasks export --harbor` writes ({exc}); "
                        "export the task again or remove metadata.exported_by from task.toml")
    row["provenance"]["harbor"]["graded_by"] = "lego"
    return row


def _harbor_rows(root: Path) -> Iterator[tuple[int, Any]]:
    task_dirs = [root] if is_harbor_task_dir(root) else sorted(
        path for path in root.iterdir() if path.is_dir() and is_harbor_task_dir(path)
    )
    for number, task_dir in enumerate(task_dirs, 1):
        row = harbor_task_row(task_dir)
        yield number, RowError(number, row.field, row.reason) if isinstance(row, RowError) else row


# ---------------------------------------------------------------- validation


def _error_field(loc: tuple) -> str:
    return ".".join(str(part) for part in loc) or "<row>"


def _resolve_paths(row: dict[str, Any], base_dir: Path | None) -> dict[str, Any]:
    """Rows without an environment are SWE-bench rows (prebuilt image); relative bundle and Dockerfile paths
    are resolved against the task set's directory, so a loaded Task is self-contained: it works from any
    working directory, and after the pipeline writes it to JSONL elsewhere and reads it back."""
    env = row.get("environment")
    if env is None and "instance_id" in row:
        return {**row, "environment": {"kind": "image", "image": swebench_image(str(row["instance_id"])),
                                       "workdir": "/testbed"}}
    if isinstance(env, str):
        try:
            env = json.loads(env)  # Parquet/datasets exports may carry it as a JSON string
        except json.JSONDecodeError:
            return row
        row = {**row, "environment": env}
    if isinstance(env, dict) and base_dir is not None:
        for key in _ENVIRONMENT_PATHS:
            value = env.get(key)
            # Left relative when missing here: building the image then refuses it, naming it as the set gave it.
            if isinstance(value, str) and value and not Path(value).is_absolute() and (base_dir / value).exists():
                row = {**row, "environment": {**row["environment"], key: str((base_dir / value).resolve())}}
    if isinstance(row.get("provenance"), str):
        try:
            row = {**row, "provenance": json.loads(row["provenance"])}
        except json.JSONDecodeError:
            pass
    return row


def _relative_paths(task: Task, number: int, where: str | None) -> list[RowError]:
    """Relative environment paths of a source without a directory (a hub dataset): nothing to resolve them by."""
    env = task.environment
    return [RowError(number, f"environment.{key}",
                     f"path {value!r} is relative, and {where or 'this source'} has no directory to resolve it "
                     "against; give an absolute path, or load the task set from a local file or directory")
            for key in _ENVIRONMENT_PATHS if (value := getattr(env, key)) and not Path(value).is_absolute()]


def _no_fail_to_pass(row: dict[str, Any], where: str | None) -> str:
    """Why a row without a FAIL_TO_PASS test is refused, and what to do (no square brackets: rich markup)."""
    name = row.get("instance_id") or "?"
    provenance = row.get("provenance") if isinstance(row.get("provenance"), dict) else {}
    if provenance.get("source") == "harbor":
        task_dir = (provenance.get("harbor") or {}).get("task_dir") or where
        return (f"Harbor task {name!r} ({task_dir}) is refused: its grading recipe names no tests directory "
                f"(provenance.harbor.tests_dir) and it has no FAIL_TO_PASS test, so {NO_FAIL_TO_PASS_WHY}. Load it "
                "from its Harbor task directory (which has tests/test.sh), or leave it out of the task set")
    return (f"task {name!r}" + (f" in {where}" if where else "") + f" has no FAIL_TO_PASS test: "
            f"{NO_FAIL_TO_PASS_WHY}. List the tests that fail at base_commit and pass with the gold patch in "
            "FAIL_TO_PASS, or remove the row")


def validate_rows(rows: Iterable[tuple[int, Any]], base_dir: Path | None = None,
                  where: str | None = None) -> TaskLoad:
    """Validate rows into Tasks; `where` (the file or directory) is named in the errors that need it."""
    tasks: list[Task] = []
    errors: list[RowError] = []
    seen: dict[str, int] = {}
    environments = load_environments_file(base_dir)  # the task set's specs by repo and version
    for number, row in rows:
        if isinstance(row, RowError):
            errors.append(row)
            continue
        if not isinstance(row, dict):
            errors.append(RowError(number, "<row>", f"expected an object, got {type(row).__name__}"))
            continue
        try:
            task = Task.model_validate(row := with_requirements(_resolve_paths(row, base_dir), environments))
        except ValidationError as exc:
            errors.extend(
                RowError(number, "FAIL_TO_PASS", _no_fail_to_pass(row, where))
                if isinstance((err.get("ctx") or {}).get("error"), NoFailToPass)
                else RowError(number, _error_field(err["loc"]), err["msg"])
                for err in exc.errors())
            continue
        if base_dir is None and (relative := _relative_paths(task, number, where)):
            errors.extend(relative)
            continue
        if task.instance_id in seen:
            errors.append(RowError(number, "instance_id", f"duplicate of row {seen[task.instance_id]}"))
            continue
        seen[task.instance_id] = number
        tasks.append(task)
    return TaskLoad(tasks, errors)


# ---------------------------------------------------------------- entry point


def _rows_for(source: str, split: str | None) -> tuple[Iterator[tuple[int, Any]], Path | None, str]:
    """The rows of a source, the directory relative paths are resolved against, and what to call it."""
    if source == "bundled":
        return _jsonl_rows(BUNDLED_TASKS), BUNDLED_DIR, str(BUNDLED_TASKS)
    if source.startswith("family:"):
        from lego.tasksets.family import family_dir, parse_family_source  # it imports this module

        family = parse_family_source(source)
        out = family_dir(family.name, family.seed, family.train, family.held_out)
        return _jsonl_rows(out / "tasks.jsonl"), out, source
    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix in (".jsonl", ".json", ".ndjson"):
            return _jsonl_rows(path), path.parent, str(path)
        if path.suffix == ".parquet":
            return _parquet_rows(path), path.parent, str(path)
        raise TaskSetError(f"task file {path} has an unknown type; use .jsonl, .json or .parquet")
    if path.is_dir():
        if _is_saved_dataset(path):
            import datasets

            return _dataset_rows(datasets.load_from_disk(str(path)), split), path, str(path)
        if is_harbor_task_dir(path) or any(is_harbor_task_dir(p) for p in path.iterdir() if p.is_dir()):
            return _harbor_rows(path), path, str(path)
        for name in ("tasks.jsonl", "tasks.parquet"):
            if (path / name).is_file():
                return _rows_for(str(path / name), split)
        raise TaskSetError(
            f"directory {path} holds no task set: expected a datasets save_to_disk directory, Harbor task "
            "directories (instruction.md, task.toml, environment/Dockerfile, tests/), or tasks.jsonl"
        )
    if path.suffix in (".jsonl", ".json", ".parquet") or source.startswith((".", "/", "~")):
        raise TaskSetError(f"task file {source} does not exist")
    return _hub_rows(source, split), None, f"hub dataset {source}"


def load_tasks(source: str | Path = "bundled", split: str | None = None, strict: bool = False,
               limit: int | None = None) -> TaskLoad:
    """Load and validate a task set.

    source: "bundled", a generated task family (`family:constants[:SEED[:TRAIN+HELD_OUT]]`, lego/tasksets/family.py), a
    .jsonl/.json/.parquet file, a `datasets` save_to_disk directory, a Harbor task
    directory (or a directory of them), or a Hugging Face hub dataset name.
    split: keep only tasks of this split ("train", "eval", ...); None or "all" keeps every task.
    strict: raise TaskSetError listing every malformed row instead of skipping them.
    """
    source = str(source)
    rows, base_dir, where = _rows_for(source, split)
    loaded = validate_rows(rows, base_dir, where)
    loaded.source = source
    if strict and loaded.errors:
        listed = "\n".join(f"  {error}" for error in loaded.errors[:_MAX_LISTED_ERRORS])
        more = len(loaded.errors) - _MAX_LISTED_ERRORS
        raise TaskSetError(
            f"{len(loaded.errors)} malformed row(s) in task set {source}:\n{listed}"
            + (f"\n  ... and {more} more" if more > 0 else "")
            + "\nFix these rows, or load with strict=False (tasks.strict=false) to skip them."
        )
    if split not in (None, "all"):
        loaded.tasks = [task for task in loaded.tasks if task.split == split]
    if limit is not None:
        loaded.tasks = loaded.tasks[:limit]
    return loaded


def load_configured(config: Any, split: str | None = None) -> TaskLoad:
    """Load the task set a `TaskSetConfig` describes (split defaults to the config's)."""
    return load_tasks(config.source, split or config.split, config.strict, config.limit)
