"""Harbor tasks graded as Harbor grades them (tests/test.sh, a reward file), and task sets exported to Harbor.

Real parts: a Harbor task directory built here on the base image, the real Docker engine, Lego's loader and
verifier. The reward channel is attacked from test.sh itself (which runs as the graded code's user).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from lego.records import OutcomeKind
from lego.tasksets.load import load_tasks
from lego.tasksets.task import Task
from lego.verify.grader import Verifier

PASSING_TESTS = """cd /app
if python3 -m pytest -q -p no:cacheprovider /tests/test_outputs.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""


def _write_task(root: Path, base_image: str, test_sh: str = PASSING_TESTS, timeout_s: float = 120.0) -> Path:
    task = root / "add-numbers"
    (task / "environment" / "app" / "tests").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "instruction.md").write_text("`add` in /app/calc.py subtracts; make it add.\n")
    (task / "task.toml").write_text(f'schema_version = "1.4"\n\n[metadata]\nid = "add-numbers"\n\n[verifier]\n'
                                    f"timeout_sec = {timeout_s}\n\n[agent]\ntimeout_sec = 600.0\n")
    (task / "environment" / "Dockerfile").write_text(f"FROM {base_image}\nCOPY app/ /app/\nWORKDIR /app\n")
    (task / "environment" / "app" / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (task / "environment" / "app" / "tests" / "test_smoke.py").write_text("def test_smoke():\n    assert True\n")
    (task / "tests" / "test.sh").write_text("#!/bin/bash\n" + test_sh)
    (task / "tests" / "test_outputs.py").write_text("from calc import add\n\n\ndef test_add():\n"
                                                    "    assert add(2, 3) == 5\n")
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\nsed -i 's/a - b/a + b/' /app/calc.py\n")
    return task


def _variant(task: Task, root: Path, name: str, test_sh: str, timeout_s: float | None = None) -> Task:
    """The same task (same environment image) with another tests/test.sh."""
    tests = root / name
    shutil.copytree(task.provenance["harbor"]["tests_dir"], tests)
    (tests / "test.sh").write_text("#!/bin/bash\n" + test_sh)
    harbor = {**task.provenance["harbor"], "tests_dir": str(tests)}
    if timeout_s is not None:
        harbor["verifier_timeout_s"] = timeout_s
    return task.model_copy(update={"provenance": {**task.provenance, "harbor": harbor}})


@pytest.fixture(scope="module")
def harbor_verifier(docker_engine, base_image, lego_config, factory):
    # No retries: each infra failure below is checked once, not three times.
    config = lego_config.verify.model_copy(update={"infra_retries": 0})
    return Verifier(docker_engine.client, base_image, lego_config.sandbox, config, factory=factory)


@pytest.fixture(scope="module")
def harbor_task(tmp_path_factory, base_image) -> Task:
    root = tmp_path_factory.mktemp("harbor-set")
    _write_task(root, base_image)
    loaded = load_tasks(root, strict=True)
    assert [task.instance_id for task in loaded.tasks] == ["add-numbers"]
    return loaded.tasks[0]


@pytest.fixture(scope="module")
def gold(harbor_verifier, harbor_task) -> str:
    return harbor_verifier.harbor_grading.solution_diff(harbor_task)


def test_empty_patch_is_never_resolved_and_the_solution_is(harbor_verifier, harbor_task, gold):
    assert "+    return a + b" in gold  # solve.sh's effect, taken as a diff
    empty = harbor_verifier.verify(harbor_task, diff="", actions=[])
    assert empty.kind == OutcomeKind.unresolved, empty.evidence
    assert empty.evidence["check"] == "harbor_reward" and empty.evidence["reward"] == 0.0
    solved = harbor_verifier.verify(harbor_task, diff=gold, actions=[])
    assert solved.kind == OutcomeKind.resolved, (solved.evidence, solved.test_log)
    assert solved.evidence["reward"] == 1.0 and solved.evidence["reward_files_written"] == ["reward.txt"]
    assert "1 passed" in solved.test_log


def test_a_change_to_a_test_file_is_dropped_and_flagged(harbor_verifier, harbor_task, gold):
    edit = ("diff --git a/tests/test_smoke.py b/tests/test_smoke.py\n--- a/tests/test_smoke.py\n"
            "+++ b/tests/test_smoke.py\n@@ -1,2 +1,2 @@\n def test_smoke():\n-    assert True\n+    assert 1\n")
    outcome = harbor_verifier.verify(harbor_task, diff=gold + edit, actions=[])
    assert outcome.kind == OutcomeKind.cheat and "test_files_edited" in outcome.cheat_rules
    assert outcome.evidence["dropped_files"] == ["tests/test_smoke.py"]
    assert outcome.evidence["tests_alone_would_give"] == "resolved"


def test_the_graded_code_can_neither_replace_nor_outlive_the_reward(harbor_verifier, harbor_task, tmp_path):
    # test.sh runs as the graded code's user: what it cannot do, code under test cannot either.
    attack = """cd /app
rm -f /logs/verifier/reward.txt && echo REMOVED
ln -sf /tmp/mine /logs/verifier/reward.json 2>/dev/null && echo REPLACED
cat /logs/verifier/reward.txt 2>/dev/null && echo READ
(sleep 300; echo 1 > /logs/verifier/reward.txt) &
echo 1 > /logs/verifier/reward.txt
echo 0 > /logs/verifier/reward.txt
"""
    outcome = harbor_verifier.verify(_variant(harbor_task, tmp_path, "attack", attack), diff="", actions=[])
    assert outcome.kind == OutcomeKind.unresolved, outcome.evidence
    assert outcome.evidence["reward"] == 0.0  # the last write test.sh made
    assert outcome.evidence["reward_files_written"] == ["reward.txt"]  # the symlink went nowhere
    for word in ("REMOVED", "REPLACED", "READ"):
        assert word not in outcome.test_log
    assert outcome.evidence["test_sh"]["seconds"] < 60  # nothing it left held the grading up


# Processes test.sh leaves to write reward 1 the moment it has exited, each watching for that moment its own way:
# polling test.sh's pid, a detached session polling pid 1, one deaf to every catchable signal, one holding the
# reward file open from before. With a kill sent after test.sh's exit, the first wrote 1 in every run.
WATCHERS = """cd /app
( while [ -d /proc/$$ ]; do :; done; echo 1 > /logs/verifier/reward.txt ) &
( setsid bash -c 'while [ -d /proc/1 ]; do :; done; echo 1 > /logs/verifier/reward.txt' & ) &
( trap '' TERM INT HUP QUIT USR1 USR2; while [ -d /proc/$$ ]; do :; done; echo 1 > /logs/verifier/reward.txt ) &
( exec 3>>/logs/verifier/reward.txt; while [ -d /proc/$$ ]; do :; done; echo 1 >&3 ) &
sleep 0.5
echo 0 > /logs/verifier/reward.txt
"""


def test_nothing_test_sh_leaves_can_write_a_reward_after_it(harbor_verifier, harbor_task, tmp_path):
    task = _variant(harbor_task, tmp_path, "watchers", WATCHERS)
    for _ in range(3):
        outcome = harbor_verifier.verify(task, diff="", actions=[])
        assert outcome.kind == OutcomeKind.unresolved, outcome.evidence
        assert outcome.evidence["reward"] == 0.0, outcome.evidence


@pytest.mark.parametrize(("name", "test_sh", "timeout_s", "check"), [
    ("missing", "cd /app && python3 -m pytest -q -p no:cacheprovider /tests/test_outputs.py\n", None,
     "reward_missing"),
    ("malformed", "echo passed > /logs/verifier/reward.txt\n", None, "reward_malformed"),
    ("json-nan", "echo '{\"reward\": NaN}' > /logs/verifier/reward.json\n", None, "reward_malformed"),
    ("timeout", "sleep 120\necho 1 > /logs/verifier/reward.txt\n", 3.0, "verifier_timeout"),
])
def test_no_reward_is_infra_never_a_reward(harbor_verifier, harbor_task, tmp_path, name, test_sh, timeout_s, check):
    task = _variant(harbor_task, tmp_path, name, test_sh, timeout_s)
    outcome = harbor_verifier.verify(task, diff="", actions=[])
    assert outcome.kind == OutcomeKind.infra_error, outcome.evidence
    assert outcome.evidence["check"] == check and outcome.evidence["error"]


def _calc_patch(*lines: str) -> str:
    added = "".join(f"+{line}\n" for line in lines)
    return (f"diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,{len(lines) + 2} @@\n"
            f"{added} def add(a, b):\n     return a - b\n")


def test_the_graded_code_cannot_kill_test_sh(harbor_verifier, harbor_task):
    # test.sh is its sandbox's init: a signal from inside that it does not handle never reaches it, so the code
    # under test cannot end it before it writes its verdict (or after writing a hopeful one).
    kill = _calc_patch("import os", "import signal", "os.kill(os.getppid(), signal.SIGKILL)",
                       "os.kill(1, signal.SIGKILL)", "os.kill(-1, signal.SIGKILL)")
    outcome = harbor_verifier.verify(harbor_task, diff=kill, actions=[])
    assert outcome.kind == OutcomeKind.unresolved, outcome.evidence
    assert outcome.evidence["check"] == "harbor_reward" and outcome.evidence["reward"] == 0.0


def test_a_patch_that_leaves_no_reward_is_blamed_not_infra(harbor_verifier, harbor_task, tmp_path):
    # A run that ends with no reward (here: past the verifier's time) would be infra without the control run,
    # a way out of the loss; the control run, without the patch, yields a reward, so the patch is to blame.
    task = _variant(harbor_task, tmp_path, "short", PASSING_TESTS, timeout_s=15.0)
    hang = _calc_patch("import time", "time.sleep(3600)")
    outcome = harbor_verifier.verify(task, diff=hang, actions=[])
    assert outcome.kind == OutcomeKind.unresolved, outcome.evidence
    assert outcome.evidence["check"] == "verifier_timeout_caused_by_patch"


def test_bundled_set_exported_to_harbor_gets_the_same_verdicts(harbor_verifier, lego_config, tmp_path):
    from typer.testing import CliRunner

    from lego.sandbox.harbor_image import harbor_layer_tag
    from lego.sandbox.task_image import task_image_tag
    from lego.verify.pytest_grading import decoy_plan_key
    from lego_cli import app

    out = tmp_path / "harbor-bundled"
    result = CliRunner().invoke(app, ["tasks", "export", "--harbor", str(out), "-c", "test",
                                      "tasks.source=bundled"])
    assert result.exit_code == 0, result.output
    bundled = load_tasks("bundled").tasks
    exported = load_tasks(out, strict=True).tasks
    assert sorted(t.instance_id for t in exported) == sorted(t.instance_id for t in bundled)
    for task_dir in out.iterdir():  # hidden tests never in the environment the agent gets
        assert not list((task_dir / "environment").rglob("test.patch"))
        environment = subprocess.run(["grep", "-rl", "lego_check", str(task_dir / "environment")],
                                     capture_output=True, text=True).stdout
        assert environment == ""
    by_id = {task.instance_id: task for task in exported}
    # The same set at another path is the same content: its images and decoy plans are the ones already made.
    shutil.copytree(out, tmp_path / "moved")
    moved = {task.instance_id: task for task in load_tasks(tmp_path / "moved", strict=True).tasks}
    for instance_id, task in by_id.items():
        assert task.environment.dockerfile_dir != moved[instance_id].environment.dockerfile_dir
        assert task_image_tag(moved[instance_id], "base:1") == task_image_tag(task, "base:1")
        assert harbor_layer_tag(moved[instance_id]) == harbor_layer_tag(task)
        assert decoy_plan_key(moved[instance_id], 2) == decoy_plan_key(task, 2)
    # Content, not a constant: tasks at other commits are other layers (tasks at one commit share theirs).
    assert len({harbor_layer_tag(task) for task in exported}) == len({task.base_commit for task in exported}) > 1
    grading = harbor_verifier.harbor_grading
    for original in (bundled[0], bundled[4]):  # two repositories
        harbor = by_id[original.instance_id]
        assert harbor.test_patch == original.test_patch  # the screening knows the hidden test files
        gold = grading.solution_diff(harbor)
        # The bundled tasks' own verdicts (gold resolved, empty unresolved, every task): tests/test_validate.py.
        verdicts = (harbor_verifier.verify(harbor, diff=gold, actions=[]).kind,
                    harbor_verifier.verify(harbor, diff="", actions=[]).kind)
        assert verdicts == (OutcomeKind.resolved, OutcomeKind.unresolved), (original.instance_id, verdicts)


# Harbor's own oracle/nop run over the exported set: tests/test_harbor_backend.py.


def test_doctor_reports_the_harbor_environment(work_dir, tmp_path, monkeypatch):
    from lego import doctor

    monkeypatch.setenv("LEGO_HARBOR_VENV", str(tmp_path / "no-venv"))
    ok, detail, fix = doctor._harbor(work_dir)
    assert not ok and f"not installed in {tmp_path / 'no-venv'}" in detail and "docker compose v2" in detail
    assert fix.startswith("optional:")
    (tmp_path / "no-venv" / "bin").mkdir(parents=True)
    (tmp_path / "no-venv" / "bin" / "harbor").write_text("#!/bin/sh\n")
    _, detail, _ = doctor._harbor(work_dir)
    assert f"harbor: {tmp_path / 'no-venv' / 'bin' / 'harbor'}" in detail
