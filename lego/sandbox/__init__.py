"""Sandboxes: where a harness acts and where grading runs. The protocol is small on purpose."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from lego.errors import LegoError


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

    def exec(self, command: str, timeout: float | None = None, env: dict[str, str] | None = None,
             workdir: str | None = None) -> ExecResult: ...

    def put_file(self, path: str, data: bytes, mode: int = 0o644) -> None: ...

    def get_file(self, path: str) -> bytes: ...

    def diff(self, max_bytes: int | None = None) -> str:
        """The repository's changes against its base commit, as a git patch (binary-safe); over `max_bytes`
        it raises PatchTooLarge, and DiffBrokenByAgent when the agent's tree made taking it fail."""
        ...

    def close(self) -> None: ...
