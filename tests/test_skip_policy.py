"""The suite's skip policy (tests/conftest.py ALLOWED_SKIPS): a skip off the allow-list fails the run, whether one
test skips or a whole module skips at collection; a run without skips passes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent


def run_pytest(directory: Path, *files: str) -> subprocess.CompletedProcess:
    """pytest over `files` in `directory`, with the suite's conftest loaded as a plugin (its hooks, not its rootdir)."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider", *files]
    env = {"PYTHONPATH": str(TESTS_DIR), "PATH": "/usr/bin:/bin"}
    return subprocess.run(command, cwd=directory, env=env, capture_output=True, text=True, timeout=120)


def test_a_skip_off_the_allow_list_fails_the_run(tmp_path):
    (tmp_path / "test_one.py").write_text("import pytest\n\ndef test_skipped():\n    pytest.skip('no engine')\n")
    done = run_pytest(tmp_path, "test_one.py")
    assert done.returncode == 1, done.stdout
    assert "skips not on the allow-list" in done.stdout and "test_one.py::test_skipped: " in done.stdout


def test_a_module_skipped_at_collection_fails_the_run(tmp_path):
    (tmp_path / "test_module.py").write_text(
        "import pytest\n\npytest.importorskip('a_module_nobody_has')\n\ndef test_never():\n    pass\n")
    (tmp_path / "test_fine.py").write_text("def test_fine():\n    pass\n")
    done = run_pytest(tmp_path, "test_module.py", "test_fine.py")
    assert done.returncode == 1, done.stdout
    assert "test_module.py: " in done.stdout and "a_module_nobody_has" in done.stdout


def test_a_run_without_skips_passes(tmp_path):
    (tmp_path / "test_fine.py").write_text("def test_fine():\n    pass\n")
    done = run_pytest(tmp_path, "test_fine.py")
    assert done.returncode == 0, done.stdout + done.stderr
