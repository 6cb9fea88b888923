"""What `lego run` shows a person, and where the rest goes.

The terminal gets a line per stage (lego.pipeline.report), the bars of the long steps (on a terminal only) and the
closing summary. Everything else the process writes, Prefect's INFO lines, MLflow's, the libraries' warnings and
anything a child process prints, goes to the run's log file (<work>/runs/<run>/run.log), as plain lines: no ANSI
escapes, no carriage returns. The log also gets the stage lines and the summary, so it ends as the terminal does.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

# CSI sequences (colours, cursor moves), OSC sequences (titles, links), and two-byte escapes
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # everything but newline and tab, once \r is dealt with
QUIET_LIBRARIES = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' "Loading weights" and "Writing model shards" bars
    "TQDM_DISABLE": "1",  # any other tqdm bar
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}


def quiet_libraries() -> None:
    """Third-party progress bars and advisories off, for this process and its children (before those libraries
    are imported: they read the switches once)."""
    for name, value in QUIET_LIBRARIES.items():
        os.environ.setdefault(name, value)


def plain(text: str) -> str:
    """`text` as a log file should hold it: escapes dropped, a carriage return made a line end."""
    text = ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n")
    return CONTROL.sub("", text)


class PlainLog(io.TextIOBase):
    """A text stream appending plain lines to a file (see `plain`); thread-safe."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = open(path, "a", encoding="utf-8", errors="replace", buffering=1)
        self._lock = threading.Lock()
        self.raw_fd: int | None = None  # where raw writers go (the pump's pipe, while one runs)

    def write(self, text: str) -> int:
        # After the run (closed), late writers are dropped: Prefect's exit hook stops its temporary server with
        # a log line, and the log must end with the run's summary.
        with self._lock:
            if not self._file.closed:
                self._file.write(plain(text))
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.flush()

    def fileno(self) -> int:
        return self.raw_fd if self.raw_fd is not None else self._file.fileno()

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        with self._lock:
            self._file.close()


class _FdPump:
    """A pipe standing in for file descriptors 1 and 2, drained into a `PlainLog` by a thread: what child
    processes write there raw (bars redrawn with carriage returns, colours) reaches the log as plain lines too.
    Text is passed on a line at a time, so an escape sequence split between two reads is still recognised."""

    def __init__(self, log: PlainLog) -> None:
        self.log = log
        self.read_fd, self.write_fd = os.pipe()
        self._synced = threading.Event()
        self._thread = threading.Thread(target=self._drain, name="lego-run-log", daemon=True)
        self._thread.start()

    SYNC = b"\x00lego-run-log-sync\x00"

    def _drain(self) -> None:
        pending = b""
        while chunk := os.read(self.read_fd, 65536):
            pending += chunk
            if self.SYNC in pending:
                before, _, after = pending.partition(self.SYNC)
                self.log.write(before.decode("utf-8", errors="replace"))
                pending = after
                self._synced.set()
            cut = max(pending.rfind(b"\n"), pending.rfind(b"\r"))
            if cut >= 0:
                self.log.write(pending[:cut + 1].decode("utf-8", errors="replace"))
                pending = pending[cut + 1:]
        if pending:
            self.log.write(pending.decode("utf-8", errors="replace"))

    def sync(self, wait_s: float = 5.0) -> None:
        """Wait until what was written to the pipe so far is in the log, so a line written after it stays after."""
        self._synced.clear()
        os.write(self.write_fd, self.SYNC)
        self._synced.wait(wait_s)

    def close(self, wait_s: float = 5.0) -> None:
        """Stop taking writes (fds 1 and 2 are restored first). Everything written so far is in the log once the
        sync mark comes through; a child that outlives the run (a private engine's watchdog) still holds the pipe,
        so its later lines are left unread rather than the run waiting for the pipe's end."""
        self.sync(wait_s)
        os.close(self.write_fd)
        self._thread.join(0.5)
        if not self._thread.is_alive():
            os.close(self.read_fd)


class _TerminalHandler(logging.Handler):
    def __init__(self, console: Console) -> None:
        super().__init__()
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.console.print(self.format(record), markup=False, highlight=False, soft_wrap=True)
        except Exception:  # a closed terminal must not fail the run
            self.handleError(record)


@dataclass
class RunOutput:
    terminal: Console  # the person's terminal (a plain stream when stdout is not one)
    log: PlainLog
    pump: _FdPump

    def echo(self, text: str = "", style: str | None = None) -> None:
        """A line for the person, also kept in the log (after what child processes wrote before it)."""
        self.pump.sync()
        self.terminal.print(text, style=style, markup=False, highlight=False, soft_wrap=True)
        self.log.write(text + "\n")


@contextlib.contextmanager
def run_output(log_path: Path, stage_logger: str) -> Iterator[RunOutput]:
    """Send this process's stdout and stderr (Python's streams and file descriptors 1 and 2, so child processes
    too) to `log_path`, the lines of `stage_logger` to the terminal and the log; undone on exit. Call it before
    Prefect or MLflow is imported: their log handlers keep the stream they find at set-up."""
    quiet_libraries()
    sys.stdout.flush()
    sys.stderr.flush()
    log = PlainLog(log_path)
    terminal_stream = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1, encoding="utf-8", errors="replace")
    saved_fds = (os.dup(1), os.dup(2))
    saved_streams = (sys.stdout, sys.stderr)
    terminal = Console(file=terminal_stream, highlight=False)
    logger = logging.getLogger(stage_logger)
    handlers = [_TerminalHandler(terminal), logging.StreamHandler(log)]
    handlers[1].setFormatter(logging.Formatter("%(asctime)s | %(name)s | %(message)s", "%H:%M:%S"))
    pump = _FdPump(log)
    log.raw_fd = pump.write_fd
    os.dup2(pump.write_fd, 1)
    os.dup2(pump.write_fd, 2)
    sys.stdout = sys.stderr = log
    for handler in handlers:
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield RunOutput(terminal, log, pump)
    except BaseException:
        logging.getLogger("lego").exception("the run stopped")
        raise
    finally:
        for handler in handlers:
            logger.removeHandler(handler)
        sys.stdout, sys.stderr = saved_streams
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
        for fd in saved_fds:
            os.close(fd)
        pump.close()
        log.raw_fd = None
        log.flush()
        terminal_stream.flush()
        terminal_stream.close()
        log.close()
