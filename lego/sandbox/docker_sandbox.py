"""The Docker sandbox backend.

One container per rollout (and a fresh one per grading) from the task image. The container has no
network (network mode none), CPU, memory and pids limits, a read-only root file system, and the
repository on a size-capped tmpfs copied from the image's pristine snapshot at start, so an agent can
neither fill the host's disk nor write outside the repo, its home and /tmp. Every exec has a wall-clock
timeout and an output cap. Containers carry labels naming their owner process: they are removed on
close, on exceptions and signals, and stale ones (owner dead) are reaped when a factory starts.

Two unprivileged users, and no root: the container's main process (docker-init + `sleep infinity`) and
Lego's own helpers (the proxy relay) run as KEEPER_UID; every exec (the agent, the tests, the verifier)
runs as AGENT_UID unless told otherwise. Both are numeric uids without /etc/passwd entries. The agent owns
the repository, its home (AGENT_HOME) and what it writes to /tmp, and nothing else: it cannot signal the
keeper's processes, so it can neither stop the container nor kill or replace the relay. All capabilities
are dropped and no-new-privileges is set, so no setuid binary in a task image gives any of them back.

A sandbox can be opened with a last command (LastCommand: what grading runs last, a Harbor test.sh). Its main
process is then a gate, as the agent, that waits on a FIFO and, at DockerSandbox.run_last_command, replaces itself
with the command: the command is the init of the container's PID namespace, and when it exits the kernel kills
every other process in the container before the exit is reported. Nothing the command left running can act after
it, which no kill issued afterwards could promise (a process can write in the time a kill takes to arrive). What
must outlive the container goes through a scratch volume (DockerSandboxFactory.scratch_volume) that a second
sandbox, out of the command's reach, also mounts.
"""

from __future__ import annotations

import atexit
import base64
import logging
import os
import re
import shlex
import signal
import socket
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import docker
import requests
from docker.errors import APIError, DockerException, NotFound

from lego.config import SandboxConfig
from lego.errors import tail
from lego.sandbox import SNAPSHOT, ContainerDied, ExecOutputLost, ExecResult, SandboxError
from lego.sandbox.exec_stream import ExecStream, run_exec

if TYPE_CHECKING:
    from lego.tasksets.task import Task

log = logging.getLogger(__name__)
LABEL = "lego.sandbox"
AGENT_UID = 1000  # runs every exec by default: the harness, its tool calls, the tests, the verifier
KEEPER_UID = 1001  # runs the container's main process and the proxy relay: out of the agent's reach
AGENT_USER = f"{AGENT_UID}:{AGENT_UID}"
KEEPER_USER = f"{KEEPER_UID}:{KEEPER_UID}"
AGENT_HOME = "/home/agent"  # the agent's writable home (a tmpfs it owns); HOME in every exec
PROXY_MOUNT = "/lego-proxy"  # where the rollout's own proxy socket directory is mounted, read-only
_OPEN: weakref.WeakSet[DockerSandbox] = weakref.WeakSet()
GATE = "/tmp/.lego-last-command"  # the FIFO a last-command sandbox's main process waits on
# The main process of a last-command sandbox: wait for the go, then become the command (exec keeps pid 1).
GATE_SCRIPT = 'mkfifo -m 600 "$0" && read go < "$0" && rm -f "$0" && cd "$1" && shift && exec "$@"'
RELAY_LOG = "/tmp/.lego-relay.log"  # written by the keeper: the agent can read it, not change it
KEEP_ENV = "LEGO_KEEP=1"  # in a process's environment: Lego's own (the proxy relay), spared by reclaim
# SIGKILL every process but init, the container's `sleep infinity`, Lego's own and this one, until none is
# left: what a fork bomb or stray background jobs leave behind. One process, so it needs one free pid. It runs
# as the agent: processes of other users (the keeper's) are spared, it could not signal them anyway.
RECLAIM = f"""
import os, signal
me = os.getpid()
uid = os.getuid()
def spare(pid):
    try:
        if os.stat(f"/proc/{{pid}}").st_uid != uid:
            return True
        with open(f"/proc/{{pid}}/stat", "rb") as f:
            if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                return True
        with open(f"/proc/{{pid}}/environ", "rb") as f:
            env = f.read()
        with open(f"/proc/{{pid}}/cmdline", "rb") as f:
            cmd = f.read()
    except (OSError, IndexError):
        return True
    return pid in (1, me) or b"{KEEP_ENV}" in env or cmd == b"sleep\\0infinity\\0"
for _ in range(200):
    victims = [int(p) for p in os.listdir("/proc") if p.isdigit() and not spare(int(p))]
    if not victims:
        break
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
print("reclaimed")
"""


def _close_all() -> None:
    for sandbox in list(_OPEN):
        sandbox.close()


def _on_signal(signum, frame):  # noqa: ARG001
    _close_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


atexit.register(_close_all)
_handlers_installed = False


def _install_signal_handlers() -> None:
    global _handlers_installed
    if _handlers_installed or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _on_signal)
    _handlers_installed = True


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _owner_alive(labels: dict[str, str], host: str) -> bool:
    owner = int(labels.get("lego.owner_pid", "0") or 0)
    return labels.get("lego.host") == host and bool(owner) and _pid_alive(owner)


def _remove_container(client: docker.DockerClient, container_id: str, wait_s: float = 60.0) -> None:
    """Remove a container and return once it is gone. Another process (a second reaper, or its owner closing it)
    may be removing it at the same time: the engine then answers 409 "already in progress", and this waits for
    that removal instead of failing."""
    try:
        client.api.remove_container(container_id, force=True)
        return
    except NotFound:
        return
    except APIError as error:
        if error.status_code != 409:
            raise
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            client.api.inspect_container(container_id)
        except NotFound:
            return
        time.sleep(0.2)
    raise SandboxError(f"container {container_id[:12]} is still being removed after {wait_s:.0f} s; "
                       "check the Docker engine (`docker ps -a`) and remove it by hand")


def reap_stale_containers(client: docker.DockerClient) -> list[str]:
    """Remove sandboxes, and then scratch volumes, whose owner process (on this host) is gone. Returns the
    sandboxes' names."""
    reaped = []
    host = socket.gethostname()
    # The low-level list reads every container's labels in one call; the high-level one inspects each container
    # after listing, and a sandbox that another process closes in between would fail the whole reap (NotFound).
    for container in client.api.containers(all=True, filters={"label": LABEL}):
        if _owner_alive(container.get("Labels") or {}, host):
            continue
        _remove_container(client, container["Id"])
        reaped.append((container.get("Names") or [container["Id"]])[0].lstrip("/"))
    for volume in client.api.volumes(filters={"label": LABEL}).get("Volumes") or []:
        if not _owner_alive(volume.get("Labels") or {}, host):
            try:
                client.api.remove_volume(volume["Name"])
            except (NotFound, APIError):  # gone already, or still mounted by a container: the next reap takes it
                pass
    return reaped


@dataclass(frozen=True)
class LastCommand:
    """What a sandbox ends with: `argv`, run as the agent from `workdir` with `env` added to the container's, as
    the init of the container's PID namespace (see the module docstring). Its output (stdout and stderr) is kept
    in the container's log, the last `output_limit` bytes at most."""

    argv: tuple[str, ...]
    workdir: str
    env: dict[str, str] = field(default_factory=dict)
    output_limit: int = 4 << 20


def _without_end_line(raw: bytes, end: bytes) -> tuple[bool, bytes]:
    """(whether the exec's end line came back, the output without it). The last one counts: a process the command
    left in the background may still write after it."""
    found = list(re.finditer(re.escape(end) + rb"-?\d+", raw))
    if not found:
        return False, raw
    return True, raw[:found[-1].start()] + raw[found[-1].end():]


class LastCommandError(SandboxError):
    """A sandbox's last command could not be started (the gate never came up, or it was run already)."""


def diff_script(tree: str, cap: int) -> str:
    """The shell script that writes `tree`'s changes against the snapshot as a patch in a scratch GIT_DIR and
    prints `LEGO_DIFF_OK <size>` and the patch base64-encoded, `LEGO_DIFF_TOO_LARGE <size>` past `cap` bytes, or
    `LEGO_DIFF_FAILED <step>` (see DockerSandbox.diff for why each setting is there)."""
    resets = ("!text !eol !crlf !filter !ident !working-tree-encoding !diff !merge !whitespace !delta "
              "!export-ignore !export-subst")
    return f"""
set -u
S=$(mktemp -d /tmp/.lego-diff.XXXXXXXXXX) || {{ echo LEGO_DIFF_FAILED mktemp; exit 90; }}
trap 'rm -rf "$S"' EXIT
G={SNAPSHOT}/.git
mkdir -p "$S/git/objects/info" "$S/git/refs" "$S/git/info" "$S/home" || {{ echo LEGO_DIFF_FAILED mkdir; exit 90; }}
git_() {{ env -i PATH=/usr/bin:/bin HOME="$S/home" XDG_CONFIG_HOME="$S/home" LC_ALL=C GIT_CONFIG_NOSYSTEM=1 \\
  GIT_CONFIG_GLOBAL=/dev/null GIT_TERMINAL_PROMPT=0 GIT_OPTIONAL_LOCKS=0 "$@"; }}
base=$(git_ /usr/bin/git --git-dir="$G" rev-parse --verify 'HEAD^{{commit}}' 2>"$S/err") || {{ echo LEGO_DIFF_FAILED base; cat "$S/err"; exit 91; }}
echo "$base" > "$S/git/HEAD"
echo "$G/objects" > "$S/git/objects/info/alternates"
printf '[core]\\n\\trepositoryformatversion = 0\\n\\tbare = false\\n' > "$S/git/config"
printf '* {resets}\\n' > "$S/git/info/attributes"
if [ -f "$G/info/exclude" ]; then cp "$G/info/exclude" "$S/git/info/exclude"; fi
cd {shlex.quote(tree)} || {{ echo LEGO_DIFF_FAILED cd; exit 92; }}
run() {{ git_ GIT_DIR="$S/git" GIT_WORK_TREE={shlex.quote(tree)} GIT_INDEX_FILE="$S/index" /usr/bin/git \\
  -c core.autocrlf=false -c core.safecrlf=false -c core.fsmonitor=false -c core.hooksPath=/dev/null \\
  -c core.quotePath=true -c core.symlinks=true -c core.filemode=true -c core.ignoreCase=false \\
  -c core.precomposeUnicode=false -c core.excludesFile=/dev/null -c diff.renames=true "$@"; }}
run add -A . >"$S/err" 2>&1 || {{ echo LEGO_DIFF_FAILED add; tail -c 1500 "$S/err"; exit 93; }}
run diff --cached --binary --no-textconv --no-ext-diff --no-color HEAD 2>"$S/err" | head -c {cap + 1} >"$S/patch"
codes="${{PIPESTATUS[*]}}"
size=$(stat -c %s "$S/patch")
if [ "$size" -gt {cap} ]; then echo "LEGO_DIFF_TOO_LARGE $size"; exit 0; fi
case "$codes" in "0 0") ;; *) echo "LEGO_DIFF_FAILED diff ($codes)"; tail -c 1500 "$S/err"; exit 94;; esac
echo "LEGO_DIFF_OK $size"
base64 -w0 "$S/patch"
"""


class DockerSandbox:
    def __init__(self, client: docker.DockerClient, container, workdir: str, config: SandboxConfig,
                 last_command: LastCommand | None = None):
        self.client = client
        self.container = container
        self.workdir = workdir
        self.config = config
        self.last_command = last_command
        self.ended = False  # the last command was started: the container ends with it, no exec after
        self.closed = False
        # Set by the factory when the proxy session is reached through a tunnel (lego.sandbox.tunnel) instead of a
        # bind-mounted socket: the session socket's directory on this (the worker's) machine.
        self.tunnel_socket_dir: Path | None = None
        self.tunnel = None
        _OPEN.add(self)

    @property
    def name(self) -> str:
        return self.container.name

    @property
    def sandbox_id(self) -> str:
        return self.container.id

    def __enter__(self) -> DockerSandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def is_running(self) -> bool:
        try:
            self.container.reload()
            return self.container.status == "running"
        except (NotFound, APIError):
            return False

    def exec(self, command: str, timeout: float | None = None, env: dict[str, str] | None = None,
             workdir: str | None = None, output_limit: int | None = None, detach: bool = False,
             user: str | None = None) -> ExecResult:
        """Run `command` with bash, as `user` ("uid:gid"; the agent, AGENT_USER, unless told otherwise)."""
        if self.closed:
            raise SandboxError(f"sandbox {self.name} is closed")
        if self.ended:
            raise SandboxError(f"sandbox {self.name} ran its last command; nothing runs in it after that")
        timeout = float(timeout or self.config.exec_timeout_s)
        limit = output_limit or self.config.output_limit_bytes
        # `timeout` signals the whole process group: children die with the command. Outside that group, a wrapper
        # ends the output with a line only this exec knows: without it, the output that came back is not the
        # command's whole output.
        end = f"[lego-exec-end {os.urandom(8).hex()}]"
        argv = ["timeout", "-k", "2", f"{timeout:g}", "bash", "-c", command] if detach else [
            "bash", "-c", 'timeout -k 2 "$1" bash -c "$2"; rc=$?; printf "%s%d" "$3" "$rc"; exit "$rc"', "lego-exec",
            f"{timeout:g}", command, end]
        api = self.client.api
        started = time.monotonic()
        try:
            exec_id = api.exec_create(self.container.id, argv, workdir=workdir or self.workdir,
                                      environment=env or {}, stdout=True, stderr=True,
                                      user=user or AGENT_USER)["Id"]
            if detach:
                api.exec_start(exec_id, detach=True)
                return ExecResult(0, "", duration_s=0.0)
            started_exec = ExecStream(api, exec_id)
        except (APIError, DockerException) as exc:
            raise SandboxError(f"exec in {self.name} failed: {exc}") from exc
        # Room for the command's output, then the end line with its exit status.
        raw, cut, hard_timeout = self._read_exec(started_exec, limit + len(end) + 12, timeout)
        duration = time.monotonic() - started
        ended, raw = _without_end_line(raw, end.encode())
        truncated = cut or len(raw) > limit
        output = raw[:limit].decode("utf-8", errors="replace")
        try:
            exit_code = api.exec_inspect(exec_id).get("ExitCode")
        except (APIError, DockerException) as exc:
            if not self.is_running():
                raise ContainerDied(f"container {self.name} is gone after exec: {exc}") from exc
            raise SandboxError(f"exec in {self.name} could not be inspected: {exc}") from exc
        if exit_code is None:
            exit_code = 137 if hard_timeout else -1
        # A killed container ends the exec's stream before the engine marks it exited: when the exit looks
        # like a signal, give the engine a moment to say whether the whole container went down.
        by_signal = exit_code < 0 or exit_code >= 128
        if not self.is_running() or (by_signal and self._stops_within(2.0)):
            raise ContainerDied(f"container {self.name} died during exec (exit code {exit_code}): {tail(output)}")
        timed_out = hard_timeout or (exit_code in (124, 137) and duration >= timeout - 0.5)
        if not ended and not truncated and not timed_out and not by_signal:
            raise ExecOutputLost(f"the output of an exec in {self.name} was cut short by the engine (exit code "
                                 f"{exit_code}, {len(raw)} bytes came back): run the command again")
        return ExecResult(int(exit_code), output, timed_out=timed_out, truncated=truncated, duration_s=duration)

    def _read_exec(self, stream: ExecStream, room: int, timeout: float) -> tuple[bytes, bool, bool]:
        """(the first `room` bytes of an exec's output, whether there was more, whether it outlived `timeout` + 15 s
        and what it left running was killed)."""
        chunks: list[bytes] = []
        state = {"size": 0, "truncated": False}

        def drain() -> None:
            try:
                for chunk in stream.output():
                    if state["size"] < room:
                        keep = chunk[: room - state["size"]]
                        chunks.append(keep)
                        state["size"] += len(keep)
                    if len(chunk) and state["size"] >= room:
                        state["truncated"] = True
            except Exception:  # the stream breaks when the container dies; the caller reports it
                pass

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        reader.join(timeout + 15)
        hard_timeout = reader.is_alive()
        if hard_timeout:
            # The in-container timeout did not end it (a process escaped its group): kill what runs there. As
            # the agent: that reaches every process the agent started, and never the keeper's (whose `sleep`
            # holds the container up; the keeper only runs Lego's own short commands and the relay).
            try:
                api = self.client.api
                api.exec_start(api.exec_create(self.container.id, ["sh", "-c", "kill -9 -1"],
                                               user=AGENT_USER)["Id"])
            except (APIError, DockerException):
                pass
            reader.join(5)
        if not reader.is_alive():
            stream.close()
        return b"".join(chunks), state["truncated"], hard_timeout

    def run_last_command(self, timeout: float) -> ExecResult:
        """Start the sandbox's last command and wait for the container to end with it (at most `timeout` seconds,
        then it is killed from outside, with everything in it: timed_out). When this returns, no process of the
        sandbox is left; the container is kept, stopped, until close()."""
        if self.last_command is None:
            raise LastCommandError(f"sandbox {self.name} was opened without a last command")
        if self.ended:
            raise LastCommandError(f"sandbox {self.name} ran its last command already")
        deadline = time.monotonic() + 30
        while True:
            try:
                if self.exec(f"test -p {GATE}", timeout=10, workdir="/").exit_code == 0:
                    break
            except SandboxError:  # the container is gone: its main process failed before the gate
                pass
            if not self.is_running() or time.monotonic() > deadline:
                raise LastCommandError(f"the gate of sandbox {self.name} never came up (its main process waits "
                                       f"on {GATE}); container log: {tail(self._log(4096))}")
            time.sleep(0.05)
        self.ended = True
        api = self.client.api
        started = time.monotonic()
        try:
            # Detached: the writer may itself be killed when a quick command ends the container.
            go = api.exec_create(self.container.id, ["sh", "-c", f"printf 'go\\n' > {GATE}"], workdir="/",
                                 user=AGENT_USER)["Id"]
            api.exec_start(go, detach=True)
        except (APIError, DockerException) as exc:
            raise LastCommandError(f"starting the last command in {self.name} failed: {exc}") from exc
        timed_out = False
        try:
            try:
                status = api.wait(self.container.id, timeout=timeout)
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                timed_out = True
                try:
                    api.kill(self.container.id)  # from outside its PID namespace: its init, and so everything, dies
                except (APIError, DockerException):
                    pass  # it ended meanwhile; a kill that failed otherwise leaves it running: the wait says so
                status = api.wait(self.container.id, timeout=60)
        except (requests.exceptions.RequestException, APIError, DockerException) as exc:
            raise LastCommandError(f"the last command of {self.name} did not end (the engine gave no exit status "
                                   f"after the kill either): {exc}") from exc
        duration = time.monotonic() - started
        output = self._log(self.last_command.output_limit)
        return ExecResult(int(status.get("StatusCode", -1)), output, timed_out=timed_out, duration_s=duration)

    def _log(self, limit: int) -> str:
        try:
            data = self.client.api.logs(self.container.id, stdout=True, stderr=True)
        except (APIError, DockerException) as exc:
            return f"(the container's log could not be read: {exc})"
        return data[-limit:].decode("utf-8", errors="replace")

    def _stops_within(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.1)
            if not self.is_running():
                return True
        return False

    def put_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        # Through exec, not `docker cp`: the root is read-only and the repo lives on a tmpfs.
        encoded = base64.b64encode(data).decode()
        quoted = shlex.quote(path)
        step = 96_000
        starts = range(0, max(len(encoded), 1), step)
        for start in starts:
            part = encoded[start:start + step]
            write = (f"mkdir -p \"$(dirname {quoted})\" && printf %s {shlex.quote(part)} | base64 -d > {quoted}"
                     if start == 0 else f"printf %s {shlex.quote(part)} | base64 -d >> {quoted}")
            if start == starts[-1]:  # the mode with the last part: one exec for a file that fits in one
                write += f" && chmod {mode:o} {quoted}"
            result = self.exec(write, timeout=60, workdir="/")
            if result.exit_code != 0:
                raise SandboxError(f"writing {path} in {self.name} failed: {tail(result.output)}")

    def get_file(self, path: str) -> bytes:
        result = self.exec(f"base64 -w0 {shlex.quote(path)}", timeout=60, workdir="/", output_limit=256 << 20)
        if result.exit_code != 0:
            raise FileNotFoundError(f"{path} in {self.name}: {tail(result.output.strip())}")
        return base64.b64decode(result.output)

    def _take_diff(self, tree: str, cap: int) -> tuple[str, str, ExecResult]:
        """(status, patch, result) of running diff_script on `tree`: status is ok, too_large (the patch is then
        the size it reached) or failed."""
        import math

        limit = 4 * math.ceil((cap + 1) / 3) + (64 << 10)
        result = self.exec(diff_script(tree, cap), timeout=120, workdir="/", output_limit=limit)
        if result.exit_code != 0 or result.timed_out or result.truncated:
            return "failed", "", result
        lines = result.output.split("\n")
        for index, line in enumerate(lines):
            if line.startswith("LEGO_DIFF_TOO_LARGE "):
                return "too_large", line.split()[1], result
            if line.startswith("LEGO_DIFF_OK "):
                try:
                    data = base64.b64decode("".join(lines[index + 1:]).strip(), validate=True)
                except ValueError:
                    break
                if len(data) != int(line.split()[1]):
                    break
                return "ok", data.decode("utf-8", errors="replace"), result
        return "failed", "", result

    def diff(self, max_bytes: int | None = None) -> str:
        """Changes of the working tree against the pristine snapshot, as a binary-safe git patch.

        Nothing in the working tree or the agent's home can change or break it: git runs with a scratch
        GIT_DIR (the snapshot's objects as alternates) whose info/attributes resets every attribute that
        converts content or changes the patch (filters, encodings, eol/text, diff drivers, ident), with no
        system or user config (HOME an empty dir, GIT_CONFIG_GLOBAL=/dev/null, an empty environment), and no
        textconv or external diff. The patch is written to a file and sent base64-encoded, so no warning on
        stderr can mix into it. A patch over `max_bytes` raises PatchTooLarge without being transferred (never
        a partial patch). It runs as the agent's user (it can read whatever the agent wrote) after every
        process the agent left is killed. When taking the diff still fails, the same procedure on the pristine snapshot is the
        control: it works -> the agent's tree broke it (DiffBrokenByAgent, the policy's failure); it fails
        too -> SandboxError (infra).
        """
        from lego.sandbox import DiffBrokenByAgent, PatchTooLarge

        cap = int(max_bytes) if max_bytes else 256 << 20
        # First end what the agent left running: a background job must neither change the tree while it is read
        # nor kill git, and stray processes (a fork bomb) must not hold every pid.
        self.reclaim_processes()
        status, patch, result = self._take_diff(self.workdir, cap)
        if status == "failed":
            # The scratch space may be full of the agent's files (a filled /tmp must not pass for infra): nothing
            # there is needed any more (transcripts are collected before the diff), so free it and try again.
            self.exec("find /tmp /var/tmp -mindepth 1 -maxdepth 1 -user \"$(id -u)\" -exec rm -rf {} + "
                      "2>/dev/null; true", timeout=60, workdir="/")
            status, patch, result = self._take_diff(self.workdir, cap)
        if status == "too_large":
            raise PatchTooLarge(f"the diff in {self.name} is over the cap of {cap} bytes (stopped reading at "
                                f"{patch} bytes); it was not transferred", cap)
        if status == "ok":
            if len(patch.encode()) > cap:
                raise PatchTooLarge(f"the diff in {self.name} is over the cap of {cap} bytes once decoded", cap)
            return patch
        error = (f"exit {result.exit_code}{' (timed out)' if result.timed_out else ''}"
                 f"{' (output truncated)' if result.truncated else ''}: {tail(result.output)}")
        control, _, control_result = self._take_diff(SNAPSHOT, cap)
        if control in ("ok", "too_large"):
            raise DiffBrokenByAgent(f"taking the diff in {self.name} failed ({error}) while the same procedure on "
                                    "the pristine snapshot works: the agent's working tree broke it")
        raise SandboxError(f"computing the diff in {self.name} failed ({error}); the control on the pristine "
                           f"snapshot failed too: {tail(control_result.output)}")

    def reclaim_processes(self, tries: int = 40) -> bool:
        """Kill every process the agent left running; retried while no pid is free to start the killer."""
        api = self.client.api
        for _ in range(tries):
            try:
                exec_id = api.exec_create(self.container.id, ["python3", "-c", RECLAIM], workdir="/",
                                          user=AGENT_USER)["Id"]
                if b"reclaimed" in run_exec(api, exec_id):
                    return True
            except (APIError, DockerException):
                if not self.is_running():
                    return False
            time.sleep(0.25)
        return False

    def start_proxy_relay(self, socket_name: str, port: int, session_id: str, *, wait_s: float = 10.0) -> str:
        """Expose the mounted proxy socket on the container's own loopback; returns the base URL.

        The relay (socat) runs as the keeper, so the agent can neither kill it nor take its port afterwards. It is
        up when the proxy itself answers through it: `GET /s/<session_id>/v1/models` must return 200 (a TCP
        connect alone would pass with no proxy, or a closed session, behind the relay)."""
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", socket_name) or not re.fullmatch(r"[A-Za-z0-9_-]+", session_id):
            raise SandboxError(f"bad proxy socket name {socket_name!r} or session id for the relay in {self.name}")
        if self.tunnel_socket_dir is not None:
            from lego.sandbox.tunnel import ProxyTunnel

            if self.tunnel is not None:
                raise SandboxError(f"{self.name} already has a proxy tunnel; a sandbox serves one session")
            key, _, value = KEEP_ENV.partition("=")
            self.tunnel = ProxyTunnel(self.client.api, self.container.id, self.tunnel_socket_dir / socket_name, port,
                                      user=KEEPER_USER, environment={key: value}, name=self.name)
        else:
            command = (f"export {KEEP_ENV}; nohup socat TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr "
                       f"UNIX-CONNECT:{PROXY_MOUNT}/{socket_name} >{RELAY_LOG} 2>&1 &")
            started = self.exec(command, timeout=10, workdir="/", user=KEEPER_USER)
            if started.exit_code != 0:
                raise SandboxError(f"starting the proxy relay in {self.name} failed: {tail(started.output)}")
        deadline = time.monotonic() + wait_s
        while True:
            status, answer = self.relay_status(port, session_id)
            if status == "200":
                return f"http://127.0.0.1:{port}"
            if status or time.monotonic() > deadline:  # an answer other than 200 will not change by waiting
                break
            time.sleep(0.1)
        if self.tunnel is not None:
            log = "the tunnel's exec stream is " + ("open" if self.tunnel.is_alive() else "closed")
        else:
            log = tail(self.exec(f"cat {RELAY_LOG}", timeout=5, workdir="/", user=KEEPER_USER).output)
        raise SandboxError(f"the proxy relay in {self.name} does not reach the proxy session: GET "
                           f"/s/<session>/v1/models through 127.0.0.1:{port} answered "
                           f"{tail(answer) or 'nothing'!r}; relay log: {log!r}")

    def relay_status(self, port: int, session_id: str) -> tuple[str | None, str]:
        """(HTTP status or None, the answer's first line) of `GET /s/<session_id>/v1/models` through the relay:
        the proxy itself answering for this session, not just a port that accepts connections."""
        # HTTP/1.0 by hand (bash's /dev/tcp): no dependency on what the task image ships besides bash.
        probe = (f"exec 3<>/dev/tcp/127.0.0.1/{port} || exit 7; "
                 f"printf 'GET /s/{session_id}/v1/models HTTP/1.0\\r\\nHost: 127.0.0.1\\r\\n\\r\\n' >&3; "
                 "IFS= read -r -t 5 line <&3; echo \"STATUS $line\"")
        answer = self.exec(probe, timeout=10, workdir="/").output.strip()
        status = re.search(r"STATUS HTTP/\d(?:\.\d)? (\d{3})", answer)
        return (status.group(1) if status else None), answer.removeprefix("STATUS ")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        _OPEN.discard(self)
        if self.tunnel is not None:
            self.tunnel.close()
        try:
            self.container.remove(force=True)
        except NotFound:
            pass
        except (APIError, DockerException):
            pass  # reaped at the next start


def engine_is_local(client: docker.DockerClient) -> bool:
    """Whether the engine is reached over a unix socket, so it mounts paths from this machine's file system. A TCP or
    SSH engine may be anywhere (even a TCP one on loopback may be a dockerd in a container): never assumed local."""
    return str(getattr(client.api, "base_url", "")) == "http+docker://localhost"


def resolve_proxy_channel(channel: str, client: docker.DockerClient) -> str:
    """"mount" (the session socket's directory bind-mounted, then socat) or "tunnel" (over the exec stream); "auto"
    picks mount for an engine on a local unix socket and the tunnel otherwise."""
    if channel == "auto":
        return "mount" if engine_is_local(client) else "tunnel"
    if channel not in ("mount", "tunnel"):
        raise SandboxError(f"unknown proxy channel {channel!r}; set docker.proxy_channel to auto, mount or tunnel")
    return channel


def resolve_files_channel(channel: str, client: docker.DockerClient) -> str:
    """How a sandbox reads the worker's read-only directories (`open`'s mounts): "bind" (bind mounts; the engine must
    share this machine's file system) or "volume" (copied once per content into a volume on the engine:
    lego/sandbox/content_volume.py); "auto" binds on an engine on a local unix socket and copies otherwise."""
    if channel == "auto":
        return "bind" if engine_is_local(client) else "volume"
    if channel not in ("bind", "volume"):
        raise SandboxError(f"unknown files channel {channel!r}; set docker.files_channel to auto, bind or volume")
    return channel


class DockerSandboxFactory:
    """Opens sandboxes from task images with the configured limits (lego.sandbox.SandboxFactory); task images are
    built on `base_image` when missing."""

    proxy_socket_uid = KEEPER_UID  # the relay runs as the keeper: the agent cannot connect to the socket itself

    def __init__(self, client: docker.DockerClient, config: SandboxConfig, reap: bool = True,
                 base_image: str | None = None, proxy_channel: str = "auto", files_channel: str = "auto"):
        self.client = client
        self.config = config
        self.base_image = base_image
        self.proxy_channel = resolve_proxy_channel(proxy_channel, client)
        self.files_channel = resolve_files_channel(files_channel, client)
        _install_signal_handlers()
        if reap:
            reap_stale_containers(client)

    def open_task(self, task: Task, *, purpose: str, mounts: dict[str, str] | None = None,
                  proxy_socket_dir: Path | None = None, labels: dict[str, str] | None = None,
                  volumes: dict[str, str] | None = None, last_command: LastCommand | None = None,
                  repository: bool = True) -> DockerSandbox:
        if self.base_image is None:
            raise SandboxError("this sandbox factory has no base image to build task images on; pass "
                               "base_image= (lego.sandbox.image.ensure_base_image gives it)")
        from lego.sandbox.task_image import ensure_task_image  # it builds on this module's snapshot layout

        image = ensure_task_image(self.client, task, self.base_image)
        return self.open(image, task.environment.workdir, purpose=purpose, mounts=mounts,
                         proxy_socket_dir=proxy_socket_dir, labels=labels, volumes=volumes,
                         last_command=last_command, repository=repository)

    def open(self, image: str, workdir: str = "/repo", *, purpose: str = "agent",
             mounts: dict[str, str] | None = None, proxy_socket_dir: Path | None = None,
             labels: dict[str, str] | None = None, volumes: dict[str, str] | None = None,
             last_command: LastCommand | None = None, repository: bool = True) -> DockerSandbox:
        """Start a container; `mounts` maps host paths to read-only container paths (harness runtimes, grader
        files: they must be readable by AGENT_UID). `proxy_socket_dir` is the directory of this sandbox's own
        proxy socket (one per rollout, see ProxyServer.open_session), mounted read-only at PROXY_MOUNT: the
        agent can connect through the relay but neither replace the socket nor write to the host there.
        `volumes` maps scratch volumes (scratch_volume) to writable container paths; `last_command` makes the
        sandbox end with it (see the module docstring); `repository=False` skips copying the repository in."""
        cfg = self.config
        binds = {self._readable(host): {"bind": target, "mode": "ro"} for host, target in (mounts or {}).items()}
        binds.update({name: {"bind": target, "mode": "rw"} for name, target in (volumes or {}).items()})
        if proxy_socket_dir is not None and self.proxy_channel == "mount":
            binds[str(proxy_socket_dir)] = {"bind": PROXY_MOUNT, "mode": "ro"}
        all_labels = {**self._owner_labels(), "lego.purpose": purpose, **(labels or {})}
        owned = f"uid={AGENT_UID},gid={AGENT_UID}"  # the agent's own writable places
        tmpfs = {
            workdir: f"size={cfg.disk_limit_mb}m,exec,mode=755,{owned}",
            AGENT_HOME: f"size=256m,exec,mode=700,{owned}",
            "/tmp": "size=512m,exec,mode=1777",
            "/var/tmp": "size=64m,mode=1777",
            "/run": "size=16m,mode=755",
        }
        main: dict = {"command": ["sleep", "infinity"], "init": True, "user": KEEPER_USER,
                      "environment": {"HOME": AGENT_HOME}}
        if last_command is not None:
            # No docker-init: the command itself must be the namespace's init. The log keeps its output's tail.
            half = max(last_command.output_limit // 2, 64 << 10)
            main = {"command": ["sh", "-c", GATE_SCRIPT, GATE, last_command.workdir, *last_command.argv],
                    "init": False, "user": AGENT_USER, "environment": {"HOME": AGENT_HOME, **last_command.env},
                    "log_config": {"type": "json-file", "config": {"max-size": str(half), "max-file": "2"}}}
        try:
            container = self.client.containers.run(
                image, detach=True, network_mode="none", read_only=True, tmpfs=tmpfs,
                nano_cpus=int(cfg.cpus * 1e9), mem_limit=cfg.memory, memswap_limit=cfg.memory,
                pids_limit=cfg.pids_limit, labels=all_labels, volumes=binds, working_dir="/",
                stop_signal="SIGKILL",
                # No root and no capabilities, none to regain (setuid binaries included); execs default to the
                # container's user, so DockerSandbox.exec always names its user (the agent unless told).
                cap_drop=["ALL"], security_opt=["no-new-privileges:true"], **main,
            )
        except (APIError, DockerException) as exc:
            raise SandboxError(f"starting a sandbox from {image} failed: {exc}") from exc
        sandbox = DockerSandbox(self.client, container, workdir, cfg, last_command=last_command)
        if proxy_socket_dir is not None and self.proxy_channel == "tunnel":
            sandbox.tunnel_socket_dir = Path(proxy_socket_dir)
        return copy_pristine_repository(sandbox, workdir) if repository else sandbox

    def _readable(self, host_path: str) -> str:
        """What a read-only mount of the worker's `host_path` mounts on this engine: the path itself, or the content
        volume holding a copy of it (files_channel "volume")."""
        if self.files_channel == "bind":
            return host_path
        if self.base_image is None:
            raise SandboxError("copying directories to a Docker engine needs the factory's base image (base_image=)")
        from lego.sandbox.content_volume import ensure_content_volume

        return ensure_content_volume(self.client, Path(host_path), self.base_image, self._owner_labels())

    @staticmethod
    def _owner_labels() -> dict[str, str]:
        return {LABEL: "1", "lego.owner_pid": str(os.getpid()), "lego.host": socket.gethostname()}

    def scratch_volume(self, purpose: str, size_mb: int, owner_uid: int = KEEPER_UID) -> str:
        """A new named volume in memory (tmpfs, at most `size_mb`), its root owned by `owner_uid` (mode 755), for
        sandboxes to share (open's `volumes`). Its content lives while some container mounts it; remove it with
        remove_volume (a dead owner's are reaped like its sandboxes)."""
        try:
            volume = self.client.volumes.create(
                driver="local", labels={**self._owner_labels(), "lego.purpose": purpose},
                driver_opts={"type": "tmpfs", "device": "tmpfs",
                             "o": f"size={int(size_mb)}m,uid={owner_uid},gid={owner_uid},mode=755"})
        except (APIError, DockerException) as exc:
            raise SandboxError(f"creating a scratch volume for {purpose} failed: {exc}") from exc
        return volume.name

    def remove_volume(self, name: str) -> None:
        try:
            self.client.api.remove_volume(name, force=True)
        except NotFound:
            pass
        except (APIError, DockerException) as exc:  # nothing is lost: reaped once this process has exited
            log.warning("removing scratch volume %s failed (%s); it is reaped once this process has exited", name, exc)


def copy_pristine_repository(sandbox: DockerSandbox, workdir: str) -> DockerSandbox:
    """The agent's writable copy of the pristine snapshot at `workdir`; the sandbox is closed when that fails."""
    try:
        # As the agent: the copy is the agent's (a non-root cp keeps modes and times, not the root owner).
        copied = sandbox.exec(f"cp -a {SNAPSHOT}/. {shlex.quote(workdir)}/", timeout=300, workdir="/")
        if copied.exit_code != 0:
            raise SandboxError(f"copying the repository into {sandbox.name} failed: {tail(copied.output)}")
    except BaseException:
        sandbox.close()
        raise
    return sandbox
