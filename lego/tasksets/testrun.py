"""Running a repository's pytest suite and reading per-test statuses.

This is the seam where a sandbox backend can take over: everything above it (task building,
bug synthesis) only needs `run_tests(repo_dir, test_ids) -> {test_id: status}`. The statuses are
read from pytest's `-rA` short summary exactly as swebench's `parse_log_pytest` reads them, so a
test id here is the id a grader will look for.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

PASSED, FAILED, ERROR, SKIPPED, XFAIL = "PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL"
_STATUSES = (PASSED, FAILED, ERROR, SKIPPED, XFAIL, "XPASS")

# The type of any replacement for `run_tests` (a sandbox backend, for instance).
TestRunner = Callable[..., dict[str, str]]


def parse_pytest_summary(log: str) -> dict[str, str]:
    """Map test id -> status from the `-rA` short test summary (same rules as swebench's parser)."""
    statuses: dict[str, str] = {}
    for line in log.splitlines():
        if not line.startswith(_STATUSES):
            continue
        if line.startswith(FAILED):
            line = line.replace(" - ", " ")
        parts = line.split()
        if len(parts) <= 1:
            continue
        status, test_id = parts[0], parts[1]
        if status == SKIPPED and test_id.startswith("["):
            continue  # "SKIPPED [1] file:line: reason" carries no test id
        statuses[test_id] = status
    return statuses


def run_pytest(repo_dir: Path, test_ids: Iterable[str] | None = None, timeout_s: float = 300.0,
               python: str | None = None, plugin_autoload: bool = False) -> tuple[int, str]:
    """Run pytest with `-rA` in `repo_dir` with the current (or given) interpreter; return (rc, log).

    Plugins installed in this environment are not loaded by default (PYTEST_DISABLE_PLUGIN_AUTOLOAD):
    the repository under test should not see Lego's own pytest plugins, and startup is 3x faster.
    """
    cmd = [python or sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "-q"]
    ids = list(test_ids or [])
    if ids:
        # Only the files: selecting node ids one by one breaks when an id is no longer collected.
        cmd += sorted({test_id.split("::", 1)[0] for test_id in ids})
    # A wide terminal keeps the assertion messages in the short summary from being cut.
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0", COLUMNS="400")
    env.pop("PYTEST_ADDOPTS", None)
    if not plugin_autoload:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    try:
        proc = subprocess.run(cmd, cwd=repo_dir, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return 124, out + f"\n[lego] pytest timed out after {timeout_s:.0f}s\n"
    return proc.returncode, proc.stdout + proc.stderr


def run_tests(repo_dir: Path, test_ids: Iterable[str] | None = None, timeout_s: float = 300.0,
              python: str | None = None) -> dict[str, str]:
    """Statuses of the tests in `repo_dir` (all of them, or those in the files of `test_ids`).

    A test id asked for but absent from the report (not collected, say because its file fails to
    import) is reported as ERROR, so callers never mistake a missing test for a passing one.
    """
    _, log = run_pytest(Path(repo_dir), test_ids, timeout_s, python=python)
    statuses = parse_pytest_summary(log)
    for test_id in test_ids or []:
        statuses.setdefault(test_id, ERROR)
    return statuses
