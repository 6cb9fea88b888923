"""Progress of a run's long steps (rollouts stored, rollouts graded), as `lego run` and `lego stage` show it.

On a terminal: a rich progress bar per step (done of planned, elapsed time, counts by termination or outcome kind).
Elsewhere (a log file, CI, a scheduled deployment): a compact line through the run's logger, e.g.
`rollout/0: 12/24 done (completed 10, timeout 2)`, each time another tenth of the step is done or `every_s` seconds
passed with something new, and once when the step ends: never a line per rollout. Either way the step's last line
goes to the log, so Prefect's flow-run logs keep each step's final counts.

The stages report through `StageContext.progress` (the lego.pipeline.artifacts.ProgressBoard protocol); this
module is the pipeline run's implementation, kept out of the stages' import closure so that changing how progress looks changes
no stage's content key (lego.pipeline.keys). The rollout and verify stages' shards may run in other processes (Ray):
their progress is counted from the rollouts and outcomes they store (`StoredRecords`), not told.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from lego.errors import LegoError
from lego.pipeline.artifacts import StageProgress
from lego.pipeline.stored import kind_counts, read_kinds

if TYPE_CHECKING:
    from rich.console import Console

LINE_FRACTION = 0.1  # a line each time this share of the step is done
LINE_EVERY_S = 30.0  # ... or after this long with something new
POLL_S = 2.0  # how often a fanned-out stage's stored records are counted
KIND_COLUMN = {"rollouts": "termination", "outcomes": "kind"}  # what a stored record is counted by
STALL_WORDS = {"rollouts": ("rollout", "stored"), "outcomes": ("verify", "graded")}  # a stalled stage, its verb

_terminal: list[Console] = []  # where runs of this process draw their bars (show_progress_on)


def show_progress_on(console: Console | None) -> None:
    """Draw the bars of runs started in this process on `console` (`lego run` passes the person's terminal while
    its own stdout goes to the run's log; a console that is no terminal gets no bars: lines go to the run's log).
    None: back to stdout."""
    _terminal.clear()
    if console is not None:
        _terminal.append(console)


def progress_line(label: str, done: int, total: int, verb: str, counts: Mapping[str, int]) -> str:
    text = f"{label}: {done}/{total} {verb}"
    if counts:
        text += " (" + ", ".join(f"{kind} {count}" for kind, count in sorted(counts.items())) + ")"
    return text


class StepProgress:
    """One step's counts; reports to its board's bar or as lines (see the module docstring). Thread-safe."""

    def __init__(self, board: RunProgress, label: str, total: int, done: int, counts: Mapping[str, int],
                 verb: str) -> None:
        self.board = board
        self.label = label
        self.total = total
        self.done = done
        self.counts = dict(counts)
        self.verb = verb
        self.finished = False
        self.lock = threading.Lock()
        self.step = max(1, math.ceil(total * board.every_fraction))
        self.next_mark = (done // self.step + 1) * self.step
        self.last_line_done = done
        self.last_line_at = board.clock()
        self.task_id = board.add_bar(self) if board.live else None

    def line(self) -> str:
        return progress_line(self.label, self.done, self.total, self.verb, self.counts)

    def advance(self, kind: str) -> None:
        with self.lock:
            self.done += 1
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self._changed()

    def update(self, done: int, counts: Mapping[str, int]) -> None:
        with self.lock:
            if done == self.done and dict(counts) == self.counts:
                return
            self.done, self.counts = done, dict(counts)
            self._changed()

    def finish(self) -> None:
        with self.lock:
            if self.finished:
                return
            self.finished = True
            if self.task_id is not None:
                self.board.refresh_bar(self)
            if self.task_id is not None or self.last_line_done != self.done or self.done == 0:
                self.board.log(self.line())

    def _changed(self) -> None:
        if self.finished:
            return
        if self.task_id is not None:
            self.board.refresh_bar(self)
            return
        now = self.board.clock()
        due = self.done >= self.next_mark or self.done >= self.total
        if not due and now - self.last_line_at < self.board.every_s:
            return
        self.board.log(self.line())
        self.last_line_done, self.last_line_at = self.done, now
        self.next_mark = (self.done // self.step + 1) * self.step


class RunProgress:
    """The steps of one run (the lego.pipeline.artifacts.ProgressBoard protocol). `live`: rich bars on stdout
    (default: when stdout is a terminal), else lines through `log`."""

    def __init__(self, log: Callable[[str], None], *, live: bool | None = None,
                 every_fraction: float = LINE_FRACTION, every_s: float = LINE_EVERY_S,
                 clock: Callable[[], float] = time.monotonic, console: Console | None = None) -> None:
        self.log = log
        # `show_progress_on`'s terminal is not this process's stdout (that goes to the run's log): its bars leave
        # sys.stdout and sys.stderr alone. Otherwise rich prints what they get above the bars.
        on_terminal = console is None and bool(_terminal)
        self.redirect = not on_terminal
        console = _terminal[0] if on_terminal else console
        self.live = (console.is_terminal if console is not None else sys.stdout.isatty()) if live is None else live
        self.console = console  # where the bars go (rich's default: stdout)
        self.every_fraction = every_fraction
        self.every_s = every_s
        self.clock = clock
        self.lock = threading.Lock()
        self._bars = None  # rich.progress.Progress, started with the first step
        self._rerouted: list[Callable[[], None]] = []  # undoes _route_log_handlers_above_bars

    def start(self, label: str, total: int, *, done: int = 0, counts: Mapping[str, int] | None = None,
              verb: str = "done") -> StepProgress:
        return StepProgress(self, label, total, done, counts or {}, verb)

    def add_bar(self, step: StepProgress) -> int:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with self.lock:
            if self._bars is None:
                self._bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.fields[verb]}"), TimeElapsedColumn(),
                                      TextColumn("{task.fields[counts]}"), console=self.console,
                                      redirect_stdout=self.redirect, redirect_stderr=self.redirect)
                self._bars.start()
                self._rerouted = _route_log_handlers_above_bars() if self.redirect else []
            return self._bars.add_task(step.label, total=step.total, completed=step.done, verb=step.verb,
                                       counts=_counts_text(step.counts))

    def refresh_bar(self, step: StepProgress) -> None:
        if self._bars is not None and step.task_id is not None:
            self._bars.update(step.task_id, completed=step.done, counts=_counts_text(step.counts))

    def close(self) -> None:
        with self.lock:
            if self._bars is not None:
                for restore in self._rerouted:
                    restore()
                self._rerouted = []
                self._bars.stop()
                self._bars = None


def _route_log_handlers_above_bars() -> list[Callable[[], None]]:
    """While the bars are live, rich prints what is written to sys.stdout/sys.stderr above them; logging handlers
    (Prefect's console handler among them) hold the terminal streams they were configured with and would write
    through the bars. Point those at rich's proxies; returns how to undo it."""
    from rich.console import Console
    from rich.file_proxy import FileProxy

    proxies = {id(proxy.rich_proxied_file): proxy for proxy in (sys.stdout, sys.stderr) if isinstance(proxy, FileProxy)}
    if not proxies:
        return []
    undo: list[Callable[[], None]] = []
    loggers = [logging.getLogger(), *(logger for logger in logging.Logger.manager.loggerDict.values()
                                      if isinstance(logger, logging.Logger))]
    for handler in {id(h): h for logger in loggers for h in logger.handlers}.values():
        stream = getattr(handler, "stream", None)
        if isinstance(handler, logging.StreamHandler) and id(stream) in proxies:
            handler.stream = proxies[id(stream)]
            undo.append(lambda handler=handler, stream=stream: setattr(handler, "stream", stream))
        console = getattr(handler, "console", None)  # a rich handler prints through a Console of its own
        if isinstance(console, Console) and id(console.file) in proxies:
            original = console.file
            console.file = proxies[id(original)]
            undo.append(lambda console=console, original=original: setattr(console, "file", original))
    return undo


def _counts_text(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{kind} {count}" for kind, count in sorted(counts.items()))


class StoredRecords:
    """The records of `wanted` rollouts stored so far in one data directory (<data>/<run>/<stage>/iter=<n>), by
    kind: trajectories (`rollouts` files, by termination) or outcomes (`outcomes` files, by outcome kind). Each
    complete file is read once (two columns), whichever process wrote it."""

    def __init__(self, directory: Path, wanted: Iterable[str], table: str = "rollouts") -> None:
        if table not in KIND_COLUMN:
            raise ValueError(f"table {table!r}: counted are {sorted(KIND_COLUMN)}")
        self.directory = Path(directory)
        self.wanted = set(wanted)
        self.table = table
        self.seen: set[Path] = set()
        self.kinds: dict[str, str] = {}

    def poll(self) -> tuple[int, dict[str, int]]:
        # the writer renames a finished file into place: the glob never sees a partial one
        new = sorted(path for path in self.directory.glob(f"{self.table}-*.parquet") if path not in self.seen)
        found = read_kinds(new, KIND_COLUMN[self.table])
        self.kinds.update({rollout: kind for rollout, kind in found.items() if rollout in self.wanted})
        self.seen.update(new)
        return len(self.kinds), kind_counts(self.kinds.values())


class StageStalledError(LegoError):
    """A stage's shards stored nothing for longer than `pipeline.stall_timeout_s` while still running."""


def follow(progress: StageProgress, counter: StoredRecords, wait: Callable[[float], bool],
           poll_s: float = POLL_S, stall_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
    """Count what is stored every `poll_s` until `wait(timeout)` says the work is over (True), then finish.

    A shard on a node that vanished without closing its connections (power lost, link cut) can look alive to the
    driver for ever. Progress is what the shards store, so when nothing new is stored for `stall_s` seconds the
    stage stops waiting and raises; what was stored stays, and a rerun of the stage runs only what is missing."""
    stage, verb = STALL_WORDS[counter.table]
    try:
        last_done, last_change = None, clock()
        while True:
            over = wait(poll_s)
            done, counts = counter.poll()
            progress.update(done, counts)
            if over:
                return
            if done != last_done:
                last_done, last_change = done, clock()
            elif stall_s is not None and clock() - last_change > stall_s:
                raise StageStalledError(
                    f"{done} of {len(counter.wanted)} rollouts {verb} and none for {stall_s:.0f} s while shards are "
                    "still running: a worker node may be lost or a shard hung. What is stored is kept; check "
                    f"the cluster (`ray status`) and rerun the stage (`lego stage {stage} --from RUN`) to run only "
                    "the missing ones, or raise pipeline.stall_timeout_s if they legitimately take longer")
    finally:
        progress.finish()
