"""`lego tasks validate`: the bundled tasks are gradeable; broken tasks are reported as broken."""

from __future__ import annotations

import json

import pytest

from lego.verify.validate import classify

pytestmark = pytest.mark.docker


def test_every_bundled_task_is_resolved_by_its_gold_patch_and_not_by_the_empty_one(verifier):
    from lego.tasksets.load import load_tasks
    from lego.verify.validate import validate_tasks

    tasks = load_tasks("bundled", "all", strict=True).tasks
    assert len(tasks) >= 8
    report = validate_tasks(verifier, tasks, runs=1, concurrency=2)
    by_id = {task.instance_id: task for task in report.tasks}
    assert set(by_id) == {task.instance_id for task in tasks}
    for instance_id, result in by_id.items():
        assert result.gold == ["resolved"], (instance_id, result.evidence)
        assert result.empty == ["unresolved"], (instance_id, result.evidence)
    assert report.broken == []


def test_broken_tasks_are_reported_with_why(verifier, calc_task, tmp_path):
    from lego.verify.validate import validate_tasks, write_report

    no_fix = calc_task.model_copy(update={
        "instance_id": "calc__gold-does-not-fix",
        "patch": calc_task.patch.replace("+    return a + b", "+    return a - b  # still wrong")})
    tests_nothing = calc_task.model_copy(update={
        "instance_id": "calc__empty-resolves", "FAIL_TO_PASS": ["tests/test_calc.py::test_mul"],
        "PASS_TO_PASS": []})
    # The loaders refuse such a task; one built around them is reported, never graded.
    no_tests = calc_task.model_copy(update={"instance_id": "calc__no-tests", "FAIL_TO_PASS": [], "PASS_TO_PASS": []})
    report = validate_tasks(verifier, [calc_task, no_fix, tests_nothing, no_tests], runs=1, concurrency=2)
    by_id = {task.instance_id: task for task in report.tasks}
    assert not by_id[calc_task.instance_id].broken
    assert by_id["calc__gold-does-not-fix"].problems == ["gold_not_resolved"]
    failing = by_id["calc__gold-does-not-fix"].evidence["gold_not_resolved"]["failing"]
    assert failing == {"FAIL_TO_PASS": ["tests/test_calc.py::test_add"]}
    assert by_id["calc__empty-resolves"].problems == ["empty_resolves"]
    assert by_id["calc__no-tests"].problems == ["no_fail_to_pass"] and by_id["calc__no-tests"].gold == []
    assert "no FAIL_TO_PASS test" in by_id["calc__no-tests"].evidence["no_fail_to_pass"]["error"]
    path = write_report(report, tmp_path)
    saved = json.loads(path.read_text())
    assert saved["broken"] == ["calc__gold-does-not-fix", "calc__empty-resolves", "calc__no-tests"]
    assert saved["tasks_total"] == 4 and saved["runs"] == 1


def test_classify_flags_flaky_and_infra_runs():
    assert classify(["resolved"] * 3, ["unresolved"] * 3) == []
    assert classify(["resolved", "unresolved", "resolved"], ["unresolved"] * 3) == ["flaky", "gold_not_resolved"]
    assert classify(["resolved"] * 3, ["unresolved", "resolved", "unresolved"]) == ["flaky", "empty_resolves"]
    assert classify(["resolved", "infra_error"], ["unresolved"] * 2) == ["infra_error"]
    assert classify(["cheat"], ["unresolved"]) == ["gold_not_resolved"]


def test_cli_writes_a_report_and_exits_nonzero_on_a_broken_task(calc_task, tmp_path, lego_config, docker_engine):
    from typer.testing import CliRunner

    from lego_cli import app

    broken = calc_task.model_copy(update={"instance_id": "calc__broken",
                                          "patch": calc_task.patch.replace("a + b", "a * b")})
    source = tmp_path / "tasks.jsonl"
    source.write_text(calc_task.model_dump_json() + "\n" + broken.model_dump_json() + "\n")
    work = tmp_path / "work"
    overrides = [f"tasks.source={source}", f"project.work_dir={work}", f"docker.host={docker_engine.base_url}"]
    result = CliRunner().invoke(app, ["tasks", "validate", "-c", "test", "--runs", "1", *overrides])
    assert result.exit_code == 1, result.output
    (report_path,) = (work / "artifacts" / "validate").glob("tasks-validate-*.json")
    report = json.loads(report_path.read_text())
    assert report["broken"] == ["calc__broken"] and report["tasks_total"] == 2
    ok = tmp_path / "ok.jsonl"
    ok.write_text(calc_task.model_dump_json() + "\n")
    result = CliRunner().invoke(app, ["tasks", "validate", "-c", "test", "--runs", "1", f"tasks.source={ok}",
                                      *overrides[1:]])
    assert result.exit_code == 0, result.output


def test_a_decoy_plan_that_cannot_be_made_is_that_tasks_error_and_not_the_commands(calc_task):
    """A plan whose gold runs ran past verify.timeout_s (a loaded machine, a slow suite) is reported on its task's
    row; `lego tasks validate` goes on with the other tasks instead of ending in a traceback."""
    from types import SimpleNamespace

    from lego.verify.grading import InfraFailure
    from lego.verify.validate import coverage_or_error

    def plan(task):
        raise InfraFailure("verifier_timeout", "the decoy plan's gold runs ran past verify.timeout_s (full)")

    verifier = SimpleNamespace(pytest_grading=SimpleNamespace(decoy_plan=plan), config=SimpleNamespace(decoys_per_test=2))
    found = coverage_or_error(verifier, calc_task)
    assert found == {"error": "InfraFailure: the decoy plan's gold runs ran past verify.timeout_s (full)"}
