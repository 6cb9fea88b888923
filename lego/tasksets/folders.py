"""Task folders: a task set written out so that a person can read each task, in the spirit of Harbor's.

    <task set>/tasks/<instance_id>/
        instruction.md    the problem statement, as the agent sees it
        solution.patch    the gold patch (what resolves the task)
        tests.patch       the test patch (hidden from the agent; FAIL_TO_PASS and PASS_TO_PASS run with it)
        task.toml         everything else: metadata, the test command and lists, the environment, provenance

The folders are a view, generated from the same Task rows as the task set's tasks.jsonl (which is what the
loaders read); `check_task_folders` says where the folders on disk differ from what those rows give.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from lego.tasksets.task import Task

FOLDERS_SUBDIR = "tasks"
# Where the folder sits, relative to the task set's directory: a relative bundle path gets this many "..".
_DEPTH = 2
# The fields that get a file of their own, and the ones grouped under [tests] and [metadata] (in this order;
# any other top-level field follows them in [metadata]).
FILES = {"instruction.md": "problem_statement", "solution.patch": "patch", "tests.patch": "test_patch"}
_TESTS = {"command": "test_command", "FAIL_TO_PASS": "FAIL_TO_PASS", "PASS_TO_PASS": "PASS_TO_PASS"}
_METADATA_FIRST = ("instance_id", "repo", "split", "difficulty", "version", "created_at", "base_commit",
                   "environment_setup_commit")
_TABLES = ("environment", "provenance")


class TaskFolderError(ValueError):
    """A task holds a value that task.toml cannot show (the message names the field)."""


def _toml_value(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, str):
        # A JSON string is a TOML basic string, except that TOML also wants DEL escaped.
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        items = [_toml_value(item, where) for item in value]
        if not items:
            return "[]"
        return "[\n" + "".join(f"    {item},\n" for item in items) + "]"
    raise TaskFolderError(f"{where}: a {type(value).__name__} cannot be written to task.toml; keep task fields to "
                          "strings, numbers, booleans, lists of those, and tables")


def _toml_key(key: str) -> str:
    return key if key and all(c.isalnum() or c in "_-" for c in key) else json.dumps(key)


def _toml_table(name: str, table: dict[str, Any], ordered: bool = False) -> str:
    """A TOML table; its keys sorted unless `ordered` (the same task gives the same text, whatever dict order)."""
    lines = [f"[{name}]"]
    nested = []
    for key, value in table.items() if ordered else sorted(table.items()):
        if isinstance(value, dict):
            nested.append(_toml_table(f"{name}.{_toml_key(key)}", value))
        else:
            lines.append(f"{_toml_key(key)} = {_toml_value(value, f'{name}.{key}')}")
    return "\n".join(lines) + "\n" + "".join("\n" + table for table in nested)


def task_folder(task: Task) -> dict[str, str]:
    """The files of one task's folder, name -> text.

    `task` is a row as the task set's file holds it: a relative bundle path there is relative to the task set's
    directory, and here it is rewritten relative to the folder (so it names the same file).
    """
    row = task.model_dump(mode="json", exclude_none=True)
    files = {name: row.pop(field) for name, field in FILES.items()}
    tests = {key: row.pop(field) for key, field in _TESTS.items()}
    tables = {name: row.pop(name) for name in _TABLES if name in row}
    environment = tables.get("environment", {})
    for key in ("bundle", "dockerfile_dir"):
        if environment.get(key) and not Path(environment[key]).is_absolute():
            environment[key] = "../" * _DEPTH + environment[key]
    metadata = {key: row.pop(key) for key in _METADATA_FIRST if key in row} | dict(sorted(row.items()))
    header = (f"# {task.instance_id}: generated from the task set's tasks.jsonl; do not edit (see ../../README.md).\n"
              "# The problem statement is instruction.md, the gold patch solution.patch, the test patch tests.patch.\n"
              "# Paths are relative to this folder.\n\n")
    sections = [_toml_table("metadata", metadata, ordered=True), _toml_table("tests", tests, ordered=True),
                *(_toml_table(name, table) for name, table in tables.items())]
    toml = header + "\n".join(sections)
    return {**files, "task.toml": toml}


def task_folders(tasks: list[Task]) -> dict[str, str]:
    """Every task's folder: path relative to the task set's directory -> text."""
    return {f"{FOLDERS_SUBDIR}/{task.instance_id}/{name}": text
            for task in tasks for name, text in task_folder(task).items()}


def write_task_folders(tasks: list[Task], set_dir: Path) -> Path:
    """Write the folders under `set_dir`/tasks, replacing what was there (a removed task loses its folder)."""
    root = set_dir / FOLDERS_SUBDIR
    if root.exists():
        shutil.rmtree(root)
    for rel, text in task_folders(tasks).items():
        path = set_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def check_task_folders(tasks: list[Task], set_dir: Path) -> list[str]:
    """What differs between the folders under `set_dir` and those `tasks` give (empty when they match)."""
    root = set_dir / FOLDERS_SUBDIR
    expected = task_folders(tasks)
    found = {path.relative_to(set_dir).as_posix(): path for path in root.rglob("*") if path.is_file()} \
        if root.is_dir() else {}
    problems = [f"{rel}: missing" for rel in sorted(set(expected) - set(found))]
    problems += [f"{rel}: not generated from any task" for rel in sorted(set(found) - set(expected))]
    problems += [f"{rel}: differs from the task's row" for rel in sorted(set(expected) & set(found))
                 if found[rel].read_text(encoding="utf-8") != expected[rel]]
    return problems
