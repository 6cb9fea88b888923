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
        return self._file.fileno()

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        with self._lock:
            self._file.close()


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

    def echo(self, text: str = "", style: str | None = None) -> None:
        """A line for the person, also kept in the log."""
        self.terminal.print(text, style=style, markup=False, highlight=False, soft_wrap=True)
        self.log.write(text + "\n")


@contextlib.contextmanager
def run_output(log_path: Path, stage_logger: str) -> Iterator[RunOutput]:
    """Send this process's stdout and stderr (Python's streams and file descriptors 1 and 2, so child processes
    too) to `log_path`, the lines of `stage_logger` to the terminal and the log; undone on exit. Call it before
    Prefect or MLflow is imported: their log handlers keep the stream they find at set-up."""
    for name, value in QUIET_LIBRARIES.items():
        os.environ.setdefault(name, value)
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
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    for handler in handlers:
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield RunOutput(terminal, log)
    except BaseException:
        logging.getLogger("lego").exception("the run stopped")
        raise
    finally:
        for handler in handlers:
            logger.removeHandler(handler)
        log.flush()
        sys.stdout, sys.stderr = saved_streams
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
        for fd in saved_fds:
            os.close(fd)
        terminal_stream.flush()
        terminal_stream.close()
        log.close()
