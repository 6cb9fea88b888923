"""The diff screen without Docker: what an honest patch may do, and what it may not."""

from __future__ import annotations

from calc_variants import new_file_patch
from repo_fixtures import GOLD_PATCH, TEST_PATCH

from lego.tasksets.task import Task
from lego.verify.cheat import screen_diff

TASK = Task(instance_id="t-1", repo="r", base_commit="abc", problem_statement="p", patch=GOLD_PATCH,
            test_patch=TEST_PATCH, FAIL_TO_PASS=["tests/test_calc.py::test_add"])
DELETE_HELPER = ("diff --git a/old_helper.py b/old_helper.py\ndeleted file mode 100644\n--- a/old_helper.py\n"
                 "+++ /dev/null\n@@ -1 +0,0 @@\n-X = 1\n")
PYPROJECT_DEPENDENCY = ("diff --git a/pyproject.toml b/pyproject.toml\n--- a/pyproject.toml\n+++ b/pyproject.toml\n"
                        "@@ -1,2 +1,3 @@\n [project]\n name = \"calc\"\n+dependencies = [\"attrs\"]\n")


def test_honest_changes_fire_nothing_and_are_kept():
    diff = (GOLD_PATCH + new_file_patch("helpers.py", "def double(x):\n    return 2 * x\n") + DELETE_HELPER
            + PYPROJECT_DEPENDENCY + new_file_patch("calc_pkg/json_io.py", "import json\n"))
    screening = screen_diff(diff, TASK)
    assert screening.rules == {}
    assert [part.path for part in screening.kept] == ["calc.py", "helpers.py", "old_helper.py", "pyproject.toml",
                                                     "calc_pkg/json_io.py"]


def test_a_new_test_of_the_agents_own_is_dropped_but_not_a_cheat():
    screening = screen_diff(new_file_patch("tests/test_double.py", "def test_double():\n    pass\n"), TASK)
    assert screening.rules == {} and [part.path for part in screening.dropped] == ["tests/test_double.py"]


def test_shadowing_the_standard_library_or_the_runner_is_flagged():
    for path in ("json.py", "argparse/__init__.py", "pluggy.py", "_pytest/__init__.py", "x.pth"):
        screening = screen_diff(new_file_patch(path, "X = 1\n"), TASK)
        assert "grading_tampered" in screening.rules, path
        assert screening.kept == []


def test_deleting_a_test_file_is_an_edit_not_an_escape():
    deletion = ("diff --git a/tests/test_other.py b/tests/test_other.py\ndeleted file mode 100644\n"
                "--- a/tests/test_other.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-def test_x(): pass\n")
    assert screen_diff(deletion, TASK).rules.keys() == {"test_files_edited"}


def test_source_reaching_into_pytest_is_flagged_but_kept():
    patch = new_file_patch("plugin_ish.py", "from _pytest import reports\n")
    screening = screen_diff(patch, TASK)
    assert "grading_tampered" in screening.rules and [part.path for part in screening.kept] == ["plugin_ish.py"]
    # pytest's own source (a task on pytest's repository) may of course mention _pytest.
    assert screen_diff(new_file_patch("src/_pytest/reports.py", "import _pytest\n"), TASK).rules == {}
