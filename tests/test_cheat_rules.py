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


def test_a_file_named_like_the_standard_library_or_the_runner_is_kept_without_a_rule():
    # Names decide nothing: the grading runner resolves these modules apart from the repository, so such a file
    # cannot shadow them (tests/test_redteam_grading.py runs the attack), and a repository may well have one.
    for path in ("json.py", "argparse/__init__.py", "pluggy.py", "_pytest/__init__.py", "x.pth"):
        screening = screen_diff(new_file_patch(path, "X = 1\n"), TASK)
        assert screening.rules == {} and [part.path for part in screening.kept] == [path], path


def test_deleting_a_test_file_is_an_edit_not_an_escape():
    deletion = ("diff --git a/tests/test_other.py b/tests/test_other.py\ndeleted file mode 100644\n"
                "--- a/tests/test_other.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-def test_x(): pass\n")
    assert screen_diff(deletion, TASK).rules.keys() == {"test_files_edited"}


def test_source_mentioning_pytest_is_judged_by_what_it_does_not_by_its_text():
    # What code does to the runner is seen while it runs (lego/verify/runner/); its spelling proves nothing.
    for path, text in (("plugin_ish.py", "from _pytest import reports\n"), ("src/_pytest/reports.py", "import _pytest\n")):
        screening = screen_diff(new_file_patch(path, text), TASK)
        assert screening.rules == {} and [part.path for part in screening.kept] == [path]


SMUGGLED_CONFTEST = ("diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n"
                     " def add(a, b):\n-    return a - b\n+    return a + b\n"
                     "--- /dev/null\n+++ b/tests/conftest.py\n@@ -0,0 +1,1 @@\n+import os\n")


def test_a_file_smuggled_inside_another_files_section_is_dropped_and_flagged():
    # git applies a traditional ---/+++ fragment inside a `diff --git` section: screen what git applies.
    screening = screen_diff(SMUGGLED_CONFTEST, TASK)
    assert "patch_smuggles_files" in screening.rules and screening.kept == []


def test_unusual_but_honest_paths_are_not_smuggling(tmp_path):
    import subprocess

    rename = ("diff --git a/old name.py b/new name.py\nsimilarity index 100%\nrename from old name.py\n"
              "rename to new name.py\n")
    # A name git quotes C-style in its headers ("b/t\\303\\251st_data.py"), from git itself.
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "t\u00e9st data.py").write_text("X = 1\n")
    subprocess.run(["git", "-C", str(tmp_path), "add", "-A"], check=True)
    quoted = subprocess.run(["git", "-C", str(tmp_path), "diff", "--cached"], check=True, capture_output=True,
                            text=True).stdout
    assert '"b/t\\303\\251st data.py"' in quoted
    for diff in (rename, quoted, new_file_patch("pkg/helpers.py", "X = 1\n")):
        screening = screen_diff(diff, TASK)
        assert screening.rules == {} and screening.kept, diff
