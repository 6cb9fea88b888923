"""A task Lego exported as a Harbor directory, loaded back, is graded by its own tests with decoys (not by test.sh,
whose verdict the graded code could forge), on the Harbor environment the directory describes."""

from __future__ import annotations

import pytest

from lego.records import OutcomeKind
from lego.tasksets.harbor_export import export_harbor
from lego.tasksets.load import load_tasks
from lego.tasksets.task import has_harbor_environment, is_harbor_task

pytestmark = pytest.mark.docker


def test_an_exported_task_loaded_back_is_graded_by_its_tests_with_decoys(verifier, base_image, tmp_path):
    original = load_tasks("bundled").tasks[0]
    export_harbor([original], tmp_path / "set", base_image)
    (task,) = load_tasks(tmp_path / "set", strict=True).tasks
    assert not is_harbor_task(task) and has_harbor_environment(task)
    assert (task.FAIL_TO_PASS, task.PASS_TO_PASS) == (original.FAIL_TO_PASS, original.PASS_TO_PASS)
    assert task.patch == original.patch and task.test_patch == original.test_patch

    gold = verifier.verify(task, diff=task.patch, actions=[])
    assert gold.kind == OutcomeKind.resolved and gold.cheat_rules == [], gold.evidence
    assert gold.evidence["check"] == "tests" and gold.evidence["decoys"]["count"] >= 2
    empty = verifier.verify(task, diff="", actions=[])
    assert empty.kind == OutcomeKind.unresolved, empty.evidence


def test_a_foreign_harbor_directory_is_still_graded_by_its_test_sh(tmp_path):
    """Only what Lego wrote is read as Lego's: a directory without its spec keeps Harbor's recipe."""
    original = load_tasks("bundled").tasks[0]
    export_harbor([original], tmp_path / "set", "lego-base:any")
    directory = tmp_path / "set" / original.instance_id
    (directory / "tests" / "lego_spec.json").unlink()
    (task,) = load_tasks(tmp_path / "set", strict=True).tasks
    assert is_harbor_task(task) and task.test_command == "bash /tests/test.sh"
