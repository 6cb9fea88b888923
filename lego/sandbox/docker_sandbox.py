"""The Docker sandbox backend.

One container per rollout (and a fresh one per grading) from the task image. The container has no
network (network mode none), CPU, memory and pids limits, a read-only root file system, and the
repository on a size-capped tmpfs copied from the image's pristine snapshot at start, so an agent can
neither fill the host's disk nor write outside the repo, its home and /tmp. Every exec has a wall-clock
timeout and an output cap. Containers carry labels naming their owner process: they are removed on
close, on exceptions and signals, and stale ones (owner dead) are reaped when a factory starts.
"""

from __future__ import annotations

import atexit
import base64
import os
import shlex
import signal
import socket
import threading
import time
import weakref
from pathlib import Path

import docker
from docker.errors import APIError, DockerException, NotFound

from lego.config import SandboxConfig
from lego.errors import LegoError
from lego.sandbox import ExecResult

LABEL = "lego.sandbox"
SNAPSHOT = "/opt/lego/repo"  # the pristine repository baked into every task image (read-only at run time)
PROXY_MOUNT = "/lego-proxy"  # where the proxy's unix socket directory is mounted
_OPEN: weakref.WeakSet[DockerSandbox] = weakref.WeakSet()
KEEP_ENV = "LEGO_KEEP=1"  # in a process's environment: Lego's own (the proxy relay), spared by reclaim
# SIGKILL every process but init, the container's `sleep infinity`, Lego's own and this one, until none is
# left: what a fork bomb or stray background jobs leave behind. One process, so it needs one free pid.
RECLAIM = f"""
import os, signal
me = os.getpid()
def spare(pid):
    try:
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


class SandboxError(LegoError):
    """The sandbox itself failed (container died, daemon error): an infrastructure failure, never the agent's."""


class ContainerDied(SandboxError):
    """The container stopped while a command ran in it (killed, OOM-killed as a whole, daemon restart)."""


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


def reap_stale_containers(client: docker.DockerClient) -> list[str]:
    """Remove sandboxes whose owner process (on this host) is gone. Returns their names."""
    reaped = []
    host = socket.gethostname()
    for container in client.containers.list(all=True, filters={"label": LABEL}):
        labels = container.labels
        owner = int(labels.get("lego.owner_pid", "0") or 0)
        if labels.get("lego.host") == host and owner and _pid_alive(owner):
            continue
        try:
            container.remove(force=True)
            reaped.append(container.name)
        except NotFound:
            pass
    return reaped


class DockerSandbox:
    def __init__(self, client: docker.DockerClient, container, workdir: str, config: SandboxConfig):
        self.client = client
        self.container = container
        self.workdir = workdir
        self.config = config
        self.closed = False
        _OPEN.add(self)

    @property
    def name(self) -> str:
        return self.container.name

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
             workdir: str | None = None, output_limit: int | None = None, detach: bool = False) -> ExecResult:
        if self.closed:
            raise SandboxError(f"sandbox {self.name} is closed")
        timeout = float(timeout or self.config.exec_timeout_s)
        limit = output_limit or self.config.output_limit_bytes
        # `timeout` signals the whole process group: children die with the command.
        argv = ["timeout", "-k", "2", f"{timeout:g}", "bash", "-c", command]
        api = self.client.api
        started = time.monotonic()
        try:
            exec_id = api.exec_create(self.container.id, argv, workdir=workdir or self.workdir,
                                      environment=env or {}, stdout=True, stderr=True)["Id"]
            if detach:
                api.exec_start(exec_id, detach=True)
                return ExecResult(0, "", duration_s=0.0)
            stream = api.exec_start(exec_id, stream=True, demux=False)
        except (APIError, DockerException) as exc:
            raise SandboxError(f"exec in {self.name} failed: {exc}") from exc
        chunks: list[bytes] = []
        state = {"size": 0, "truncated": False}

        def drain() -> None:
            try:
                for chunk in stream:
                    if state["size"] < limit:
                        keep = chunk[: limit - state["size"]]
                        chunks.append(keep)
                        state["size"] += len(keep)
                    if len(chunk) and state["size"] >= limit:
                        state["truncated"] = True
            except Exception:  # the stream breaks when the container dies; reported below
                pass

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        reader.join(timeout + 15)
        hard_timeout = reader.is_alive()
        if hard_timeout:
            # The in-container timeout did not end it (a process escaped its group): kill what runs there.
            try:
                api.exec_start(api.exec_create(self.container.id, ["sh", "-c", "kill -9 -1"])["Id"])
            except (APIError, DockerException):
                pass
            reader.join(5)
        duration = time.monotonic() - started
        output = b"".join(chunks).decode("utf-8", errors="replace")
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
            raise ContainerDied(f"container {self.name} died during exec (exit code {exit_code}): {output[-500:]}")
        timed_out = hard_timeout or (exit_code in (124, 137) and duration >= timeout - 0.5)
        return ExecResult(int(exit_code), output, timed_out=timed_out, truncated=state["truncated"],
                          duration_s=duration)

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
        first = True
        step = 96_000
        for start in range(0, max(len(encoded), 1), step):
            part = encoded[start:start + step]
            redirect = ">" if first else ">>"
            result = self.exec(f"mkdir -p \"$(dirname {quoted})\" && printf %s {shlex.quote(part)} | base64 -d "
                               f"{redirect} {quoted}", timeout=60, workdir="/")
            if result.exit_code != 0:
                raise SandboxError(f"writing {path} in {self.name} failed: {result.output[-500:]}")
            first = False
        self.exec(f"chmod {mode:o} {quoted}", timeout=30, workdir="/")

    def get_file(self, path: str) -> bytes:
        result = self.exec(f"base64 -w0 {shlex.quote(path)}", timeout=60, workdir="/", output_limit=256 << 20)
        if result.exit_code != 0:
            raise FileNotFoundError(f"{path} in {self.name}: {result.output.strip()[-300:]}")
        return base64.b64decode(result.output)

    def diff(self) -> str:
        """Changes of the working tree against the pristine snapshot (whatever the agent did to .git)."""
        script = (
            f"set -e; export GIT_DIR={SNAPSHOT}/.git GIT_WORK_TREE={self.workdir} GIT_INDEX_FILE=/tmp/.lego-diff-index "
            f"GIT_OBJECT_DIRECTORY=/tmp/.lego-diff-objects GIT_ALTERNATE_OBJECT_DIRECTORIES={SNAPSHOT}/.git/objects; "
            "rm -rf $GIT_INDEX_FILE $GIT_OBJECT_DIRECTORY; mkdir -p $GIT_OBJECT_DIRECTORY; "
            "git add -A . >/dev/null 2>&1; git diff --cached --binary HEAD; "
            "rm -rf $GIT_INDEX_FILE $GIT_OBJECT_DIRECTORY"
        )
        result = self.exec(script, timeout=120, output_limit=64 << 20)
        if result.exit_code != 0 and self.reclaim_processes():
            # Stray processes (a fork bomb) took every pid: the repository is intact, take its diff now.
            result = self.exec(script, timeout=120, output_limit=64 << 20)
        if result.exit_code != 0:
            raise SandboxError(f"computing the diff in {self.name} failed: {result.output[-500:]}")
        return result.output

    def reclaim_processes(self, tries: int = 40) -> bool:
        """Kill every process the agent left running; retried while no pid is free to start the killer."""
        api = self.client.api
        for _ in range(tries):
            try:
                exec_id = api.exec_create(self.container.id, ["python3", "-c", RECLAIM], workdir="/")["Id"]
                output = api.exec_start(exec_id)
                if b"reclaimed" in (output or b""):
                    return True
            except (APIError, DockerException):
                if not self.is_running():
                    return False
            time.sleep(0.25)
        return False

    def start_proxy_relay(self, socket_name: str, port: int) -> str:
        """Expose the mounted proxy socket on the container's own loopback; returns the base URL."""
        command = (f"export {KEEP_ENV}; nohup socat TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr "
                   f"UNIX-CONNECT:{PROXY_MOUNT}/{socket_name} >/tmp/.lego-relay.log 2>&1 &")
        self.exec(command, timeout=10, workdir="/")
        for _ in range(50):
            probe = self.exec(f"bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}' 2>/dev/null && echo up", timeout=5,
                              workdir="/")
            if "up" in probe.output:
                return f"http://127.0.0.1:{port}"
            time.sleep(0.1)
        raise SandboxError(f"the proxy relay in {self.name} did not come up: "
                           f"{self.exec('cat /tmp/.lego-relay.log', timeout=5).output[-300:]}")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        _OPEN.discard(self)
        try:
            self.container.remove(force=True)
        except NotFound:
            pass
        except (APIError, DockerException):
            pass  # reaped at the next start


class DockerSandboxFactory:
    """Opens sandboxes from task images with the configured limits."""

    def __init__(self, client: docker.DockerClient, config: SandboxConfig, reap: bool = True):
        self.client = client
        self.config = config
        _install_signal_handlers()
        if reap:
            reap_stale_containers(client)

    def open(self, image: str, workdir: str = "/repo", *, purpose: str = "agent",
             mounts: dict[str, str] | None = None, proxy_socket_dir: Path | None = None,
             labels: dict[str, str] | None = None) -> DockerSandbox:
        """Start a container; `mounts` maps host paths to read-only container paths (harness runtimes)."""
        cfg = self.config
        volumes = {host: {"bind": target, "mode": "ro"} for host, target in (mounts or {}).items()}
        if proxy_socket_dir is not None:
            volumes[str(proxy_socket_dir)] = {"bind": PROXY_MOUNT, "mode": "rw"}
        all_labels = {LABEL: "1", "lego.owner_pid": str(os.getpid()), "lego.host": socket.gethostname(),
                      "lego.purpose": purpose, **(labels or {})}
        tmpfs = {
            workdir: f"size={cfg.disk_limit_mb}m,exec,mode=755",
            "/tmp": "size=512m,exec,mode=1777",
            "/root": "size=256m,exec,mode=700",
            "/var/tmp": "size=64m,mode=1777",
            "/run": "size=16m,mode=755",
        }
        try:
            container = self.client.containers.run(
                image, ["sleep", "infinity"], detach=True, network_mode="none", read_only=True, tmpfs=tmpfs,
                nano_cpus=int(cfg.cpus * 1e9), mem_limit=cfg.memory, memswap_limit=cfg.memory,
                pids_limit=cfg.pids_limit, labels=all_labels, volumes=volumes, working_dir="/",
                init=True, stop_signal="SIGKILL",
            )
        except (APIError, DockerException) as exc:
            raise SandboxError(f"starting a sandbox from {image} failed: {exc}") from exc
        sandbox = DockerSandbox(self.client, container, workdir, cfg)
        try:
            copied = sandbox.exec(f"cp -a {SNAPSHOT}/. {shlex.quote(workdir)}/", timeout=300, workdir="/")
            if copied.exit_code != 0:
                raise SandboxError(f"copying the repository into {sandbox.name} failed: {copied.output[-500:]}")
        except BaseException:
            sandbox.close()
            raise
        return sandbox
