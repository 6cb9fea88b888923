"""Harbor as a sandbox backend (`sandbox.backend: harbor`): rollout sandboxes are Harbor environments.

Harbor (PyPI `harbor`) needs Python >= 3.12 and Lego runs on 3.11, so Harbor is never imported here: each sandbox
is one process of lego/sandbox/harbor_bridge.py in Harbor's venv, which creates the environment through Harbor's
own factory (a built-in type or a custom environment class by import path), starts it, and stops and deletes it
when Lego closes the sandbox or dies (the bridge's stdin closes).

What Lego hands Harbor, per sandbox: an environment directory whose Dockerfile is `FROM <the task's Lego image>`
(the repository at base_commit and its pristine snapshot, built offline by lego/sandbox/task_image.py), and a
compose overlay with Lego's sandbox rules: network mode none, Lego's two unprivileged users (the keeper as the
container's user, every exec as the agent unless told), no capabilities and no-new-privileges, a read-only root,
the repository and the agent's home on size-capped tmpfs, CPU, memory and pids limits, and Lego's labels (so a
leaked container is reaped as any of Lego's). Harbor builds and starts it (`docker compose build/up`).

Everything after the start is Lego's, unchanged: the rollout (lego/rollout/attempt.py) runs the same harness
adapter, with the same proxy session, so tokens, log-probs and routing land in the same Trajectory records as with
the Docker backend; the harness reaches its session through the proxy tunnel over the engine's exec stream
(lego/sandbox/tunnel.py: the container has no network and shares no file system with the worker); the diff is
DockerSandbox's. Grading stays Lego's, in a fresh sandbox of its own.

Harbor's failures: an environment that cannot be created or started (a build error, Harbor's start timeout) is a
HarborEnvironmentError, a SandboxError, so the rollout retries it and ends `env_setup_failed` (`infra_error`),
never a model failure. Harbor job results (oracle, nop, other agents) are read by lego/sandbox/harbor_jobs.py.

Only Harbor's docker environment type is wired here: Lego's exec, diff and proxy tunnel ride the Docker engine's
exec stream, and Harbor's BaseEnvironment.exec returns output only when a command ends (no stream to carry a
tunnel), so a cloud environment type is refused with that reason rather than run without its proxy.
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import docker
from docker.errors import APIError, DockerException

from lego.config import HarborSandboxConfig, SandboxConfig
from lego.errors import LegoError, tail
from lego.sandbox import SandboxError
from lego.sandbox.docker_sandbox import (
    AGENT_HOME,
    AGENT_UID,
    KEEPER_UID,
    KEEPER_USER,
    LABEL,
    DockerSandbox,
    copy_pristine_repository,
    reap_stale_containers,
)
from lego.sandbox.harbor_env import harbor_process_env, harbor_venv
from lego.tasksets.task import Task

BRIDGE = Path(__file__).with_name("harbor_bridge.py")
MARKER = "LEGO_HARBOR "
SESSION_LABEL = "lego.harbor.session"
WIRED_TYPES = ("docker",)


class HarborUnavailable(LegoError):
    """Harbor's environment is missing or cannot drive this backend: a setup problem, said before any rollout."""


class HarborEnvironmentError(SandboxError):
    """Harbor could not create or start an environment (build failure, start timeout): infra, retried."""

    def __init__(self, message: str, error_type: str = "", stage: str = "environment_start"):
        super().__init__(message)
        self.error_type = error_type
        self.stage = stage


def _overlay(sandbox: SandboxConfig, workdir: str, labels: dict[str, str], mounts: dict[str, str]) -> dict:
    """Lego's sandbox rules as a compose overlay on Harbor's `main` service (see DockerSandboxFactory.open)."""
    owned = f"uid={AGENT_UID},gid={AGENT_UID}"
    return {"services": {"main": {
        "command": ["sleep", "infinity"], "entrypoint": [], "init": True, "network_mode": "none",
        "user": KEEPER_USER, "working_dir": "/", "read_only": True, "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges:true"], "pids_limit": sandbox.pids_limit,
        "mem_limit": sandbox.memory, "memswap_limit": sandbox.memory, "cpus": sandbox.cpus,
        "stop_signal": "SIGKILL", "environment": {"HOME": AGENT_HOME}, "labels": labels,
        "tmpfs": [f"{workdir}:size={sandbox.disk_limit_mb}m,exec,mode=755,{owned}",
                  f"{AGENT_HOME}:size=256m,exec,mode=700,{owned}", "/tmp:size=512m,exec,mode=1777",
                  "/var/tmp:size=64m,mode=1777", "/run:size=16m,mode=755",
                  # Harbor makes its log directories (/logs/agent, /logs/verifier) after the start.
                  "/logs:size=64m,mode=1777"],
        "volumes": [{"type": "bind", "source": host, "target": target, "read_only": True}
                    for host, target in mounts.items()],
    }}}


class _Bridge:
    """One harbor_bridge.py process: the environment lives as long as it does."""

    def __init__(self, python: Path, spec_path: Path, env: dict[str, str]):
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.log: list[str] = []
        try:
            self.process = subprocess.Popen([str(python), str(BRIDGE), str(spec_path)], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                            start_new_session=True)
        except OSError as exc:
            raise HarborUnavailable(f"cannot run Harbor's interpreter {python}: {exc}; rerun scripts/setup.sh "
                                    "or set sandbox.harbor.venv") from exc
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(MARKER):
                self.lines.put(line[len(MARKER):])
            else:
                self.log.append(line)
                del self.log[:-400]
        self.lines.put(None)

    def next_report(self, timeout: float) -> dict | None:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            return None
        return json.loads(line) if line is not None else None

    def stop(self, timeout: float = 120.0) -> dict | None:
        try:
            assert self.process.stdin is not None
            self.process.stdin.write("stop\n")
            self.process.stdin.close()
        except (OSError, ValueError):
            pass
        answer = self.next_report(timeout)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        return answer


class HarborSandbox(DockerSandbox):
    """A Harbor docker environment's main container, used as Lego's DockerSandbox; closing it stops Harbor's
    environment (compose down) through the bridge."""

    def __init__(self, client: docker.DockerClient, container, workdir: str, config: SandboxConfig,
                 bridge: _Bridge, scratch: Path, session_id: str):
        super().__init__(client, container, workdir, config)
        self.bridge = bridge
        self.scratch = scratch
        self.harbor_session = session_id

    def close(self) -> None:
        if self.closed:
            return
        try:
            super().close()  # the tunnel and the container: nothing of the agent's outlives the rollout
        finally:
            self.bridge.stop()
            shutil.rmtree(self.scratch, ignore_errors=True)


class HarborSandboxFactory:
    """lego.sandbox.SandboxFactory over Harbor environments (see the module's docstring)."""

    proxy_socket_uid = KEEPER_UID  # the tunnel's relay runs as the keeper, as with the Docker backend

    def __init__(self, client: docker.DockerClient, config: SandboxConfig, *, base_image: str, work_root: Path,
                 docker_host: str, reap: bool = True):
        self.client = client
        self.config = config
        self.harbor: HarborSandboxConfig = config.harbor
        self.base_image = base_image
        self.docker_host = docker_host
        if self.harbor.import_path is None and self.harbor.environment not in WIRED_TYPES:
            raise HarborUnavailable(
                f"sandbox.harbor.environment={self.harbor.environment!r}: only Harbor's docker environment is wired "
                "as Lego's sandbox backend. Lego's exec, diff and proxy tunnel ride the Docker engine's exec "
                "stream, and Harbor's BaseEnvironment.exec returns output only when a command ends; use "
                "environment: docker (any Docker engine, local or remote)")
        self.venv = Path(self.harbor.venv) if self.harbor.venv else harbor_venv(work_root)
        self.python = self.venv / "bin" / "python"
        if not self.python.is_file() or not any(self.venv.glob("lib/python3*/site-packages/harbor")):
            raise HarborUnavailable(f"no Harbor environment at {self.venv}: run scripts/setup.sh where a Python "
                                    ">= 3.12 exists, or set sandbox.harbor.venv / LEGO_HARBOR_VENV")
        self.env = harbor_process_env(self.venv, docker_host)
        self.opened: list[str] = []  # Harbor sessions this factory started (for reports and tests)
        if reap:
            reap_stale_containers(client)

    def open_task(self, task: Task, *, purpose: str, mounts: dict[str, str] | None = None,
                  proxy_socket_dir: Path | None = None, labels: dict[str, str] | None = None) -> HarborSandbox:
        from lego.sandbox.task_image import ensure_task_image

        image = ensure_task_image(self.client, task, self.base_image)
        workdir = task.environment.workdir
        session_id = f"lego-{purpose}-{secrets.token_hex(6)}"
        scratch = Path(tempfile.mkdtemp(prefix="lego-harbor-env-"))
        all_labels = {LABEL: "1", "lego.owner_pid": str(os.getpid()), "lego.host": socket.gethostname(),
                      "lego.purpose": purpose, "lego.backend": "harbor", SESSION_LABEL: session_id, **(labels or {})}
        try:
            environment_dir = scratch / "environment"
            environment_dir.mkdir()
            (environment_dir / "Dockerfile").write_text(f"FROM {image}\n", encoding="utf-8")
            overlay = scratch / "lego-sandbox.compose.json"
            overlay.write_text(json.dumps(_overlay(self.config, workdir, all_labels, mounts or {})), encoding="utf-8")
            spec = {"trial_dir": str(scratch / "trial"), "environment_dir": str(environment_dir),
                    "name": task.instance_id.lower().replace("/", "-"), "session_id": session_id,
                    "task_env": {"workdir": "/"}, "extra_docker_compose": [str(overlay)],
                    "type": self.harbor.environment, "import_path": self.harbor.import_path,
                    "options": dict(self.harbor.options), "start_timeout_s": self.harbor.start_timeout_s,
                    "force_build": self.harbor.force_build}
            spec_path = scratch / "spec.json"
            spec_path.write_text(json.dumps(spec), encoding="utf-8")
            bridge = _Bridge(self.python, spec_path, self.env)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        try:
            sandbox = self._started(bridge, task, workdir, scratch, session_id)
        except BaseException:
            bridge.stop()
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        self.opened.append(session_id)
        if proxy_socket_dir is not None:
            # The tunnel, always: Harbor owns the container's mounts, and the engine need not share this machine's
            # file system; the session's socket stays the only place the relay's connections go.
            sandbox.tunnel_socket_dir = Path(proxy_socket_dir)
        return copy_pristine_repository(sandbox, workdir)

    def _started(self, bridge: _Bridge, task: Task, workdir: str, scratch: Path, session_id: str) -> HarborSandbox:
        answer = bridge.next_report(self.harbor.start_timeout_s + 60)
        if answer is None or not answer.get("ok"):
            answer = answer or {}
            log = tail("".join(bridge.log))
            raise HarborEnvironmentError(
                f"Harbor failed at {answer.get('stage', 'environment_start')} for task {task.instance_id} ({self.harbor.import_path or self.harbor.environment}): "
                f"{answer.get('error_type', 'no answer')}: {tail(str(answer.get('error', '')), 1500)}; "
                f"bridge log: {log}", str(answer.get("error_type", "")), str(answer.get("stage", "environment_start")))
        deadline = time.monotonic() + 30
        while True:
            try:
                found = self.client.containers.list(filters={"label": f"{SESSION_LABEL}={session_id}"})
            except (APIError, DockerException) as exc:
                raise SandboxError(f"listing Harbor's containers failed: {exc}") from exc
            if found or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if len(found) != 1:
            raise HarborEnvironmentError(
                f"Harbor started session {session_id} but the engine at {self.docker_host or 'DOCKER_HOST'} shows "
                f"{len(found)} containers labelled for it: Harbor and Lego must use the same Docker engine")
        return HarborSandbox(self.client, found[0], workdir, self.config, bridge, scratch, session_id)
