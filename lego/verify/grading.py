"""The grading interface, and what its implementations share: infrastructure failures, patch application, and
how rules turn an outcome into a cheat.

Two gradings stand behind it as peers: lego/verify/pytest_grading.py (a SWE-bench-format task's FAIL_TO_PASS and
PASS_TO_PASS, with decoys, by the runner in lego/verify/runner/) and lego/verify/harbor_grading.py (a Harbor task's
tests/test.sh and the reward it writes). lego/verify/grader.py picks one per task and retries infra failures.
"""

from __future__ import annotations

import base64
import shlex
from typing import Protocol

from docker.errors import DockerException

from lego.errors import ImageBuildError, tail
from lego.records import Outcome, OutcomeKind
from lego.sandbox import ContainerDied, Sandbox, SandboxError
from lego.tasksets.task import Task
from lego.verify.cheat import action_probes, scan_actions

AGENT_PATCH_FILE = "/tmp/lego-agent.patch"
INLINE_BYTES = 96_000  # base64 bytes written through one command (an argument holds at most 128 KiB)
PATCH_NOT_WRITTEN, PATCH_NOT_WRITTEN_EXIT = "LEGO_PATCH_NOT_WRITTEN", 97
TEST_LOG_CHARS = 20_000  # of a failed runner's output, kept as the outcome's test log (evidence, not a message)
# Failures of a graded run that the patch can cause: a healthy control run without the patch blames the patch.
# A dead container is not among them: the test processes run as a uid that cannot signal the container's keeper,
# so a container that dies is infra (retried).
# A test patch that no longer applies is among them: the agent's patch may have moved what it patches.
PATCH_ATTRIBUTABLE = {"verifier_timeout", "oom_killed", "runner_crash", "runner_killed", "test_patch_does_not_apply"}


class Grading(Protocol):
    """One way of grading a kind of task. `grade_once` raises InfraFailure (or a sandbox or Docker error) for what
    is not the agent's doing; the Verifier retries those."""

    def check(self, task: Task) -> object:
        """Raise a LegoError when `task` cannot be graded this way at all (no tests, no test.sh)."""

    def grade_once(self, task: Task, diff: str, actions: list[str], rollout_id: str) -> Outcome:
        """One grading of the agent's diff in a fresh sandbox."""


class InfraFailure(Exception):
    """Grading could not be done for reasons that are not the agent's."""

    def __init__(self, check: str, message: str, log: str = "", exit_code: int | None = None):
        super().__init__(message)
        self.check = check
        self.log = log
        self.exit_code = exit_code



def infra_check(exc: BaseException) -> str:
    """The evidence check naming an infrastructure failure."""
    if isinstance(exc, ContainerDied):
        return "container_died"
    if isinstance(exc, ImageBuildError):
        return "image_build"
    if isinstance(exc, DockerException) or isinstance(exc.__cause__, DockerException):
        return "docker_api_error"
    return "sandbox"



def graded_outcome(rollout_id: str, task: Task, kind: OutcomeKind, rules: dict, evidence: dict, log: str,
             code: int | None) -> Outcome:
    if rules:
        evidence["tests_alone_would_give"] = kind.value
        evidence["check"] = "cheat_rules"
        kind = OutcomeKind.cheat
    evidence["cheat_evidence"] = rules
    return Outcome(rollout_id, task.instance_id, kind, cheat_rules=sorted(rules), evidence=evidence,
                   test_log=log[-200_000:], exit_code=code)



def apply_patch(sandbox: Sandbox, patch: str, path: str, fallback: bool = False):
    """`git apply`, which is what the screening judged. Only the task's own test patch may fall back to GNU
    patch (it parses headers differently, so an agent's patch through it could write what was screened out).
    A patch that fits in one command is written by the same exec that applies it."""
    command = f"git apply --whitespace=nowarn {path} 2>&1"
    if fallback:
        command += f" || patch -p1 --forward --batch < {path}"
    encoded = base64.b64encode(patch.encode()).decode()
    if len(encoded) > INLINE_BYTES:
        sandbox.put_file(path, patch.encode())
        return sandbox.exec(command, timeout=120)
    quoted = shlex.quote(path)
    result = sandbox.exec(f"{{ printf %s {encoded} | base64 -d > {quoted} && chmod 644 {quoted}; }} 2>&1 || "
                          f"{{ echo {PATCH_NOT_WRITTEN}; exit {PATCH_NOT_WRITTEN_EXIT}; }}; {command}", timeout=120)
    # The sandbox's failure, not the patch's (as put_file would raise it). By the status, which neither git nor
    # patch exits with, and the last line: the patch's own text or paths may hold the marker.
    if result.exit_code == PATCH_NOT_WRITTEN_EXIT and result.output.rstrip().endswith(PATCH_NOT_WRITTEN):
        raise SandboxError(f"writing {path} in the sandbox failed: {tail(result.output)}")
    return result



def apply_agent_patch(sandbox: Sandbox, task: Task, screening, actions: list[str], rules: dict, evidence: dict,
                      rollout_id: str) -> Outcome | None:
    """What every grading does first in its sandbox: the agent's probes judged against the files there, then its
    screened patch applied by git. An outcome (unresolved) when that patch does not apply, else None."""
    # The files at base_commit matter only to judge actions: a grading with none spares the exec.
    base_files = set(sandbox.exec("git ls-files", timeout=60).output.split()) if actions else set()
    # What the agent probed is kept for observability; it is a cheat only where the sandbox could have revealed
    # something, which its construction rules out (lego/verify/reveal.py checks that it holds).
    evidence.update(action_probes(actions, task, base_files))
    for rule, items in scan_actions(actions, task, base_files).items():
        rules.setdefault(rule, []).extend(items)
    if screening.kept:
        applied = apply_patch(sandbox, screening.patch, AGENT_PATCH_FILE)
        if applied.exit_code != 0:
            evidence.update(check="agent_patch_does_not_apply", apply_output=tail(applied.output))
            return graded_outcome(rollout_id, task, OutcomeKind.unresolved, rules, evidence, "", None)
    return None
