"""SIGTERM stops a run the way Ctrl-C does, with the same cleanup.

Service managers and schedulers (systemd, `docker stop`, Kubernetes, Slurm) stop a process with SIGTERM and, after
a grace period, SIGKILL. Under Prefect a SIGTERM raises Prefect's TerminationSignal in the main thread, which then
waits for the stage's worker threads to finish; a rollout batch running there went on sampling for as long as it
had attempts left. A Python handler cannot reach that thread, and Prefect replaces the handler of the main thread
for every flow run anyway. What survives both is the interpreter's wakeup file descriptor: the C-level handler
writes every signal it catches there, whichever Python handler is installed. `stop_on_sigterm` reads it in a
thread of its own and sets `STOP`; `run_until_terminated` cancels its batch when `STOP` is set (each attempt's
cleanup closes its sandbox and its harness) and raises `Terminated`, which ends the worker's task so that the
main thread can unwind and run the command's own cleanup.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

STOP = threading.Event()  # set once the process was asked to stop (SIGTERM); never cleared
_POLL_S = 0.5
_WIND_DOWN_S = 120.0  # how long a stop waits for cancelled attempts to clean up


class Terminated(KeyboardInterrupt):
    """The process was asked to stop (SIGTERM); raised where Ctrl-C's KeyboardInterrupt would be."""


def _raise_terminated(signum: int, frame: object) -> None:
    STOP.set()
    raise Terminated(f"stopped by {signal.Signals(signum).name}")


def _watch(reader: socket.socket) -> None:
    while data := reader.recv(64):
        if signal.SIGTERM in data:
            STOP.set()


def stop_on_sigterm() -> None:
    """From the main thread of a command: SIGTERM raises Terminated there, as Ctrl-C raises KeyboardInterrupt, so
    the command's cleanup runs (its servers, its Docker engine, its temporary files), and sets STOP for the
    batches running in other threads."""
    signal.signal(signal.SIGTERM, _raise_terminated)
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(reader,), name="lego-sigterm", daemon=True).start()
    _keep.extend((reader, writer))  # the descriptors live as long as the process


_keep: list[socket.socket] = []


async def _wind_down() -> None:
    """Wait for every cancelled task to finish its cleanup. A gather cancelled with its attempts ends once the first
    attempt has unwound; asyncio.run would then cancel the others' cleanups (their shielded sandbox closes) a second
    time. Tasks nobody cancelled are left to asyncio.run."""
    current, deadline = asyncio.current_task(), asyncio.get_running_loop().time() + _WIND_DOWN_S
    while winding := [task for task in asyncio.all_tasks() if task is not current and task.cancelling()]:
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:  # a cleanup that swallowed its cancellation: asyncio.run cancels it again
            return
        await asyncio.wait(winding, timeout=left)


def run_until_terminated(coroutine: Coroutine[Any, Any, T], stop: threading.Event = STOP) -> T:
    """asyncio.run(coroutine), cancelled as a whole once `stop` is set; then Terminated is raised."""
    if stop.is_set():
        coroutine.close()
        raise Terminated("stopped by SIGTERM before the batch started")

    async def until_stopped() -> T:
        work = asyncio.ensure_future(coroutine)
        while not work.done():
            await asyncio.wait({work}, timeout=_POLL_S)
            if stop.is_set() and not work.done():
                work.cancel("SIGTERM")
                await asyncio.gather(work, return_exceptions=True)
                await _wind_down()
                raise Terminated("stopped by SIGTERM")
        return work.result()

    return asyncio.run(until_stopped())
