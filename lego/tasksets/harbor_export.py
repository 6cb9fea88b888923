"""`lego tasks export --harbor DIR`: any task set written as Harbor task directories.

Each task becomes Harbor's layout (harbor.models.task.paths.TaskPaths):

    <instance_id>/
      instruction.md           the problem statement
      task.toml                timeouts; metadata: id, repo, base_commit, and lego_test_patch (see below)
      environment/Dockerfile   the repository at base_commit: only that tree, no history and no tests to come
      environment/repo/        (bundle tasks) that tree, copied in by the Dockerfile
      solution/solve.sh        applies solution/gold.patch (Harbor's oracle agent runs it)
      tests/test.sh            applies tests/test.patch, runs tests/lego_check.py, writes /logs/verifier/reward.txt
      tests/lego_check.py      Lego's verdict rule (below), with tests/lego_spec.json

The hidden tests live only in tests/, which Harbor (and Lego's Harbor grading) copies into the environment at
grading time; the environment image never has them. The verdict is Lego's SWE-bench-format rule: reward 1 when
every FAIL_TO_PASS and PASS_TO_PASS test passes (setup, call and teardown; a skip is not a pass) in one run of the
test files with the task's pytest command, and every FAIL_TO_PASS test passes again alone; else 0. What Harbor
cannot give, Lego's runner (lego/verify/runner/) adds: its results come from a channel the code under test does not
hold, tampering is detected, and a hang or crash is attributed by a control run. In Harbor, an exported task is
graded with Harbor's trust in test.sh (see lego/verify/harbor_grading.py).

`metadata.lego_test_patch` names tests/test.patch, so Lego loading the directory back screens the agent's diff
against the hidden test files as it does for the original task; and with `metadata.exported_by = "lego"` and
tests/lego_spec.json, Lego grades it back by those tests with decoys (lego/verify/grader.py), not by test.sh.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from lego.errors import LegoError, tail
from lego.tasksets.task import Task, harbor_recipe

LEGO_CHECK = r'''"""Lego's verdict for this task (written by `lego tasks export --harbor`): exit 0 when every FAIL_TO_PASS and
PASS_TO_PASS test passes in one run of the test files and every FAIL_TO_PASS test passes again alone."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run_pytest(args):
    """Child mode: run pytest in this process, record each test's phase outcomes, write them as JSON."""
    out = args.pop(0)
    sys.path[0] = os.getcwd()  # as `python3 -m pytest` has it: the repository first, not this directory
    import pytest

    outcomes = {}

    class Recorder:
        def pytest_runtest_logreport(self, report):
            outcomes.setdefault(report.nodeid, {})[report.when] = report.outcome

    code = pytest.main(args, plugins=[Recorder()])
    with open(out, "w") as handle:
        json.dump({"exit": int(code), "tests": outcomes}, handle)
    return 0


def passed(entry):
    return bool(entry) and entry.get("call") == "passed" and all(
        entry.get(when, "passed") == "passed" for when in ("setup", "teardown"))


def main():
    spec = json.load(open(os.path.join(HERE, "lego_spec.json")))
    env = {**os.environ, **spec["env"]}
    scratch = tempfile.mkdtemp(prefix="lego-check-")

    def run(name, targets):
        out = os.path.join(scratch, name + ".json")
        subprocess.run([sys.executable, os.path.abspath(__file__), "--child", out, *spec["pytest_args"], *targets],
                       env=env, check=False)
        try:
            return json.load(open(out))["tests"]
        except (OSError, ValueError, KeyError):
            return {}

    tests = run("full", spec["test_files"])
    failing = [t for t in spec["fail_to_pass"] + spec["pass_to_pass"] if not passed(tests.get(t))]
    for number, test in enumerate(spec["fail_to_pass"]):
        if not passed(run(f"alone-{number}", [test]).get(test)):
            failing.append(test + " (alone)")
    print("lego verdict:", "all graded tests passed" if not failing else "not passing: " + ", ".join(failing[:20]))
    return 0 if not failing else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.exit(run_pytest(sys.argv[2:]))
    sys.exit(main())
'''

TEST_SH = """#!/bin/bash
# Written by `lego tasks export --harbor`: Lego's verdict for {instance_id}, as Harbor's reward.
mkdir -p /logs/verifier
cd {workdir} || {{ echo 0 > /logs/verifier/reward.txt; exit 0; }}
if [ -s /tests/test.patch ]; then
  git apply --whitespace=nowarn /tests/test.patch 2>/dev/null \\
    || patch -p1 --forward --batch < /tests/test.patch \\
    || {{ echo "the test patch does not apply"; echo 0 > /logs/verifier/reward.txt; exit 0; }}
fi
if python3 /tests/lego_check.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""

SOLVE_SH = """#!/bin/bash
# Written by `lego tasks export --harbor`: the task's gold patch.
set -e
cd {workdir}
git apply --whitespace=nowarn /solution/gold.patch 2>/dev/null || patch -p1 --forward --batch < /solution/gold.patch
"""


class HarborExportError(LegoError):
    """A task could not be written as a Harbor task directory."""


class ExportedTask(BaseModel):
    instance_id: str
    path: str


def _toml_value(value: Any) -> str:
    # JSON's strings, numbers, booleans and arrays of them are valid TOML values.
    return json.dumps(value)


def _task_toml(task: Task, verifier_timeout_s: float, agent_timeout_s: float) -> str:
    metadata = {"id": task.instance_id, "repo": task.repo, "base_commit": task.base_commit, "split": task.split,
                "lego_test_patch": "test.patch", "exported_by": "lego"}
    if task.difficulty:
        metadata["difficulty"] = task.difficulty
    lines = ['schema_version = "1.4"', "", "[metadata]"]
    lines += [f"{key} = {_toml_value(value)}" for key, value in metadata.items()]
    lines += ["", "[verifier]", f"timeout_sec = {float(verifier_timeout_s)}", "", "[agent]",
              f"timeout_sec = {float(agent_timeout_s)}", "", "[environment]", "build_timeout_sec = 600.0", ""]
    return "\n".join(lines)


def _check_spec(task: Task) -> dict[str, Any]:
    from lego.tasksets.task import graded_test_files, pytest_command_of

    env, pytest_args = pytest_command_of(task)
    return {"env": env, "pytest_args": pytest_args, "test_files": graded_test_files(task),
            "fail_to_pass": list(task.FAIL_TO_PASS), "pass_to_pass": list(task.PASS_TO_PASS)}


def _write_environment(task: Task, env_dir: Path, base_image: str) -> None:
    env = task.environment
    workdir = env.workdir
    if env.kind == "bundle":
        if not env.bundle or not Path(env.bundle).is_file():
            raise HarborExportError(f"task {task.instance_id}: its git bundle {env.bundle!r} is missing; load the "
                                    "task set with lego.tasksets.load (which resolves it) or restore the bundle")
        with tempfile.TemporaryDirectory(prefix="lego-export-") as scratch:
            clone = Path(scratch) / "clone"
            _run(["git", "clone", "-q", "--no-checkout", env.bundle, str(clone)], task)
            archive = subprocess.run(["git", "-C", str(clone), "archive", task.base_commit], capture_output=True)
            if archive.returncode != 0:
                raise HarborExportError(f"task {task.instance_id}: base_commit {task.base_commit} is not in "
                                        f"{env.bundle}: {tail(archive.stderr.decode(errors='replace'))}")
            (env_dir / "repo").mkdir(parents=True)
            subprocess.run(["tar", "-x", "-C", str(env_dir / "repo")], input=archive.stdout, check=True)
        setup = "".join(f"RUN cd {workdir} && {command}\n" for command in env.setup_commands)
        (env_dir / "Dockerfile").write_text(
            f"# Written by `lego tasks export --harbor`: {task.repo} at {task.base_commit}, that tree only.\n"
            f"FROM {base_image}\nCOPY repo/ {workdir}/\n{setup}WORKDIR {workdir}\n", encoding="utf-8")
    elif env.kind == "image":
        if not env.image:
            raise HarborExportError(f"task {task.instance_id}: environment.kind=image names no image")
        env_dir.mkdir(parents=True)
        setup = "".join(f"RUN cd {workdir} && {command}\n" for command in env.setup_commands)
        (env_dir / "Dockerfile").write_text(
            f"FROM {env.image}\nRUN git -C {workdir} checkout -q {shlex.quote(task.base_commit)}\n{setup}"
            f"WORKDIR {workdir}\n", encoding="utf-8")
    else:
        if not env.dockerfile_dir or not Path(env.dockerfile_dir).is_dir():
            raise HarborExportError(f"task {task.instance_id}: its environment directory {env.dockerfile_dir!r} "
                                    "is missing")
        shutil.copytree(env.dockerfile_dir, env_dir)


def _run(argv: list[str], task: Task) -> None:
    result = subprocess.run(argv, capture_output=True)
    if result.returncode != 0:
        raise HarborExportError(f"task {task.instance_id}: {' '.join(argv[:3])} failed: "
                                f"{tail(result.stderr.decode(errors='replace'))}")


def export_task(task: Task, out_dir: Path, base_image: str, *, verifier_timeout_s: float = 600.0,
                agent_timeout_s: float = 1800.0) -> Path:
    """Write one task as a Harbor task directory under `out_dir`; returns its path. A Harbor task is copied as
    it is. `base_image` is what a bundle task's Dockerfile builds FROM (Lego's base image: python3, pytest, git)."""
    recipe = harbor_recipe(task)
    target = out_dir / task.instance_id
    if target.exists():
        raise HarborExportError(f"{target} already exists; export into an empty directory")
    if recipe is not None:
        shutil.copytree(recipe["task_dir"], target)
        return target
    if not task.FAIL_TO_PASS:
        raise HarborExportError(f"task {task.instance_id} has no FAIL_TO_PASS test: its Harbor verifier would "
                                "reward any patch; give it FAIL_TO_PASS tests or leave it out")
    spec = _check_spec(task)
    try:
        _write_environment(task, target / "environment", base_image)
        (target / "tests").mkdir()
        (target / "solution").mkdir()
        workdir = shlex.quote(task.environment.workdir)
        (target / "instruction.md").write_text(task.problem_statement.rstrip("\n") + "\n", encoding="utf-8")
        (target / "task.toml").write_text(_task_toml(task, verifier_timeout_s, agent_timeout_s), encoding="utf-8")
        (target / "tests" / "test.patch").write_text(task.test_patch, encoding="utf-8")
        (target / "tests" / "lego_spec.json").write_text(json.dumps(spec, indent=1) + "\n", encoding="utf-8")
        (target / "tests" / "lego_check.py").write_text(LEGO_CHECK, encoding="utf-8")
        (target / "tests" / "test.sh").write_text(TEST_SH.format(instance_id=task.instance_id, workdir=workdir),
                                                  encoding="utf-8")
        (target / "solution" / "gold.patch").write_text(task.patch, encoding="utf-8")
        (target / "solution" / "solve.sh").write_text(SOLVE_SH.format(workdir=workdir), encoding="utf-8")
        for script in (target / "tests" / "test.sh", target / "solution" / "solve.sh"):
            script.chmod(0o755)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    return target


def export_harbor(tasks: list[Task], out_dir: Path, base_image: str, **timeouts: float) -> list[ExportedTask]:
    """Write every task as a Harbor task directory in `out_dir` (created); a loadable Harbor dataset."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return [ExportedTask(instance_id=task.instance_id, path=str(export_task(task, out_dir, base_image, **timeouts)))
            for task in tasks]
