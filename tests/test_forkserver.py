"""A beside harness's forkserver (lego.harness.forkserver): a script run through it behaves as the script run
directly (its argv, environment, working directory, standard streams and exit status), its preloaded modules are
imported once per server, killing the client kills the harness, and a lost server means a cold start, not a lost
rollout. The real harness through it: tests/test_harness_scripted.py and tests/test_rollout_hang.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lego.harness.forkserver import ForkserverError, start_forkserver

SCRIPT = """
import json, os, sys
import preloaded_probe
print(json.dumps({"argv": sys.argv[1:], "env": os.environ.get("ROLLOUT_VALUE"), "cwd": os.getcwd(),
                  "stdin": sys.stdin.read(), "path0": sys.path[0]}))
print("to stderr", file=sys.stderr)
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
"""


@pytest.fixture
def server(tmp_path):
    modules = tmp_path / "modules"
    modules.mkdir()
    imports = tmp_path / "imports.log"
    (modules / "preloaded_probe.py").write_text(f"open({str(imports)!r}, 'a').write('imported\\n')\n")
    script = tmp_path / "harness" / "runner.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    forkserver = start_forkserver(Path(sys.executable), ("preloaded_probe",), {"PYTHONPATH": str(modules)})
    yield forkserver, script, imports, modules
    forkserver.stop()


def run(forkserver, command: str, cwd: Path, env: dict[str, str], stdin: str = "", timeout: float = 60):
    return subprocess.run(["bash", "-c", command], cwd=cwd, env={**os.environ, **env}, input=stdin,
                          capture_output=True, text=True, timeout=timeout)


def test_a_script_through_the_forkserver_runs_as_it_would_directly(server, tmp_path):
    import json

    forkserver, script, imports, modules = server
    cwd = tmp_path / "scratch"
    cwd.mkdir()
    for index in range(3):
        result = run(forkserver, forkserver.command(script, "spec.json", "two words"), cwd,
                     {"ROLLOUT_VALUE": f"rollout-{index}", "PYTHONPATH": str(modules)}, stdin=f"input {index}")
        assert result.returncode == 0, result.stderr
        seen = json.loads(result.stdout.splitlines()[0])
        assert seen == {"argv": ["spec.json", "two words"], "env": f"rollout-{index}", "cwd": str(cwd),
                        "stdin": f"input {index}", "path0": str(script.parent)}
        assert result.stderr.strip() == "to stderr"
    # imported by the server once, never again by the forks
    assert imports.read_text().splitlines() == ["imported"]

    failed = run(forkserver, forkserver.command(script), cwd, {"EXIT_WITH": "3", "PYTHONPATH": str(modules)})
    assert failed.returncode == 3
    crash = tmp_path / "crash.py"
    crash.write_text("raise RuntimeError('the harness crashed')\n")
    crashed = run(forkserver, forkserver.command(crash), cwd, {})
    assert crashed.returncode == 1 and "RuntimeError: the harness crashed" in crashed.stderr


def test_killing_the_client_kills_the_harness(server, tmp_path):
    forkserver, _, _, _ = server
    pid_file = tmp_path / "harness.pid"
    hang = tmp_path / "hang.py"
    hang.write_text(f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n")
    client = subprocess.Popen(["bash", "-c", forkserver.command(hang)], cwd=tmp_path, start_new_session=True)
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and client.poll() is None, "the harness never started"
        time.sleep(0.05)
    harness = int(pid_file.read_text())
    assert harness != client.pid  # a fork of the server, not the client
    os.killpg(client.pid, 9)  # what the rollout does at its time limit
    client.wait(10)
    while Path(f"/proc/{harness}").exists() and _state(harness) != "Z":
        assert time.monotonic() < deadline + 10, "the harness outlived its client"
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return "gone"


def test_a_lost_server_means_a_cold_start(server, tmp_path):
    import json

    forkserver, script, imports, modules = server
    forkserver.stop()
    result = run(forkserver, forkserver.command(script, "spec.json"), tmp_path,
                 {"ROLLOUT_VALUE": "cold", "PYTHONPATH": str(modules)})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[0])["env"] == "cold"
    assert "unreachable" in result.stderr and "starting cold" in result.stderr
    assert imports.read_text().splitlines() == ["imported", "imported"]  # the server's, then the cold start's


def test_a_server_that_cannot_preload_says_what_to_do():
    with pytest.raises(ForkserverError, match="(?s)exited with 1.*no_such_module_here.*harness.forkserver: false"):
        start_forkserver(Path(sys.executable), ("no_such_module_here",), {})


def test_a_harness_ending_ends_its_client_while_a_later_one_runs_on(server, tmp_path):
    """Every fork leaves the other clients' connections behind: a client whose harness ended is not kept waiting
    by a harness forked after it."""
    forkserver, _, _, _ = server
    release, first_started, later_started = tmp_path / "release", tmp_path / "first", tmp_path / "later"
    waits = tmp_path / "waits.py"
    waits.write_text(f"import os, time\nopen({str(first_started)!r}, 'w').write('x')\n"
                     f"while not os.path.exists({str(release)!r}):\n    time.sleep(0.05)\n")
    hangs = tmp_path / "hangs.py"
    hangs.write_text(f"import time\nopen({str(later_started)!r}, 'w').write('x')\ntime.sleep(600)\n")
    first = subprocess.Popen(["bash", "-c", forkserver.command(waits)], cwd=tmp_path, start_new_session=True)
    later = None
    try:
        _wait_for(first_started)
        later = subprocess.Popen(["bash", "-c", forkserver.command(hangs)], cwd=tmp_path, start_new_session=True)
        _wait_for(later_started)
        release.write_text("go")
        assert first.wait(60) == 0
        assert later.poll() is None
    finally:
        for client in (first, later):
            if client is not None and client.poll() is None:
                os.killpg(client.pid, 9)
                client.wait(10)


def _wait_for(path: Path, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never started"
        time.sleep(0.05)
