"""A rollout worker's forkserver for a Python harness run beside the sandbox (runners/forkserver.py): one server per
worker imports the harness's heavy third-party modules once, and each rollout's harness is a fork of it.

mini-swe-agent spends about 3 s of CPU importing LiteLLM before its first model call; on 2 cores, with two
rollouts at once, that was a third of each rollout's wall time (docs/benchmarks.md, rollout throughput). The harness
itself is unchanged: its own modules are imported in each fork, after the rollout's environment is set.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from lego.child_process import ends_with_parent
from lego.harness.base import HarnessError

SERVER = Path(__file__).parent / "runners" / "forkserver.py"
RUNTIME_FILES = (SERVER,)
READY_TIMEOUT_S = 120.0


class ForkserverError(HarnessError):
    """The forkserver of a harness could not start (its venv cannot import what it preloads)."""


@dataclass
class Forkserver:
    """A started server: `command` runs a script through it."""

    socket: str
    python: Path
    process: subprocess.Popen
    directory: str

    def command(self, script: Path, *args: str | Path) -> str:
        """The shell command that runs `python script args...` as a fork of the server (a cold start if it is gone)."""
        parts = (self.python, "-I", "-S", SERVER, "run", self.socket, script, *args)
        return "exec " + " ".join(shlex.quote(str(part)) for part in parts)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def start_forkserver(python: Path, modules: tuple[str, ...], env: dict[str, str]) -> Forkserver:
    """Start the server in `python` (a harness venv's) importing `modules` under `env` (what every rollout's harness
    environment shares), and wait until it serves. Start it from the thread that outlives the rollouts: it ends when
    that thread does."""
    directory = tempfile.mkdtemp(prefix="lego-forkserver-")
    os.chmod(directory, 0o700)  # the socket runs code as this user: only this user may reach it
    socket_path = os.path.join(directory, "harness.sock")
    process = subprocess.Popen(
        [str(python), str(SERVER), "serve", socket_path, *modules], env={**os.environ, **env}, cwd=directory,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, preexec_fn=ends_with_parent())
    starter = Forkserver(socket=socket_path, python=python, process=process, directory=directory)
    lines: list[str] = []

    def read_until_ready() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if line.strip() == "ready":
                return

    reader = threading.Thread(target=read_until_ready, daemon=True)
    reader.start()
    reader.join(READY_TIMEOUT_S)
    if not lines or lines[-1].strip() != "ready":
        code = None
        if not reader.is_alive():  # its output ended: it exited
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = process.wait(10)
        starter.stop()
        output = "".join(lines)[-2000:] or "(no output)"
        what = f"exited with {code}" if code is not None else f"did not start within {READY_TIMEOUT_S:.0f} s"
        raise ForkserverError(f"the forkserver of {python} importing {', '.join(modules)} {what}: {output}\n"
                              "Reinstall the harness (delete its directory under ~/.cache/lego/harness and run "
                              "`lego setup`), or set harness.forkserver: false.")
    return starter
