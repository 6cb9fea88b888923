"""Servers a command starts end when the command ends, even killed (lego/child_process.py): a Prefect server that
`lego deploy` left behind kept its port and launched scheduled runs for 45 minutes after the suite's deployment
test had killed `lego deploy`."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from lego import REPO_ROOT

PARENT = """
import subprocess, sys, time
from lego.child_process import ends_with_parent
kept = subprocess.Popen(["sleep", "300"], preexec_fn=ends_with_parent())
left = subprocess.Popen(["sleep", "300"])
print(kept.pid, left.pid, flush=True)
time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_a_child_started_with_it_ends_when_its_parent_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    kept, left = (int(pid) for pid in parent.stdout.readline().split())
    try:
        parent.kill()  # no cleanup of its own runs
        parent.wait()
        deadline = time.monotonic() + 30
        while alive(kept) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(kept)
        assert alive(left)  # the control: a child started without it outlives its killed parent
    finally:
        for pid in (kept, left):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def test_the_prefect_server_is_started_with_it(tmp_path, monkeypatch):
    import lego.pipeline.prefect_env as prefect_env
    from lego.workdir import WorkDir

    started = {}

    def popen(command, **options):
        started.update(command=command, **options)
        raise RuntimeError("not started")

    monkeypatch.setattr(prefect_env.subprocess, "Popen", popen)
    with pytest.raises(RuntimeError, match="not started"):
        prefect_env.launch_prefect_server(WorkDir.create(tmp_path / "work"), 4200)
    assert started["command"][-5:-3] == ["start", "--host"] and started["preexec_fn"] is not None
