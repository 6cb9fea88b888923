"""How `lego bench proxy` meters a server over a phase: its CPU time as it reads it, or the instructions valgrind's
callgrind counts; the warm-up is not metered."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Protocol

from lego.bench import BenchError


class Server(Protocol):
    """A bench process a meter reads: its name, its process, and its answers (`ask("cpu")`)."""

    name: str
    process: Any

    def ask(self, what: str, argument: Any = None) -> Any: ...


class CpuMeter:
    """A server's CPU time (every thread of its process) over a phase, as the server itself reads it."""

    key = "cpu_ms_per_call"

    def __init__(self) -> None:
        self._started: dict[str, float] = {}

    def executable(self, name: str) -> str | None:
        return None

    def start(self, server: Server) -> None:
        self._started[server.name] = server.ask("cpu")

    def stop(self, server: Server, label: str) -> float:
        return 1000 * (server.ask("cpu") - self._started.pop(server.name))


class Unmetered:
    """The warm-up's meter: nothing read, nothing switched (under callgrind, instrumentation stays off, and the
    two callgrind_control calls a phase are spared)."""

    key = "unmetered"

    def start(self, server: Server) -> None:
        pass

    def stop(self, server: Server, label: str) -> float:
        return 0.0


UNMETERED = Unmetered()


class InstructionMeter:
    """Instructions a server executes over a phase, every thread, counted by valgrind's callgrind: the server runs
    under it with instrumentation off, switched on (counters zeroed) at `start`, off and dumped at `stop`."""

    key = "instructions_per_call"
    TOOLS = ("valgrind", "callgrind_control")

    def __init__(self, directory: Path, keep_in: Path | None = None) -> None:
        missing = [tool for tool in self.TOOLS if shutil.which(tool) is None]
        if missing:
            raise BenchError(f"measure=instructions needs valgrind's callgrind ({', '.join(missing)} not "
                             "found): install valgrind (apt-get install valgrind) or measure cpu time (the default)")
        self.directory, self.keep_in = directory, keep_in
        python = sys.executable
        with open(python, "rb") as binary:
            if binary.read(2) == b"#!":  # a launcher script (pyenv's shim): valgrind would count the shell
                raise BenchError(f"{python} is a script, not the Python binary; run the bench with a virtual "
                                 "environment's or the installed interpreter")
        # PYTHONHASHSEED fixed: string hashes decide dict probe lengths, so a random seed moves the count a little
        self._wrapper = directory / "python-under-callgrind"
        self._wrapper.write_text(
            "#!/bin/sh\nPYTHONHASHSEED=0 exec valgrind --tool=callgrind --instr-atstart=no -q "
            f"--callgrind-out-file={shlex.quote(str(directory))}/callgrind.%p {shlex.quote(python)} \"$@\"\n")
        self._wrapper.chmod(0o755)

    def executable(self, name: str) -> str | None:
        return str(self._wrapper) if name in ("passthrough", "proxy") else None

    def _control(self, server: Server, *arguments: str) -> None:
        pid = str(server.process.pid)  # (the wrapper execs valgrind, which runs Python in its own process)
        try:
            done = subprocess.run(["callgrind_control", *arguments, pid], capture_output=True, text=True,
                                  timeout=300)
        except subprocess.TimeoutExpired:
            raise BenchError(f"callgrind_control {' '.join(arguments)} did not answer for the {server.name} "
                             "process within 300 s") from None
        if done.returncode != 0 or "OK" not in done.stdout:
            raise BenchError(f"callgrind_control {' '.join(arguments)} failed for the {server.name} process "
                             f"(valgrind needs ptrace to reach a waiting process): {done.stdout}{done.stderr}")

    def start(self, server: Server) -> None:
        self._control(server, "--zero")
        self._control(server, "--instr=on")

    def stop(self, server: Server, label: str) -> float:
        self._control(server, "--instr=off")
        self._control(server, "--dump")
        dumps = sorted(self.directory.glob(f"callgrind.{server.process.pid}.*"),
                       key=lambda path: int(path.suffix[1:]) if path.suffix[1:].isdigit() else -1)
        if not dumps:
            raise BenchError(f"callgrind wrote no dump for the {server.name} process in {self.directory}")
        text = dumps[-1].read_text(errors="replace")
        if self.keep_in is not None:
            self.keep_in.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(dumps[-1], self.keep_in / f"{server.name}-{label}.callgrind")
        for path in dumps:
            path.unlink()
        for line in text.splitlines():
            if line.startswith("totals:"):
                return float(line.split()[1])
        raise BenchError(f"callgrind's dump for the {server.name} process has no totals line")
