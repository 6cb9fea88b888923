"""Build the bundled task set from the sources kept in this package.

    python -m lego.tasksets.build_bundled [--check]

For each repository in bundled/specs/<name>.yaml:
  1. write its history commit by commit from bundled/sources/<name>/ (a commit may hold an earlier
     variant of a file, given as edits of the source file: that is how a bug enters in a commit),
     with a fixed author and dates, so the commit hashes are the same on every build;
  2. write bundled/repos/<name>.bundle (`git bundle create --all`);
  3. for each task: check out its base commit, apply the test edits (-> test_patch), run the suite,
     apply the fix edits (-> patch), run it again; FAIL_TO_PASS are the tests that failed before and
     pass after, PASS_TO_PASS those that pass both times. The build fails if FAIL_TO_PASS differs from
     the spec's `expect_fail`, or if the fix breaks a test that passed.
Then bundled/tasks.jsonl gets one Task per line, and bundled/tasks/<instance_id>/ a folder a person can read
(instruction.md, solution.patch, tests.patch, task.toml: lego/tasksets/folders.py), both from the same Tasks.
`--check` rebuilds in a temp dir and compares both.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from lego.errors import LegoError
from lego.tasksets.folders import check_task_folders, write_task_folders
from lego.tasksets.gitutil import bundle, clone, commit_all, diff, init_repo
from lego.tasksets.task import Task
from lego.tasksets.testrun import FAILED, PASSED, TestRunner, run_tests

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"
SOURCES_DIR = BUNDLED_DIR / "sources"
SPECS_DIR = BUNDLED_DIR / "specs"
TASKS_FILE = BUNDLED_DIR / "tasks.jsonl"
REPOS_SUBDIR = "repos"


class BundledBuildError(LegoError):
    """The bundled task specs are inconsistent with their sources; the message says which task."""


def _indent(text: str, width: int) -> str:
    # YAML block scalars lose their common indentation; `indent: N` puts it back.
    pad = " " * width
    return "".join(pad + line if line.strip() else line for line in text.splitlines(keepends=True))


def apply_edits(text: str, edits: list[dict[str, str]], where: str) -> str:
    """Apply `{old, new}` replacements (each `old` must occur exactly once) and `{append}` edits."""
    for number, edit in enumerate(edits, 1):
        if "append" in edit:
            text += _indent(edit["append"], edit.get("indent", 0))
            continue
        old, new = _indent(edit["old"], edit.get("indent", 0)), _indent(edit["new"], edit.get("indent", 0))
        count = text.count(old)
        if count != 1:
            raise BundledBuildError(f"{where}: edit {number} expects its 'old' text once, found it {count} times:\n{old}")
        text = text.replace(old, new)
    return text


def _write(repo: Path, rel: str, text: str) -> None:
    path = repo / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def build_history(name: str, spec: dict[str, Any], repo: Path) -> list[str]:
    """Write and commit the repository's history; return the commit hashes in order."""
    source = SOURCES_DIR / name
    init_repo(repo)
    commits = []
    for index, step in enumerate(spec["history"], 1):
        variants = step.get("variants", {})
        unknown = set(variants) - set(step["files"])
        if unknown:
            raise BundledBuildError(f"{name} commit {index}: variants for files it does not write: {sorted(unknown)}")
        for rel in step["files"]:
            text = (source / rel).read_text()
            if rel in variants:
                text = apply_edits(text, variants[rel], f"{name} commit {index} {rel}")
            _write(repo, rel, text)
        commits.append(commit_all(repo, step["message"], step["date"]))
    return commits


def _edit_files(repo: Path, edits: dict[str, list[dict[str, str]]], where: str) -> list[str]:
    for rel, file_edits in edits.items():
        path = repo / rel
        text = path.read_text() if path.exists() else ""
        _write(repo, rel, apply_edits(text, file_edits, f"{where} {rel}"))
    return sorted(edits)


def build_task(name: str, spec: dict[str, Any], task_spec: dict[str, Any], bundle_path: Path,
               commits: list[str], work: Path, runner: TestRunner = run_tests) -> Task:
    task_id = f"{name}-{task_spec['id']}"
    base_index = task_spec.get("base", len(commits))
    base_commit = commits[base_index - 1]
    checkout = clone(bundle_path, work / task_id, base_commit)

    test_files = _edit_files(checkout, task_spec["tests"], f"{task_id} tests")
    test_patch = diff(checkout, test_files)
    before = runner(checkout)
    fix_files = _edit_files(checkout, task_spec["fix"], f"{task_id} fix")
    patch = diff(checkout, fix_files)
    after = runner(checkout)

    fail_to_pass = sorted(t for t, s in after.items() if s == PASSED and before.get(t) != PASSED)
    pass_to_pass = sorted(t for t, s in after.items() if s == PASSED and before.get(t) == PASSED)
    broken = sorted(t for t, s in before.items() if s == PASSED and after.get(t) != PASSED)
    still_failing = sorted(t for t, s in after.items() if s in (FAILED, "ERROR"))
    expected = sorted(task_spec["expect_fail"])
    if broken or still_failing or fail_to_pass != expected:
        raise BundledBuildError(
            f"{task_id}: FAIL_TO_PASS {fail_to_pass} != expect_fail {expected}; "
            f"broken by the fix: {broken}; failing after the fix: {still_failing}"
        )
    step = spec["history"][base_index - 1]
    return Task(
        instance_id=f"lego-bundled__{task_id}",
        repo=spec["repo"],
        base_commit=base_commit,
        problem_statement=task_spec["problem_statement"].strip() + "\n",
        patch=patch,
        test_patch=test_patch,
        FAIL_TO_PASS=fail_to_pass,
        PASS_TO_PASS=pass_to_pass,
        version=str(spec.get("version", "0")),
        environment_setup_commit=base_commit,
        created_at=step["date"],
        split=task_spec["split"],
        difficulty=task_spec["difficulty"],
        environment={"kind": "bundle", "bundle": f"{REPOS_SUBDIR}/{name}.bundle", "workdir": "/repo"},
        provenance={"source": "bundled", "repo_name": name, "base_commit_message": step["message"],
                    "fixed_files": fix_files, "test_files": test_files},
    )


def load_specs() -> dict[str, dict[str, Any]]:
    return {path.stem: yaml.safe_load(path.read_text()) for path in sorted(SPECS_DIR.glob("*.yaml"))}


def build(out_dir: Path = BUNDLED_DIR, runner: TestRunner = run_tests) -> list[Task]:
    tasks: list[Task] = []
    with tempfile.TemporaryDirectory(prefix="lego-bundled-") as tmp:
        work = Path(tmp)
        for name, spec in load_specs().items():
            commits = build_history(name, spec, work / "src" / name)
            bundle_path = bundle(work / "src" / name, out_dir / REPOS_SUBDIR / f"{name}.bundle")
            for task_spec in spec["tasks"]:
                tasks.append(build_task(name, spec, task_spec, bundle_path, commits, work / "tasks", runner))
                print(f"built {tasks[-1].instance_id}: {len(tasks[-1].FAIL_TO_PASS)} F2P, "
                      f"{len(tasks[-1].PASS_TO_PASS)} P2P", file=sys.stderr)
    lines = [json.dumps(task.model_dump(mode="json", exclude_none=True), sort_keys=True) for task in tasks]
    (out_dir / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    write_task_folders(tasks, out_dir)
    return tasks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="rebuild in a temp dir; fail if tasks.jsonl or the task folders would change")
    args = parser.parse_args(argv)
    if not args.check:
        build()
        return 0
    with tempfile.TemporaryDirectory(prefix="lego-bundled-check-") as tmp:
        tasks = build(Path(tmp))
        same = (Path(tmp) / "tasks.jsonl").read_text() == TASKS_FILE.read_text()
    stale_folders = check_task_folders(tasks, BUNDLED_DIR)
    print("tasks.jsonl is up to date" if same else "tasks.jsonl is stale: rerun the build", file=sys.stderr)
    for problem in stale_folders:
        print(f"stale task folder: {problem}", file=sys.stderr)
    return 0 if same and not stale_folders else 1


if __name__ == "__main__":
    sys.exit(main())
