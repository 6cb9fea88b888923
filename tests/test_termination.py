"""SIGTERM stops a run as Ctrl-C does (lego/termination.py). `lego run` killed with SIGTERM (what systemd, docker
stop, Kubernetes and Slurm send) went on sampling: Prefect turned the signal into an exception in the main thread,
which then waited for the rollout batch in a worker thread to run out of attempts."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lego import REPO_ROOT
from lego.termination import Terminated, run_until_terminated


async def _batch(started: threading.Event, closed: list[int], attempts: int = 3) -> str:
    running: list[int] = []

    async def attempt(index: int) -> None:
        try:
            running.append(index)
            if len(running) == attempts:  # the stop comes once every attempt holds something to clean up
                started.set()
            await asyncio.sleep(300)
        finally:  # an attempt's cleanup, shielded from the cancellation; the attempts take different times
            await asyncio.shield(close(index))

    async def close(index: int) -> None:  # as a sandbox closes: a wait on the engine, then a call in a thread
        await asyncio.sleep(0.2 * index)
        await asyncio.to_thread(closed.append, index)

    async def all_attempts() -> str:
        await asyncio.gather(*(attempt(i) for i in range(attempts)))
        return "finished"

    return await all_attempts()


def test_a_stop_cancels_the_batch_in_a_worker_thread_after_every_attempt_cleaned_up():
    """A gather cancelled with its attempts ends once the first of them has unwound; the others' cleanups must
    still run to their end, not be cancelled a second time when the event loop closes."""
    stop, started, closed, raised = threading.Event(), threading.Event(), [], []

    def worker() -> None:
        try:
            run_until_terminated(_batch(started, closed), stop)
        except Terminated as exc:
            raised.append(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    assert started.wait(30)
    stop.set()
    thread.join(60)
    assert not thread.is_alive()
    assert len(raised) == 1 and sorted(closed) == [0, 1, 2]


def test_without_a_stop_the_batch_returns_its_result():
    async def quick() -> str:
        await asyncio.sleep(0.01)
        return "done"

    assert run_until_terminated(quick(), threading.Event()) == "done"
    stopped = threading.Event()
    stopped.set()
    with pytest.raises(Terminated):  # asked to stop before it started: nothing runs
        run_until_terminated(quick(), stopped)


STAGE = """
import asyncio, pathlib, sys, threading
from lego.pipeline.prefect_env import configure_prefect_env
from lego.workdir import WorkDir
out = pathlib.Path(sys.argv[1])
configure_prefect_env(WorkDir(out / "work"))
from prefect import flow, task
from prefect.task_runners import ThreadPoolTaskRunner
from lego.termination import run_until_terminated, stop_on_sigterm

running = []

async def attempt(index):
    try:
        running.append(index)
        if len(running) == 2:  # the signal comes once both attempts hold something to clean up
            (out / "started").write_text("")
        await asyncio.sleep(300)
    finally:
        (out / f"closed-{index}").write_text("")

async def batch():
    await asyncio.gather(*(attempt(i) for i in range(2)))

@task
def rollout():
    run_until_terminated(batch())

@flow(task_runner=ThreadPoolTaskRunner(max_workers=2))
def stage():
    rollout.submit().result()

if sys.argv[2] == "stop_on_sigterm":
    stop_on_sigterm()
try:
    stage()
except KeyboardInterrupt as exc:
    (out / "outcome").write_text(type(exc).__name__)
    raise
"""


def _start_stage(tmp_path: Path, mode: str) -> subprocess.Popen:
    out = tmp_path / mode
    out.mkdir()
    process = subprocess.Popen([sys.executable, "-c", STAGE, str(out), mode], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                               start_new_session=True)  # its own group: the Prefect server it starts goes with it
    return process


def _wait_started(tmp_path: Path, mode: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 180
    while not (tmp_path / mode / "started").exists():
        assert process.poll() is None, process.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "the stage's batch never started"
        time.sleep(0.2)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_stops_a_prefect_stage_whose_batch_runs_in_a_worker_thread(tmp_path):
    control, stopped = _start_stage(tmp_path, "plain"), _start_stage(tmp_path, "stop_on_sigterm")
    try:
        _wait_started(tmp_path, "plain", control)
        _wait_started(tmp_path, "stop_on_sigterm", stopped)
        control.send_signal(signal.SIGTERM)
        stopped.send_signal(signal.SIGTERM)
        stopped.wait(120)
        assert stopped.returncode is not None, "SIGTERM did not stop the stage"
        out = tmp_path / "stop_on_sigterm"
        assert sorted(p.name for p in out.glob("closed-*")) == ["closed-0", "closed-1"]  # every attempt cleaned up
        assert (out / "outcome").read_text() == "Terminated"
        deadline = time.monotonic() + 60
        while _group_alive(stopped.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _group_alive(stopped.pid)  # the Prefect server it started ended with it
        # the control, with Prefect's own handling only: the same SIGTERM leaves the batch sampling
        assert control.poll() is None and not list((tmp_path / "plain").glob("closed-*"))
    finally:
        for process in (control, stopped):
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
