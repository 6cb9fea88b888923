"""Sandboxes: where a harness acts and where grading runs.

Rollout (lego.rollout) and grading (lego.verify) use sandboxes only through the two protocols here, so that a second
backend (Harbor's environments, a remote machine) plugs in by implementing them: `SandboxFactory.open_task` gives a
`Sandbox` holding a task's repository at base_commit, whose relay exposes one proxy session on its own loopback.
The Docker backend is lego.sandbox.docker_sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from lego.errors import LegoError

if TYPE_CHECKING:
    from lego.tasksets.task import Task

# Every sandbox holds the task's pristine repository (base_commit's tree, no history) read-only here, beside the
# agent's writable copy at its workdir: the diff and the grader's control runs compare against it.
SNAPSHOT = "/opt/lego/repo"


class SandboxError(LegoError):
    """The sandbox itself failed (container died, daemon error): an infrastructure failure, never the agent's."""


class ContainerDied(SandboxError):
    """The container stopped while a command ran in it (killed, OOM-killed as a whole, daemon restart)."""


class ExecOutputLost(SandboxError):
    """A command ended normally but its output never fully reached us (the engine dropped the stream's tail: a
    known race of `docker exec` with short commands). Reading it as the command's output would be a false
    observation, and for the verifier a false verdict."""


class PatchTooLarge(LegoError):
    """The agent's diff is over the cap (verify.max_patch_bytes): it is not transferred, and never graded in part."""

    def __init__(self, message: str, cap: int):
        super().__init__(message)
        self.cap = cap


class DiffBrokenByAgent(LegoError):
    """Taking the diff failed because of the agent's working tree (the same procedure works on the pristine
    snapshot): the policy's failure, not infra."""


@dataclass
class ExecResult:
    exit_code: int
    output: str  # stdout and stderr interleaved, capped at the sandbox's output limit
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@runtime_checkable
class Sandbox(Protocol):
    """One isolated environment holding a task's repository at `workdir`."""

    workdir: str

    @property
    def name(self) -> str:
        """A human-readable name for messages and logs."""
        ...

    @property
    def sandbox_id(self) -> str:
        """What a harness running beside the sandbox needs to exec into it (a Docker container id)."""
        ...

    def exec(self, command: str, timeout: float | None = None, env: dict[str, str] | None = None,
             workdir: str | None = None, output_limit: int | None = None) -> ExecResult:
        """Run `command` with bash as the agent's user; output capped at `output_limit` bytes."""
        ...

    def is_running(self) -> bool: ...

    def start_proxy_relay(self, socket_name: str, port: int, session_id: str) -> str:
        """Expose the mounted proxy session socket on the sandbox's own loopback at `port`; returns the base URL
        once the proxy answers for `session_id` through it (raises SandboxError otherwise)."""
        ...

    def relay_status(self, port: int, session_id: str) -> tuple[str | None, str]:
        """(HTTP status or None, the answer's first line) of the proxy, for `session_id`, through the relay."""
        ...

    def put_file(self, path: str, data: bytes, mode: int = 0o644) -> None: ...

    def get_file(self, path: str) -> bytes: ...

    def diff(self, max_bytes: int | None = None) -> str:
        """The repository's changes against its base commit, as a git patch (binary-safe); over `max_bytes`
        it raises PatchTooLarge, and DiffBrokenByAgent when the agent's tree made taking it fail."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Sandbox: ...

    def __exit__(self, *exc) -> None: ...


@runtime_checkable
class SandboxFactory(Protocol):
    """Opens sandboxes for tasks (building or fetching what a task's environment needs)."""

    proxy_socket_uid: int  # the uid, inside a sandbox, that may connect to a mounted proxy session socket

    def open_task(self, task: Task, *, purpose: str, mounts: dict[str, str] | None = None,
                  proxy_socket_dir: Path | None = None, labels: dict[str, str] | None = None) -> Sandbox:
        """A fresh sandbox holding `task`'s repository at base_commit. `mounts`: host paths to read-only paths
        inside; `proxy_socket_dir`: the directory of one proxy session's socket, mounted read-only for the
        relay. Raises SandboxError (or ImageBuildError) for failures of the machinery."""
        ...
