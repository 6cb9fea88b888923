"""Finding a Docker engine, or starting a private one.

The user's engine comes first (DOCKER_HOST, the config, the default socket). Where none answers
and we are root on Linux, a private dockerd is started with its own data root, pid file and socket
under the work dir, with no bridge network (sandboxes use network mode none).

A private engine's life follows its users, never one command: every process that uses it holds a lease (a
file `leases/<pid>.<token>` under the docker root, naming the holder's pid and start time); a lease whose
process is gone (exited, or killed with SIGKILL) is pruned by whoever looks next. Start and stop decisions
are taken under an exclusive fcntl lock on `engine.lock`. An engine a `lego` command started (`managed`) is
stopped by the last holder out; a watchdog process started beside it stops it when every holder died without
releasing. An engine started (or pinned) by `lego docker up` stays until `lego docker down`, which leaves it to
the last holder when commands still use it (or stops it at once with --force). A dockerd running without the
`managed` marker (started by an older Lego, or by hand) is never stopped automatically.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
from docker.errors import DockerException

from lego.errors import DockerUnavailableError, tail

DEFAULT_SOCKETS = ("unix:///var/run/docker.sock", "unix:///run/docker.sock")
START_TIMEOUT_S = 60.0
WATCH_INTERVAL_S = 2.0


@dataclass
class DockerEngine:
    base_url: str
    client: docker.DockerClient
    private: bool  # a dockerd that Lego started (now or by an earlier `lego docker up`)
    owned: bool  # started by this process (it stops when its last user is done, not when this process is)
    lease: Path | None = None  # this process's lease on a private engine, released by release()
    docker_root: Path | None = None

    def env(self) -> dict[str, str]:
        return {"DOCKER_HOST": self.base_url}

    def release(self) -> bool:
        """Give this lease back; the last holder out stops a managed, unpinned engine. True if it stopped."""
        if self.lease is None or self.docker_root is None:
            return False
        lease, self.lease = self.lease, None
        return PrivateDockerd(self.docker_root).release(lease)


def _process_start(pid: int) -> str | None:
    """The process's start time (clock ticks since boot; tells a reused pid apart), or None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in (b"Z", b"X"):  # a zombie holds nothing
        return "dead"
    return fields[19].decode()


def _holder_alive(pid: int, started: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    now = _process_start(pid)
    if now == "dead":
        return False
    return not (started and now and started != now)


# The read timeout of the client a ping returns: creating or starting a container on a loaded machine can take far
# longer than answering a ping, and a call cut short there is graded an infra error.
API_TIMEOUT = 300.0


def ping(base_url: str, timeout: float = 5.0) -> docker.DockerClient | None:
    """A client of the engine at `base_url` when it answers a ping within `timeout`, for calls of up to API_TIMEOUT."""
    try:
        client = docker.DockerClient(base_url=base_url, timeout=timeout)
        client.ping()
        client.api.timeout = API_TIMEOUT
        return client
    except (DockerException, OSError, Exception):  # the SDK raises several unrelated types
        return None


def _candidate_urls(host: str | None) -> list[str]:
    urls = []
    if host:
        urls.append(host)
    if os.environ.get("DOCKER_HOST"):
        urls.append(os.environ["DOCKER_HOST"])
    urls.extend(DEFAULT_SOCKETS)
    return list(dict.fromkeys(urls))


class PrivateDockerd:
    """A dockerd owned by one work dir."""

    def __init__(self, docker_root: Path):
        self.root = docker_root
        self.pidfile = self.root / "dockerd.pid"
        self.log = self.root / "dockerd.log"
        key = hashlib.sha256(str(self.root).encode()).hexdigest()[:10]
        # Unix socket paths are limited to 108 bytes; containerd nests deeper under exec-root.
        socket = self.root / "docker.sock"
        self.socket = socket if len(str(socket)) < 90 else Path(f"/run/lego-{key}/docker.sock")
        self.exec_root = Path(f"/run/lego-{key}")

    @property
    def base_url(self) -> str:
        return f"unix://{self.socket}"

    # ------------------------------------------------------------------------------------------ leases

    @property
    def lease_dir(self) -> Path:
        return self.root / "leases"

    @property
    def pinned(self) -> bool:
        """Started or pinned by `lego docker up`: it stays until `lego docker down`."""
        return (self.root / "pinned").exists()

    @property
    def managed(self) -> bool:
        """Started by a `lego` command: stopped when its last user is done."""
        return (self.root / "managed").exists()

    def _mark(self, name: str, on: bool) -> None:
        path = self.root / name
        if on:
            path.write_text(f"{os.getpid()}\n")
        else:
            path.unlink(missing_ok=True)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive across processes: every start and stop decision is taken under it."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "engine.lock", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def add_lease(self) -> Path:
        """A lease for this process (call under the lock); several per process are fine."""
        self.lease_dir.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        lease = self.lease_dir / f"{pid}.{secrets.token_hex(4)}"
        lease.write_text(f"{pid} {_process_start(pid) or ''}\n")
        return lease

    def live_leases(self) -> list[Path]:
        """The leases whose holder still runs; those of dead holders are removed (call under the lock)."""
        live = []
        for lease in sorted(self.lease_dir.glob("*")) if self.lease_dir.is_dir() else []:
            try:
                parts = lease.read_text().split()
                pid, started = int(parts[0]), (parts[1] if len(parts) > 1 else None)
            except (OSError, ValueError, IndexError):
                pid, started = 0, None
                with contextlib.suppress(ValueError):
                    pid = int(lease.name.split(".")[0])
            if pid and _holder_alive(pid, started):
                live.append(lease)
            else:
                lease.unlink(missing_ok=True)
        return live

    def holders(self) -> list[int]:
        with self.locked():
            return sorted({int(lease.name.split(".")[0]) for lease in self.live_leases()})

    def _stop_if_unused(self) -> bool:
        """Under the lock: stop a managed, unpinned engine that no live process holds."""
        if self.running_pid() is None:
            self._mark("managed", False)
            return False
        if not self.managed or self.pinned or self.live_leases():
            return False
        stopped = self.stop()
        self._mark("managed", False)
        return stopped

    def release(self, lease: Path) -> bool:
        with self.locked():
            lease.unlink(missing_ok=True)
            return self._stop_if_unused()

    def start_managed(self) -> None:
        """Start dockerd (under the lock) as Lego's: marked managed, with a watchdog for holders that die."""
        self.start()
        self._mark("managed", True)
        self.spawn_watchdog()

    def spawn_watchdog(self) -> None:
        with open(self.log, "ab") as log:
            subprocess.Popen([sys.executable, "-m", "lego.sandbox.daemon", "watch", str(self.root)], stdout=log,
                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                             cwd="/")

    def watch(self, interval: float = WATCH_INTERVAL_S) -> None:
        """The watchdog: stop the engine once no live process holds it (managed, unpinned); exit with it."""
        while True:
            time.sleep(interval)
            with self.locked():
                if self.running_pid() is None or self._stop_if_unused():
                    return

    def running_pid(self) -> int | None:
        try:
            pid = int(self.pidfile.read_text().strip())
            os.kill(pid, 0)
            return pid
        except (OSError, ValueError):
            return None

    def start(self) -> None:
        dockerd = shutil.which("dockerd")
        if dockerd is None:
            raise DockerUnavailableError(
                "no Docker engine is reachable and dockerd is not installed; install Debian's docker.io "
                "(apt-get install docker.io) or point DOCKER_HOST at a running engine"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        self.exec_root.mkdir(parents=True, exist_ok=True)
        if self.pidfile.exists() and self.running_pid() is None:
            self.pidfile.unlink()
        command = [
            dockerd,
            "--data-root", str(self.root / "data"),
            "--exec-root", str(self.exec_root),
            "--pidfile", str(self.pidfile),
            "--host", self.base_url,
            "--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false",
        ]
        with open(self.log, "ab") as log:
            subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if ping(self.base_url, timeout=2):
                return
            time.sleep(0.3)
        log_tail = tail(self.log.read_text(errors="replace")) if self.log.exists() else ""
        self.stop()
        raise DockerUnavailableError(
            f"a private dockerd did not answer within {START_TIMEOUT_S:.0f}s; its log ({self.log}) ends with:\n{log_tail}"
        )

    def stop(self, timeout: float = 30.0) -> bool:
        pid = self.running_pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)  # reap it when this process started it (a zombie is not running)
            if not _holder_alive(pid, None):
                return True
            time.sleep(0.2)
        os.kill(pid, signal.SIGKILL)
        return True


def find_engine(host: str | None = None) -> tuple[str, docker.DockerClient] | None:
    for url in _candidate_urls(host):
        client = ping(url)
        if client is not None:
            return url, client
    return None


def _unreachable(host: str | None) -> DockerUnavailableError:
    return DockerUnavailableError(
        "no Docker engine is reachable (tried "
        + ", ".join(_candidate_urls(host))
        + "); start Docker, set DOCKER_HOST, or run as root on Linux with Debian's docker.io installed "
        "so that Lego can start a private dockerd"
    )


def connect(docker_root: Path, host: str | None = None, start_private: bool = True, *,
            pin: bool = False) -> DockerEngine:
    """Reach an engine: the user's, a private one already running, or a new private one.

    On a private engine this process takes a lease (engine.lease): the engine runs at least until the lease is
    released (DockerEngine.release) or this process ends. `pin` (`lego docker up`): the engine then stays until
    `lego docker down`, whoever uses it."""
    private = PrivateDockerd(docker_root)
    found = find_engine(host)
    if found is not None and found[0] != private.base_url:
        return DockerEngine(base_url=found[0], client=found[1], private=False, owned=False)
    if found is not None:
        found[1].close()  # this work dir's own engine, reached through DOCKER_HOST: leased like any other use
    can_start = start_private and sys.platform.startswith("linux") and os.geteuid() == 0
    with private.locked():
        owned = False
        client = ping(private.base_url)
        if client is None:
            if not can_start:
                raise _unreachable(host)
            private.start_managed()
            owned = True
            client = ping(private.base_url)
            assert client is not None
        if pin:
            private._mark("pinned", True)
            return DockerEngine(base_url=private.base_url, client=client, private=True, owned=owned,
                                docker_root=docker_root)
        lease = private.add_lease()
    return DockerEngine(base_url=private.base_url, client=client, private=True, owned=owned, lease=lease,
                        docker_root=docker_root)


def shut_down(docker_root: Path, force: bool = False) -> tuple[bool, list[int]]:
    """`lego docker down`: unpin the private engine and stop it unless live commands still hold it (then the
    last one out stops it); `force` stops it at once. Returns (stopped, pids still holding it)."""
    private = PrivateDockerd(docker_root)
    with private.locked():
        private._mark("pinned", False)
        if private.running_pid() is None:
            private._mark("managed", False)
            return False, []
        holders = sorted({int(lease.name.split(".")[0]) for lease in private.live_leases()})
        if holders and not force:
            private._mark("managed", True)  # now the last holder out (or the watchdog) stops it
            private.spawn_watchdog()
            return False, holders
        stopped = private.stop()
        private._mark("managed", False)
        return stopped, holders


@contextlib.contextmanager
def docker_engine(docker_root: Path, host: str | None = None, start_private: bool = True) -> Iterator[DockerEngine]:
    """An engine for the duration of the block, leased: a private dockerd stops when its last user is done
    (never while another command still uses it), unless `lego docker up` pinned it."""
    engine = connect(docker_root, host, start_private)
    previous = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = engine.base_url
    try:
        yield engine
    finally:
        if previous is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = previous
        engine.client.close()
        engine.release()


if __name__ == "__main__":  # python -m lego.sandbox.daemon watch <docker root>: the watchdog of a private engine
    if len(sys.argv) == 3 and sys.argv[1] == "watch":
        PrivateDockerd(Path(sys.argv[2])).watch()
    else:
        sys.exit("usage: python -m lego.sandbox.daemon watch <docker root>")
