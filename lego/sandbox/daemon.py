"""Finding a Docker engine, or starting a private one.

The user's engine comes first (DOCKER_HOST, the config, the default socket). Where none answers
and we are root on Linux, a private dockerd is started with its own data root, pid file and socket
under the work dir, with no bridge network (sandboxes use network mode none), and stopped when the
code that started it is done.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
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

from lego.errors import DockerUnavailableError

DEFAULT_SOCKETS = ("unix:///var/run/docker.sock", "unix:///run/docker.sock")
START_TIMEOUT_S = 60.0


@dataclass
class DockerEngine:
    base_url: str
    client: docker.DockerClient
    private: bool  # a dockerd that Lego started (now or by an earlier `lego docker up`)
    owned: bool  # started by this process: stop it when done

    def env(self) -> dict[str, str]:
        return {"DOCKER_HOST": self.base_url}


def ping(base_url: str, timeout: float = 5.0) -> docker.DockerClient | None:
    try:
        client = docker.DockerClient(base_url=base_url, timeout=timeout)
        client.ping()
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
        tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
        self.stop()
        raise DockerUnavailableError(
            f"a private dockerd did not answer within {START_TIMEOUT_S:.0f}s; its log ({self.log}) ends with:\n{tail}"
        )

    def stop(self, timeout: float = 30.0) -> bool:
        pid = self.running_pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except OSError:
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


def connect(docker_root: Path, host: str | None = None, start_private: bool = True) -> DockerEngine:
    """Reach an engine: the user's, a private one already running, or a new private one."""
    found = find_engine(host)
    if found is not None:
        return DockerEngine(base_url=found[0], client=found[1], private=False, owned=False)
    private = PrivateDockerd(docker_root)
    if private.running_pid() is not None:
        client = ping(private.base_url)
        if client is not None:
            return DockerEngine(base_url=private.base_url, client=client, private=True, owned=False)
    can_start = start_private and sys.platform.startswith("linux") and os.geteuid() == 0
    if not can_start:
        raise DockerUnavailableError(
            "no Docker engine is reachable (tried "
            + ", ".join(_candidate_urls(host))
            + "); start Docker, set DOCKER_HOST, or run as root on Linux with Debian's docker.io installed "
            "so that Lego can start a private dockerd"
        )
    private.start()
    client = ping(private.base_url)
    assert client is not None
    return DockerEngine(base_url=private.base_url, client=client, private=True, owned=True)


@contextlib.contextmanager
def docker_engine(docker_root: Path, host: str | None = None, start_private: bool = True) -> Iterator[DockerEngine]:
    """An engine for the duration of the block; a private dockerd started here is stopped after."""
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
        if engine.owned:
            PrivateDockerd(docker_root).stop()
