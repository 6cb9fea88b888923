"""Running a harness's launch: inside the sandbox (exec) or beside it (a host process), under its wall clock and
the turn guard, and collecting the transcripts it leaves."""

from __future__ import annotations

import asyncio
import contextlib
import glob as globlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from lego.child_process import ends_with_parent
from lego.harness.base import HarnessLaunch
from lego.rollout.guard import TurnGuard
from lego.sandbox import Sandbox, SandboxError

PID_FILE = "/tmp/.lego-harness.pid"
LOG_LIMIT = 256 * 1024  # harness output kept in Trajectory.harness_log


@dataclass
class HarnessRun:
    exit_code: int = -1
    output: str = ""
    timed_out: bool = False
    guard_tripped: bool = False
    started_at: float = 0.0
    duration_s: float = 0.0


async def _kill_in_sandbox(sandbox: Sandbox) -> None:
    script = (f"pid=$(cat {PID_FILE} 2>/dev/null) || exit 0; pgid=$(ps -o pgid= -p $pid | tr -d ' '); "
              f'[ -n "$pgid" ] && kill -9 -- -$pgid; kill -9 $pid 2>/dev/null; true')
    with contextlib.suppress(SandboxError):
        await asyncio.to_thread(sandbox.exec, script, 15, None, "/")


async def _watch_guard(guard: TurnGuard, kill, run: HarnessRun) -> None:
    await guard.tripped.wait()
    run.guard_tripped = True
    try:
        await kill()
    finally:
        guard.released.set()


async def run_in_sandbox(sandbox: Sandbox, launch: HarnessLaunch, timeout_s: float, workdir: str,
                         guard: TurnGuard) -> HarnessRun:
    run = HarnessRun(started_at=time.time())
    for path, data in launch.files.items():
        await asyncio.to_thread(sandbox.put_file, path, data)
    command = f"echo $$ > {PID_FILE}; {launch.command}"
    watcher = asyncio.create_task(_watch_guard(guard, lambda: _kill_in_sandbox(sandbox), run))
    clock = time.monotonic()
    try:
        result = await asyncio.to_thread(sandbox.exec, command, timeout_s, launch.env, workdir, LOG_LIMIT * 4)
    finally:
        watcher.cancel()
        guard.released.set()
    run.duration_s = time.monotonic() - clock
    run.exit_code, run.output, run.timed_out = result.exit_code, result.output, result.timed_out
    return run


async def run_beside(launch: HarnessLaunch, timeout_s: float, scratch: Path, guard: TurnGuard) -> HarnessRun:
    run = HarnessRun(started_at=time.time())
    for path, data in launch.files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data)
    process = await asyncio.create_subprocess_exec(
        "bash", "-c", launch.command, cwd=scratch, env={**os.environ, **launch.env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
        start_new_session=True,
        # forked by the thread that runs this batch's loop, which outlives the harness; if the process is killed,
        # the harness gets SIGTERM rather than running on with no proxy to answer it
        preexec_fn=ends_with_parent())

    async def kill() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)

    watcher = asyncio.create_task(_watch_guard(guard, kill, run))
    clock = time.monotonic()
    chunks: list[bytes] = []

    async def drain() -> None:
        assert process.stdout is not None
        size = 0
        while chunk := await process.stdout.read(65536):
            if size < LOG_LIMIT * 4:
                chunks.append(chunk)
                size += len(chunk)

    try:
        await asyncio.wait_for(asyncio.gather(drain(), process.wait()), timeout_s)
    except TimeoutError:
        run.timed_out = True
    finally:
        if process.returncode is None:
            await kill()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(process.wait(), 10)
        watcher.cancel()
        guard.released.set()
    run.duration_s = time.monotonic() - clock
    run.exit_code = process.returncode if process.returncode is not None else -9
    run.output = b"".join(chunks).decode("utf-8", errors="replace")
    return run


async def collect_transcripts(launch: HarnessLaunch, sandbox: Sandbox, beside: bool) -> dict[str, str]:
    found: dict[str, str] = {}
    for pattern in launch.transcripts:
        if beside:
            for path in sorted(globlib.glob(pattern)):
                found[path] = Path(path).read_text(errors="replace")
            continue
        listing = await asyncio.to_thread(sandbox.exec, f"ls -1d {pattern} 2>/dev/null || true", 30, None, "/")
        for path in listing.output.split():
            with contextlib.suppress(FileNotFoundError, SandboxError):
                data = await asyncio.to_thread(sandbox.get_file, path)
                found[path] = data.decode("utf-8", errors="replace")
    return found


def keep_transcripts(transcripts: dict[str, str], directory: Path | None) -> list[str]:
    if directory is None or not transcripts:
        return []
    directory.mkdir(parents=True, exist_ok=True)
    kept = []
    for index, (path, text) in enumerate(sorted(transcripts.items())):
        target = directory / f"{index:02d}-{Path(path).name}"
        target.write_text(text)
        kept.append(str(target))
    return kept
