"""Grading in a fresh sandbox; the outcome taxonomy; infra failures told apart and retried.

Grading never runs in the agent's sandbox. A fresh container from the clean task image gets the agent's
diff (screened: test files and test configuration dropped and flagged), then the task's test_patch, then
runs the FAIL_TO_PASS and PASS_TO_PASS tests with `pytest -rA`, graded with the swebench package's log
parser and report functions. Failures of the machinery (image, container, daemon, a test patch that does
not apply, a runner that crashed or collected nothing, an OOM kill, a verifier timeout) are infra_error:
retried, and never reward 0.
"""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path

import docker
from docker.errors import DockerException

from lego.config import SandboxConfig, VerifyConfig
from lego.errors import ImageBuildError
from lego.records import Outcome, OutcomeKind, TerminationReason, Trajectory
from lego.sandbox.docker_sandbox import ContainerDied, DockerSandbox, DockerSandboxFactory, SandboxError
from lego.sandbox.task_image import ensure_task_image
from lego.tasksets.task import Task
from lego.verify.cheat import network_attempts, scan_actions, screen_diff

START = ">>>>> Start Test Output"
END = ">>>>> End Test Output"
TEST_OUTPUT = "/tmp/lego-test-output.log"
# The memory cgroup's OOM-kill counter (v2, then v1): an exit 137 is an OOM only when it went up.
OOM_KILLS = ("{ grep -s '^oom_kill ' /sys/fs/cgroup/memory.events || "
             "grep -s '^oom_kill ' /sys/fs/cgroup/memory/memory.oom_control || echo 'oom_kill 0'; } | "
             "awk '{print $2}'")
SUMMARY_HEADER = re.compile(r"^=+ short test summary info =+$")
SUMMARY_END = re.compile(r"^=+ .* =+$")
PATCH_ATTRIBUTABLE = {"verifier_timeout", "oom_killed"}
RUNNER_CRASH_CODES = {2: "interrupted or collection errors", 3: "internal error", 4: "usage error",
                      5: "no tests collected"}
TERMINATION_OUTCOME = {
    TerminationReason.timeout: OutcomeKind.agent_timeout,
    TerminationReason.overlong: OutcomeKind.overlong,
    TerminationReason.env_setup_failed: OutcomeKind.infra_error,
    TerminationReason.harness_crash: OutcomeKind.infra_error,
}


class InfraFailure(Exception):
    """Grading could not be done for reasons that are not the agent's."""

    def __init__(self, check: str, message: str, log: str = "", exit_code: int | None = None):
        super().__init__(message)
        self.check = check
        self.log = log
        self.exit_code = exit_code


def test_files_of(task: Task) -> list[str]:
    files = [test.split("::")[0] for test in [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]]
    return sorted(dict.fromkeys(f for f in files if f))


def summary_blocks(body: str) -> list[str]:
    """pytest's `-rA` short test summaries: from the header to the closing `=== N passed in Xs ===` line."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in body.splitlines():
        if SUMMARY_HEADER.match(line):
            current = []
            blocks.append(current)
        elif current is not None:
            if SUMMARY_END.match(line):
                current = None
            else:
                current.append(line)
    return ["\n".join(block) for block in blocks]


def grade_log(log: str, task: Task) -> tuple[bool, dict]:
    """Grade from pytest's short test summary only.

    Output that the code under test prints (captured sections, atexit handlers) cannot add status lines:
    lines outside a summary block are ignored, and a second summary block naming the graded tests (a
    forged one) is reported as `forged_summaries` for the caller to flag.
    """
    from swebench.harness.constants import ResolvedStatus
    from swebench.harness.grading import get_eval_tests_report, get_resolution_status
    from swebench.harness.log_parsers.python import parse_log_pytest

    body = log.split(START, 1)[-1].split(END, 1)[0]
    graded = {*task.FAIL_TO_PASS, *task.PASS_TO_PASS}
    blocks = summary_blocks(body)
    naming_graded = [block for block in blocks if graded & set(parse_log_pytest(block, None))]
    # pytest prints its summary last: grade the last block, which a forger can only follow, never precede,
    # and which is the real one whenever nothing was forged.
    status = parse_log_pytest(naming_graded[-1] if naming_graded else "", None)
    report = get_eval_tests_report(status, {"FAIL_TO_PASS": task.FAIL_TO_PASS, "PASS_TO_PASS": task.PASS_TO_PASS})
    resolution = get_resolution_status(report)
    return resolution == ResolvedStatus.FULL.value, {"resolution": resolution, "report": report,
                                                     "tests_seen": len(status),
                                                     "forged_summaries": max(0, len(naming_graded) - 1)}


class Verifier:
    def __init__(self, client: docker.DockerClient, base_image: str, sandbox_config: SandboxConfig,
                 verify_config: VerifyConfig, factory: DockerSandboxFactory | None = None):
        self.client = client
        self.base_image = base_image
        self.config = verify_config
        self.factory = factory or DockerSandboxFactory(client, sandbox_config)

    # ------------------------------------------------------------------------------------------ public

    def verify(self, task: Task, trajectory: Trajectory | None = None, *, diff: str | None = None,
               actions: list[str] | None = None, taskset_root: Path | None = None) -> Outcome:
        """Grade a rollout (its final diff), retrying infra failures; never raises for the agent's doing."""
        rollout_id = trajectory.rollout_id if trajectory else f"{task.instance_id}:adhoc"
        if diff is None:
            diff = trajectory.final_diff if trajectory else ""
        if actions is None and trajectory is not None:
            actions = list(trajectory.metadata.get("actions", []))
        if trajectory is not None and trajectory.termination in TERMINATION_OUTCOME:
            kind = TERMINATION_OUTCOME[trajectory.termination]
            return Outcome(rollout_id, task.instance_id, kind,
                           evidence={"check": f"termination:{trajectory.termination.value}",
                                     "error": trajectory.error})
        history: list[dict] = []  # every infra failure, kept in the final outcome's evidence
        outcome: Outcome | None = None
        for attempt in range(1, self.config.infra_retries + 2):
            try:
                outcome = self._grade_once(task, diff, actions or [], taskset_root, rollout_id)
            except InfraFailure as failure:
                outcome = Outcome(rollout_id, task.instance_id, OutcomeKind.infra_error,
                                  evidence={"check": failure.check, "error": str(failure)},
                                  test_log=failure.log, exit_code=failure.exit_code)
            except (SandboxError, ImageBuildError, DockerException, OSError) as exc:
                outcome = Outcome(rollout_id, task.instance_id, OutcomeKind.infra_error,
                                  evidence={"check": infra_check(exc), "error": f"{type(exc).__name__}: {exc}"})
            outcome.attempts = attempt
            if history:
                outcome.evidence["infra_history"] = list(history)
            if outcome.kind != OutcomeKind.infra_error:
                return outcome
            history.append({"attempt": attempt, "check": outcome.evidence["check"],
                            "error": str(outcome.evidence.get("error", ""))[:500]})
        assert outcome is not None
        return outcome

    # ------------------------------------------------------------------------------------------ steps

    def _grade_once(self, task: Task, diff: str, actions: list[str], taskset_root: Path | None,
                    rollout_id: str) -> Outcome:
        image = ensure_task_image(self.client, task, self.base_image, taskset_root)
        screening = screen_diff(diff, task)
        evidence: dict = {
            "dropped_files": [part.path for part in screening.dropped],
            "network_attempts": network_attempts(actions),
        }
        started = time.monotonic()
        with self.factory.open(image, task.environment.workdir, purpose="verify",
                               labels={"lego.task": task.instance_id}) as sandbox:
            base_files = set(sandbox.exec("git ls-files", timeout=60).output.split())
            rules = dict(screening.rules)
            for rule, items in scan_actions(actions, task, base_files).items():
                rules.setdefault(rule, []).extend(items)
            if screening.kept:
                applied = self._apply(sandbox, screening.patch, "/tmp/lego-agent.patch")
                if applied.exit_code != 0:
                    evidence.update(check="agent_patch_does_not_apply", apply_output=applied.output[-2000:])
                    return self._outcome(rollout_id, task, OutcomeKind.unresolved, rules, evidence, "", None)
            try:
                log, code = self._run_tests(sandbox, task, "with the agent's patch")
            except InfraFailure as failure:
                if failure.check not in PATCH_ATTRIBUTABLE or not screening.kept:
                    raise
                blamed = failure
            else:
                blamed = None
            if blamed is not None:
                # A patch that loops forever or eats memory must not escape the loss as an infra error:
                # when the tests finish without the patch, the patch is to blame.
                try:
                    self._control_run(task, image)
                except InfraFailure:
                    raise blamed from None
                evidence.update(check=f"{blamed.check}_caused_by_patch", error=str(blamed))
                return self._outcome(rollout_id, task, OutcomeKind.unresolved, rules, evidence, blamed.log,
                                     blamed.exit_code)
            origin = sandbox.exec("python3 -c 'import pytest; print(pytest.__file__)'", timeout=60).output.strip()
            if not origin.startswith("/usr/"):
                rules.setdefault("grading_tampered", []).append(f"pytest imported from {origin}")
        if code in RUNNER_CRASH_CODES:
            # Did the agent's patch break collection, or is the task/runner broken? A control run decides.
            control_log, control_code = self._control_run(task, image)
            if control_code in RUNNER_CRASH_CODES:
                raise InfraFailure("runner_crashed",
                                   f"pytest exited {code} ({RUNNER_CRASH_CODES[code]}) also without the agent's patch",
                                   log, code)
            evidence.update(check="runner_crash_caused_by_patch", control_exit_code=control_code)
            return self._outcome(rollout_id, task, OutcomeKind.unresolved, rules, evidence, log, code)
        resolved, grading = grade_log(log, task)
        if grading["forged_summaries"]:
            rules.setdefault("test_output_forged", []).append(
                f"{grading['forged_summaries'] + 1} short test summaries name the graded tests; pytest prints one")
        evidence.update(grading, check="tests", grade_seconds=round(time.monotonic() - started, 3))
        kind = OutcomeKind.resolved if resolved else OutcomeKind.unresolved
        return self._outcome(rollout_id, task, kind, rules, evidence, log, code)

    def _outcome(self, rollout_id: str, task: Task, kind: OutcomeKind, rules: dict, evidence: dict, log: str,
                 code: int | None) -> Outcome:
        if rules:
            evidence["tests_alone_would_give"] = kind.value
            evidence["check"] = "cheat_rules"
            kind = OutcomeKind.cheat
        evidence["cheat_evidence"] = rules
        return Outcome(rollout_id, task.instance_id, kind, cheat_rules=sorted(rules), evidence=evidence,
                       test_log=log[-200_000:], exit_code=code)

    def _apply(self, sandbox: DockerSandbox, patch: str, path: str):
        sandbox.put_file(path, patch.encode())
        return sandbox.exec(f"git apply --whitespace=nowarn {path} 2>&1 || patch -p1 --forward --batch < {path}",
                            timeout=120)

    def _run_tests(self, sandbox: DockerSandbox, task: Task, label: str) -> tuple[str, int]:
        if task.test_patch.strip():
            applied = self._apply(sandbox, task.test_patch, "/tmp/lego-test.patch")
            if applied.exit_code != 0:
                raise InfraFailure("test_patch_does_not_apply",
                                   f"the task's test_patch does not apply {label}: {applied.output[-1500:]}")
        files = " ".join(shlex.quote(f) for f in test_files_of(task))
        # The run writes to a file and only its tail is shown: pytest's summary is at the end, so a flood
        # of output from the code under test cannot push it out of the captured log.
        keep = max(16_384, sandbox.config.output_limit_bytes // 2)
        command = (f"oom_before=$({OOM_KILLS}); {task.test_command} {files} > {TEST_OUTPUT} 2>&1; code=$?; "
                   f"echo '{START}'; tail -c {keep} {TEST_OUTPUT}; echo; echo '{END}'; "
                   f"echo LEGO_EXIT=$code; echo LEGO_OOM_KILLS=$(( $({OOM_KILLS}) - oom_before )); exit $code")
        result = sandbox.exec(command, timeout=self.config.timeout_s)
        if result.timed_out:
            raise InfraFailure("verifier_timeout", f"the tests ran past {self.config.timeout_s:g}s", result.output,
                               result.exit_code)
        oom = re.search(r"^LEGO_OOM_KILLS=(\d+)", result.output, flags=re.M)
        if result.exit_code == 137 and oom and int(oom.group(1)) > 0:
            raise InfraFailure("oom_killed", f"the test run was killed by the kernel's OOM killer (memory limit "
                               f"{sandbox.config.memory})", result.output, 137)
        if END not in result.output:
            raise InfraFailure("runner_crashed", f"the test run ended without its end marker (exit {result.exit_code})",
                               result.output, result.exit_code)
        return result.output, result.exit_code

    def _control_run(self, task: Task, image: str) -> tuple[str, int]:
        with self.factory.open(image, task.environment.workdir, purpose="verify-control") as sandbox:
            return self._run_tests(sandbox, task, "without the agent's patch")


def infra_check(exc: BaseException) -> str:
    """The evidence check naming an infrastructure failure."""
    if isinstance(exc, ContainerDied):
        return "container_died"
    if isinstance(exc, ImageBuildError):
        return "image_build"
    if isinstance(exc, DockerException) or isinstance(exc.__cause__, DockerException):
        return "docker_api_error"
    return "sandbox"


def verify_patch(verifier: Verifier, task: Task, patch: str, taskset_root: Path | None = None) -> Outcome:
    """Grade a bare patch (gold or empty): used by `lego tasks validate`."""
    return verifier.verify(task, diff=patch, actions=[], taskset_root=taskset_root)
