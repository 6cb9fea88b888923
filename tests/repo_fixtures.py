"""A tiny git repository with history, as a task: for sandbox and verifier tests that must not depend on the bundled set."""

from __future__ import annotations

import difflib
import os
import subprocess
import textwrap
from pathlib import Path

from lego.tasksets.task import Environment, Task

CALC_BUGGY = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
CALC_FIXED = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
OLD_TESTS = "from calc import mul\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\n"
NEW_TESTS = OLD_TESTS + "\n\ndef test_add():\n    assert add(2, 3) == 5\n"
NEW_TESTS = NEW_TESTS.replace("from calc import mul", "from calc import add, mul")

GOLD_PATCH = """diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1,5 +1,5 @@
 def add(a, b):
-    return a - b
+    return a + b
 
 
 def mul(a, b):
"""

TEST_PATCH = """diff --git a/tests/test_calc.py b/tests/test_calc.py
--- a/tests/test_calc.py
+++ b/tests/test_calc.py
@@ -1,5 +1,9 @@
-from calc import mul
+from calc import add, mul
 
 
 def test_mul():
     assert mul(2, 3) == 6
+
+
+def test_add():
+    assert add(2, 3) == 5
"""


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_AUTHOR_DATE": "@1700000000", "GIT_COMMITTER_DATE": "@1700000000"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def make_calc_task(root: Path) -> Task:
    """A repo whose base commit has the bug; a later commit (the fix, with the new test) must never leak."""
    repo = root / "calc-repo"
    (repo / "tests").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    (repo / "calc.py").write_text(CALC_FIXED.replace("a + b", "a + b  # first version"))
    (repo / "tests" / "test_calc.py").write_text(OLD_TESTS)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "initial")
    (repo / "calc.py").write_text(CALC_BUGGY)
    _git(repo, "commit", "-qam", "refactor add (introduces the bug)")
    base = _git(repo, "rev-parse", "HEAD")
    (repo / "calc.py").write_text(CALC_FIXED)
    (repo / "tests" / "test_calc.py").write_text(NEW_TESTS)
    _git(repo, "commit", "-qam", "SECRET-FIX: add adds")
    _git(repo, "tag", "v-fixed")
    bundle = root / "calc.bundle"
    _git(repo, "bundle", "create", str(bundle), "--all")
    return Task(
        instance_id="calc__calc-1", repo="lego/calc", base_commit=base,
        problem_statement="add(2, 3) returns -1 instead of 5.",
        patch=GOLD_PATCH, test_patch=TEST_PATCH,
        FAIL_TO_PASS=["tests/test_calc.py::test_add"], PASS_TO_PASS=["tests/test_calc.py::test_mul"],
        environment=Environment(kind="bundle", bundle=str(bundle)),
    )


def new_file(path: str, text: str) -> str:
    """A diff that adds `path` with `text`."""
    body = "".join(f"+{line}\n" for line in text.splitlines())
    return (f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
            f"@@ -0,0 +1,{len(text.splitlines())} @@\n{body}")


def calc_patch(source: str, extra: dict[str, str] | None = None) -> str:
    """A diff that rewrites the calc task's calc.py to `source` and adds `extra` files (path -> text)."""
    new = textwrap.dedent(source).lstrip()
    lines = difflib.unified_diff(CALC_BUGGY.splitlines(keepends=True), new.splitlines(keepends=True),
                                 "a/calc.py", "b/calc.py")
    diff = "diff --git a/calc.py b/calc.py\n" + "".join(lines) if new != CALC_BUGGY else ""
    for path, text in (extra or {}).items():
        diff += new_file(path, textwrap.dedent(text).lstrip())
    return diff
