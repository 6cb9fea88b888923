"""Servers a command starts end when the command ends, even killed (lego/child_process.py): a Prefect server that
`lego deploy` left behind kept its port and launched scheduled runs for 45 minutes after the suite's deployment
test had killed `lego deploy`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

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


HARNESS_PARENT = """
import asyncio, sys, threading
from lego.harness.base import HarnessLaunch
from lego.rollout.guard import TurnGuard
from lego.rollout.harness_process import run_beside

async def rollout():
    launch = HarnessLaunch(command="echo $$; exec sleep 300", env={})
    await run_beside(launch, 300, sys.argv[1], TurnGuard(None, 10))

threading.Thread(target=asyncio.run, args=(rollout(),)).start()  # a batch runs in a worker thread
"""


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_a_harness_run_beside_the_sandbox_ends_when_the_rollout_process_is_killed(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", HARNESS_PARENT, str(tmp_path)], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    harness = None
    try:
        # the harness's stdout goes to the rollout's log, not here: find it as the parent's child
        deadline = time.monotonic() + 60
        while harness is None and time.monotonic() < deadline:
            children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children")
            pids = [int(pid) for pid in children.read_text().split()] if children.exists() else []
            pids += [int(pid) for task in Path(f"/proc/{parent.pid}/task").iterdir()
                     for pid in (task / "children").read_text().split()]
            harness = next(iter(pids), None)
            time.sleep(0.1)
        assert harness is not None, "the harness never started"
        parent.kill()  # the rollout process dies without any cleanup of its own
        parent.wait()
        deadline = time.monotonic() + 30
        while alive(harness) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(harness)
    finally:
        parent.kill()
        if harness is not None:
            try:
                os.killpg(harness, 9)
            except ProcessLookupError:
                pass
