"""`lego tasks reshape`: synthesized tasks in SWE-bench's shape (FAIL_TO_PASS functions added by test_patch).

No Docker: a small package repository is built here, reshaped, and checked with git and the host's pytest."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lego.tasksets.gitutil import apply_patch, bundle, clone, commit_all, diff, git, init_repo
from lego.tasksets.load import load_tasks
from lego.tasksets.reshape import (
    ID_SUFFIX,
    ReshapeError,
    ReshapeOutcome,
    TestFunction,
    defines,
    remove_functions,
    swebench_shape,
)
from lego.tasksets.synth import MUTATION_DATE, PRISTINE_DATE
from lego.tasksets.task import Task
from lego.tasksets.testrun import PASSED, run_tests
from lego_cli import app

CALC = '''def clamp(value, low, high):
    if value < low:
        return low
    if value > high:
        return high
    return value


def double(x):
    return x * 2
'''

CALC_TESTS = '''import pytest

from calc import clamp, double


def test_inside():
    assert clamp(5, 0, 10) == 5


@pytest.mark.parametrize("value, expected", [(11, 10), (42, 10), (3, 3)])
def test_clamp_high(value, expected):
    assert clamp(value, 0, 10) == expected


class TestHigh:
    def test_above(self):
        assert clamp(99, 0, 10) == 10


class TestClamp:
    def test_low(self):
        assert clamp(-1, 0, 10) == 0

    def test_high_edge(self):
        assert clamp(10.5, 0, 10) == 10


class TestBase:
    def test_high_again(self):
        assert clamp(12, 0, 10) == 10


class TestSub(TestBase):
    pass


def test_double():
    assert double(2) == 4
'''

# The original task's own test_patch: one more FAIL_TO_PASS test, at the end of the file.
ADDED_TEST = '''

def test_clamp_far_above():
    assert clamp(10**9, 0, 10) == 10
'''

TESTS = "tests/test_calc.py"
FAIL_TO_PASS = [f"{TESTS}::test_clamp_high[11-10]", f"{TESTS}::test_clamp_high[42-10]", f"{TESTS}::TestHigh::test_above",
                f"{TESTS}::TestClamp::test_high_edge", f"{TESTS}::TestSub::test_high_again",
                f"{TESTS}::test_clamp_far_above"]
PASS_TO_PASS = [f"{TESTS}::test_inside", f"{TESTS}::test_clamp_high[3-3]", f"{TESTS}::TestClamp::test_low",
                f"{TESTS}::test_double"]


def _task_set(root: Path) -> Path:
    """A package whose base commit has `clamp` return `value` above `high`, and three tasks on it: a good one, one
    naming a FAIL_TO_PASS function no file defines, one whose gold patch touches the test file."""
    repo = root / "calc-src"
    init_repo(repo)
    (repo / "calc").mkdir()
    (repo / "tests").mkdir()
    (repo / "calc" / "__init__.py").write_text(CALC)
    (repo / TESTS).write_text(CALC_TESTS)
    (repo / "conftest.py").write_text("")
    commit_all(repo, "calc: pristine", PRISTINE_DATE)
    (repo / "calc" / "__init__.py").write_text(CALC.replace("        return high", "        return value"))
    base = commit_all(repo, "calc: mutated", MUTATION_DATE)
    (repo / "calc" / "__init__.py").write_text(CALC)
    gold = diff(repo, ["calc/__init__.py"])
    (repo / TESTS).write_text(CALC_TESTS + ADDED_TEST)
    test_patch = diff(repo, [TESTS])
    git(repo, "checkout", "-q", "--", ".")
    task_set = root / "calc-set"
    bundle(repo, task_set / "repos" / "calc.bundle")
    row = {"repo": "lego-synth/calc", "base_commit": base, "problem_statement": "clamp lets values above high through",
           "patch": gold, "test_patch": test_patch, "FAIL_TO_PASS": FAIL_TO_PASS, "PASS_TO_PASS": PASS_TO_PASS,
           "environment": {"kind": "bundle", "bundle": "repos/calc.bundle"}, "provenance": {"source": "synth"}}
    rows = [{**row, "instance_id": "calc-good"},
            {**row, "instance_id": "calc-missing", "FAIL_TO_PASS": [*FAIL_TO_PASS, f"{TESTS}::test_nowhere"]},
            {**row, "instance_id": "calc-gold-in-tests", "patch": gold + test_patch}]
    (task_set / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return task_set / "tasks.jsonl"


@pytest.fixture(scope="module")
def reshaped(tmp_path_factory) -> tuple[Path, list[Task], dict[str, Task], list[ReshapeOutcome]]:
    root = tmp_path_factory.mktemp("reshape")
    source = load_tasks(_task_set(root), strict=True).tasks
    outcomes: list[ReshapeOutcome] = []
    tasks = swebench_shape(source, root / "out", outcomes.append)
    return root, tasks, {task.instance_id: task for task in source}, outcomes


def _checkout(task: Task, dest: Path, *patches: str) -> Path:
    repo = clone(task.environment.bundle, dest, task.base_commit)
    for patch in patches:
        apply_patch(repo, patch)
    return repo


def _files(repo: Path) -> dict[str, bytes]:
    return {str(p.relative_to(repo)): p.read_bytes() for p in sorted(repo.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(repo).parts}


# ---------------------------------------------------------------- removing functions from a file


def test_remove_functions_takes_decorators_and_leaves_a_pass_in_an_emptied_class():
    functions = [TestFunction.of(test_id) for test_id in FAIL_TO_PASS[:5]]
    text, removed = remove_functions(CALC_TESTS, functions)
    # The two parametrized ids are one function; TestSub's test is the one it inherits from TestBase.
    assert [str(function) for function in removed] == [
        f"{TESTS}::test_clamp_high", f"{TESTS}::TestHigh::test_above", f"{TESTS}::TestClamp::test_high_edge",
        f"{TESTS}::TestBase::test_high_again"]
    tree = ast.parse(text)
    assert not any(defines(text, function) for function in functions)
    assert "parametrize" not in text and "class TestHigh:\n    pass\n" in text
    assert "class TestBase:\n    pass\n" in text and "class TestSub(TestBase):\n    pass\n" in text
    assert [node.name for node in tree.body if isinstance(node, ast.FunctionDef)] == ["test_inside", "test_double"]
    assert "\n\n\n\n" not in text  # the blank lines above a removed function go with it
    assert TestFunction.of("README.rst::README.rst") is None and TestFunction.of("tests/t.py::test_a[x::y]").name == "test_a"


# ---------------------------------------------------------------- a task set


def test_reshaped_base_lacks_the_failing_tests_and_test_patch_restores_them(reshaped):
    root, tasks, source, _ = reshaped
    task = next(t for t in tasks if t.instance_id == "calc-good" + ID_SUFFIX)
    original = source["calc-good"]
    assert task.base_commit != original.base_commit and task.patch == original.patch
    new_base = _checkout(task, root / "new-base")
    assert git(new_base, "rev-parse", "HEAD~1").strip() == original.base_commit  # the new base sits on the old one
    text = (new_base / TESTS).read_text()
    assert not any(defines(text, TestFunction.of(test_id)) for test_id in task.FAIL_TO_PASS)
    assert defines(text, TestFunction.of(f"{TESTS}::TestClamp::test_low"))
    assert sorted(task.provenance["swebench_shape"]["removed_from_base"]) == [
        f"{TESTS}::TestBase::test_high_again", f"{TESTS}::TestClamp::test_high_edge",
        f"{TESTS}::TestHigh::test_above", f"{TESTS}::test_clamp_high"]
    # The new test_patch on the new base is the original base with the original test_patch, file for file.
    graded = _checkout(task, root / "graded", task.test_patch)
    assert _files(graded) == _files(_checkout(original, root / "original", original.test_patch))
    apply_patch(graded, task.patch)  # the gold patch still applies on top
    assert task.test_files == [TESTS]
    # test_clamp_high[3-3] was a PASS_TO_PASS id of a removed function: it is dropped, the others stay.
    assert task.PASS_TO_PASS == [t for t in PASS_TO_PASS if "test_clamp_high" not in t]
    assert task.FAIL_TO_PASS == FAIL_TO_PASS and task.provenance["swebench_shape"]["source_instance"] == "calc-good"


def test_rows_load_and_bad_tasks_are_skipped_with_their_reason(reshaped):
    root, tasks, _, outcomes = reshaped
    loaded = load_tasks(root / "out" / "tasks.jsonl", strict=True).tasks
    assert [t.instance_id for t in loaded] == [t.instance_id for t in tasks] == ["calc-good" + ID_SUFFIX]
    assert loaded[0].environment.bundle == str((root / "out" / "repos" / "calc.bundle").resolve())
    row = json.loads((root / "out" / "tasks.jsonl").read_text())
    assert row["environment"]["bundle"] == "repos/calc.bundle"
    why = {outcome.instance_id: outcome.skipped for outcome in outcomes}
    assert why["calc-good"] is None
    assert "test_nowhere" in why["calc-missing"] and "not found" in why["calc-missing"]
    assert "gold patch touches test file" in why["calc-gold-in-tests"]
    # The bundle's branches keep every base reachable for a plain `git clone`.
    heads = git(root, "bundle", "list-heads", str(root / "out" / "repos" / "calc.bundle"))
    assert f"{loaded[0].base_commit} refs/heads/swe/calc-good{ID_SUFFIX}" in heads


def test_reshape_is_deterministic_and_refuses_to_overwrite_its_source(reshaped, tmp_path):
    root, tasks, source, _ = reshaped
    again = swebench_shape([source["calc-good"]], tmp_path / "again")
    assert [t.base_commit for t in again] == [tasks[0].base_commit] and again[0].test_patch == tasks[0].test_patch
    with pytest.raises(ReshapeError, match="another output directory"):
        swebench_shape([source["calc-good"]], root / "calc-set")


def test_failing_tests_fail_at_the_new_base_and_pass_with_the_gold_patch(reshaped):
    root, tasks, _, _ = reshaped
    task = tasks[0]
    with_tests = _checkout(task, root / "run", task.test_patch)
    before = run_tests(with_tests, task.FAIL_TO_PASS, timeout_s=60)
    assert not [t for t in task.FAIL_TO_PASS if before[t] == PASSED], before
    apply_patch(with_tests, task.patch)
    after = run_tests(with_tests, task.FAIL_TO_PASS + task.PASS_TO_PASS, timeout_s=60)
    assert all(after[t] == PASSED for t in task.FAIL_TO_PASS + task.PASS_TO_PASS), after


def test_a_reshaped_bundled_task_grades_with_the_hosts_pytest(tmp_path):
    bundled = next(t for t in load_tasks("bundled").tasks if t.instance_id == "lego-bundled__iniconf-1")
    [task] = swebench_shape([bundled], tmp_path / "out")
    base = _checkout(task, tmp_path / "base")
    assert not any(defines((base / t.split("::")[0]).read_text(), TestFunction.of(t)) for t in task.FAIL_TO_PASS)
    apply_patch(base, task.test_patch)
    before = run_tests(base, task.FAIL_TO_PASS, timeout_s=60)
    assert not [t for t in task.FAIL_TO_PASS if before[t] == PASSED], before
    apply_patch(base, task.patch)
    after = run_tests(base, task.FAIL_TO_PASS + task.PASS_TO_PASS, timeout_s=60)
    assert all(after[t] == PASSED for t in task.FAIL_TO_PASS + task.PASS_TO_PASS), after


# ---------------------------------------------------------------- the command


def test_lego_tasks_reshape_command(reshaped, tmp_path):
    root, _, _, _ = reshaped
    source = root / "calc-set" / "tasks.jsonl"
    result = CliRunner().invoke(app, ["tasks", "reshape", "--source", str(source), "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert "calc-good-swe" in result.output and "skipped calc-missing" in result.output
    assert "1 task(s) reshaped" in result.output
    assert load_tasks(tmp_path / "o" / "tasks.jsonl", strict=True).tasks[0].instance_id == "calc-good-swe"
    # Nothing to reshape: the error says so (`lego` prints it and exits 2).
    lone = tmp_path / "lone.jsonl"
    lone.write_text(source.read_text().splitlines()[1].replace('"repos/', f'"{source.parent}/repos/') + "\n")
    failed = CliRunner().invoke(app, ["tasks", "reshape", "--source", str(lone), "--out", str(tmp_path / "o2")])
    assert isinstance(failed.exception, ReshapeError) and "could be reshaped" in str(failed.exception)
