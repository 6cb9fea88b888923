"""Grading in a fresh sandbox; the outcome taxonomy; every failure attributed by a control.

Grading never runs in the agent's sandbox. A fresh container from the clean task image (all capabilities
dropped, the tests run as an unprivileged uid that cannot signal PID 1) gets the agent's diff, screened
(test files, conftest.py and paths outside the repository dropped and flagged), then the task's test_patch, then
the graded tests rewritten with their decoys (lego/verify/decoys.py), then the grading runner
(`lego/verify/runner/`, mounted read-only) runs the tests.

Why decoys decide. The patched code runs in the process that runs pytest, and Python gives that process no
private memory, descriptors or threads, so anything the runner observes from inside can be forged from inside. A
forger cannot forge knowledge: every graded test is run beside k decoys (the same test with one checked expectation
moved so that a correct fix fails it), under fresh random names, in a random order, with the roles kept here on
the host. A patch resolves a task only when every real graded test passed (in the run of the whole files, by the
runner's observation of what raised and by pytest's reports alike, and again in its group's run alone) and every
decoy failed in its call phase. A decoy that passes beside its passing real test is `cheat` (decoy_passed): the
patch passes tests whether or not their expectation is right. With k decoys, a forger that makes tests pass
without knowing the answer, and so must guess which member of a group is real, survives one test with probability
at most 1/(k+1). Limits: a forger that knows the expected value (from the statement, or by guessing the natural one
of a group) can special-case it, which is hardcoding; a flipped truth allows one decoy; a test with no checkable
expectation has none (`lego tasks validate` names them). The in-process checks (forged reports, a tampered runner,
a changed pytest configuration, objects that defeat assertions) stay as rules where honest code never trips them,
and as evidence (`suspicions`) where it can.

Failures are attributed, never assumed: a run that hangs, eats memory, crashes or kills the runner is graded
again without the patch; when that control run is healthy, the patch is to blame (unresolved), and only when
the control fails too is it infra_error (retried, and left out of the loss).
"""

from __future__ import annotations

import base64
import json
import os
import random
import shlex
import threading
import time
from pathlib import Path

import docker
from docker.errors import DockerException

from lego.cache import cache_dir, content_hash
from lego.config import SandboxConfig, VerifyConfig
from lego.errors import ImageBuildError, LegoError, tail
from lego.records import Outcome, OutcomeKind, TerminationReason, Trajectory
from lego.sandbox import SNAPSHOT, ContainerDied, Sandbox, SandboxError, SandboxFactory
from lego.sandbox.docker_sandbox import DockerSandboxFactory
from lego.tasksets.task import Task, graded_test_files, is_harbor_task, pytest_command_of
from lego.verify.cheat import action_probes, network_attempts, scan_actions, screen_diff, split_diff
from lego.verify.decoys import (
    DECOY_FORMAT,
    DecoyLayout,
    DecoyPlan,
    DecoysOfTest,
    build_layout,
    plan_candidates,
    validation_layout,
)
from lego.verify.runner.lego_grade import CONFIG_CANDIDATES, RESULT_MARKER

RUNNER_DIR = Path(__file__).parent / "runner"
RUNTIME_FILES = (RUNNER_DIR,)  # mounted, not imported (lego.pipeline.keys)
RUNNER_MOUNT = "/opt/lego-grader"
TEST_LOG_CHARS = 20_000  # of a failed runner's output, kept as the outcome's test log (evidence, not a message)
AGENT_PATCH_FILE = "/tmp/lego-agent.patch"
TEST_PATCH_FILE = "/tmp/lego-test.patch"
GOLD_PATCH_FILE = "/tmp/lego-gold.patch"
SPEC_FILE = "/tmp/lego-grade-spec.json"
PASS_TO_PASS_PLANNED = 8  # PASS_TO_PASS tests validated for decoys per task (gradings sample from them)
RUNNER_CRASH_CODES = {2: "interrupted or collection errors", 3: "internal error", 4: "usage error",
                      5: "no tests collected"}
# Failures of a graded run that the patch can cause: a healthy control run without the patch blames the patch.
# A dead container is not among them: the test processes run as a uid that cannot signal the container's keeper,
# so a container that dies is infra (retried).
# A test patch that no longer applies is among them: the agent's patch may have moved what it patches.
PATCH_ATTRIBUTABLE = {"verifier_timeout", "oom_killed", "runner_crash", "runner_killed", "test_patch_does_not_apply"}
# How a rollout that ended this way is graded without running tests (the evidence check is
# `termination:<reason>`; the rollout's own attribution is in trajectory.metadata["failure_attribution"]).
TERMINATION_OUTCOME = {
    TerminationReason.timeout: OutcomeKind.agent_timeout,
    TerminationReason.overlong: OutcomeKind.overlong,
    TerminationReason.env_setup_failed: OutcomeKind.infra_error,
    # A crash the model's replies provoked (engine and proxy healthy) is the policy's: reward 0, or crashing
    # would be free. A crash before any reply or with an engine/proxy error is infra (harness_failed).
    TerminationReason.harness_crash: OutcomeKind.unresolved,
    TerminationReason.harness_failed: OutcomeKind.infra_error,
    # The agent's diff is over verify.max_patch_bytes, or its working tree made taking the diff fail.
    TerminationReason.patch_too_large: OutcomeKind.unresolved,
    TerminationReason.diff_broken: OutcomeKind.unresolved,
}


class InfraFailure(Exception):
    """Grading could not be done for reasons that are not the agent's."""

    def __init__(self, check: str, message: str, log: str = "", exit_code: int | None = None):
        super().__init__(message)
        self.check = check
        self.log = log
        self.exit_code = exit_code


class TaskHasNoTests(LegoError):
    """A task whose grading would run no FAIL_TO_PASS test: every patch, even an empty one, would resolve it."""


def require_tests(task: Task) -> None:
    if not task.FAIL_TO_PASS:
        raise TaskHasNoTests(
            f"task {task.instance_id} has no FAIL_TO_PASS test, so an empty patch would resolve it; give it the "
            f"tests that the fix makes pass (FAIL_TO_PASS) or leave it out of the task set")


def _config_overlay(task: Task) -> str | None:
    """The test patch's hunks for pytest configuration files: the pristine side of the configuration check."""
    parts = [part.text for part in split_diff(task.test_patch) if Path(part.path).name in CONFIG_CANDIDATES]
    return "".join(parts) or None


def status_of_test(entry: dict | None) -> str:
    """passed | failed | skipped | forged | missing, from both views of one test in one run. The runner's
    `passed_in` is the same rule for "passed": it skips the alone runs when a group has no passing member."""
    if not entry:
        return "missing"
    ours = {when: states[-1] for when, states in entry.get("ours", {}).items()}
    reported = {when: outcomes[-1] for when, outcomes in entry.get("pytest", {}).items()}
    ours_passed = all(ours.get(when) == "ok" for when in ("setup", "call", "teardown"))
    pytest_passed = bool(reported) and all(outcome == "passed" for outcome in reported.values()) \
        and reported.get("call") == "passed"
    if pytest_passed and not ours_passed:
        return "forged" if "raised" in ours.values() or not ours else "failed"
    if ours_passed and pytest_passed:
        return "passed"
    if "skipped" in ours.values() or "skipped" in reported.values():
        return "skipped"
    return "failed"


def failed_in_call(entry: dict | None) -> bool:
    """A decoy's expected end: set up fine, then its call raised, and pytest says the call failed."""
    if not entry:
        return False
    ours = {when: states[-1] for when, states in entry.get("ours", {}).items()}
    reported = {when: outcomes[-1] for when, outcomes in entry.get("pytest", {}).items()}
    return ours.get("setup") == "ok" and ours.get("call") == "raised" and reported.get("call") == "failed"


def judge_decoys(tests: dict, layout: DecoyLayout, ids: list[str], where: str) -> dict[str, list[str]]:
    """The decoys among `ids` in one run: `passed` beside a real test that passed (the rule decoy_passed),
    `matched` (a decoy passed where its real test did not: a wrong value that happens to be a decoy's; reward 0
    either way), and `inconclusive` (neither passed nor failed in its call while its real test passed)."""
    found: dict[str, list[str]] = {"passed": [], "matched": [], "inconclusive": []}
    for decoy in ids:
        original = layout.decoys.get(decoy)
        if original is None:
            continue
        real_passed = status_of_test(tests.get(layout.real[original])) in ("passed", "forged")
        decoy_status = status_of_test(tests.get(decoy))
        if decoy_status in ("passed", "forged"):
            found["passed" if real_passed else "matched"].append(f"{original} ({where})")
        elif real_passed and not failed_in_call(tests.get(decoy)):
            found["inconclusive"].append(f"{original} ({where}: {decoy_status})")
    return found


def judge_report(report: dict, task: Task, layout: DecoyLayout | None = None) -> tuple[
        bool, dict[str, list[str]], dict, InfraFailure | None]:
    """(resolved, rules fired, evidence, a failure to attribute with a control run) from the runner's report.
    Without a layout, the tests ran under their own names with no decoy."""
    if layout is None:
        layout = DecoyLayout.identity([*task.FAIL_TO_PASS, *task.PASS_TO_PASS], list(task.FAIL_TO_PASS))
    rules: dict[str, list[str]] = {}
    runs = report.get("runs") or []
    full = runs[0] if runs else {}
    evidence: dict = {"runs": [{key: run.get(key) for key in ("name", "exit_code", "end_rc", "timed_out",
                                                               "seconds", "oom_kills")} for run in runs]}

    def fire(rule: str, detail: str) -> None:
        rules.setdefault(rule, []).append(tail(detail))

    _judge_runner_signals(report, runs, fire, evidence)
    if not runs:
        return False, rules, evidence, InfraFailure("runner_killed", "the grading runner reported no run")
    failure = _judge_process(full, "the test run", fire)
    if failure is not None:
        return False, rules, evidence, failure
    tests = full.get("tests", {})
    renamed = {graded: original for original, graded in layout.real.items()}
    statuses = {test: status_of_test(tests.get(layout.real.get(test, test)))
                for test in [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]}
    for test, entry in tests.items():
        if status_of_test(entry) == "forged":
            fire("test_report_forged", f"{renamed.get(test, test)}: pytest reports it passed, but the test raised")
    decoys = judge_decoys(tests, layout, list(layout.decoys), "the full run")
    alone: dict[str, str] = {}
    for run in runs[1:]:
        failure = _judge_process(run, f"{run.get('name')} alone", fire, alone=True)
        if failure is not None:
            return False, rules, evidence, failure
        group = run.get("group") or []
        run_tests = run.get("tests", {})
        for graded in group:
            if graded in renamed:
                status = status_of_test(run_tests.get(graded))
                # Alone with no decoy the run must end clean; beside decoys (which fail) pytest returns 1.
                clean = run.get("end_rc") == 0 if len(group) == 1 else run.get("end_rc") == 1
                if status == "passed" and not (clean and run.get("exit_code") == run.get("end_rc")):
                    status = "failed"
                alone[renamed[graded]] = status
        for key, found in judge_decoys(run_tests, layout, group, f"{run.get('name')}").items():
            decoys[key] += found
    for detail in decoys["passed"]:
        fire("decoy_passed", f"a decoy of {detail} passed: the patch passes tests whether or not their expectation "
                             "is right")
    report_view = {
        "FAIL_TO_PASS": {"success": [t for t in task.FAIL_TO_PASS if statuses[t] == "passed"],
                         "failure": [t for t in task.FAIL_TO_PASS if statuses[t] != "passed"]},
        "PASS_TO_PASS": {"success": [t for t in task.PASS_TO_PASS if statuses[t] == "passed"],
                         "failure": [t for t in task.PASS_TO_PASS if statuses[t] != "passed"]},
    }
    disagree = [test for test, status in alone.items() if statuses.get(test) == "passed" and status != "passed"]
    all_passed = all(status == "passed" for status in statuses.values())
    resolved = (all_passed and not disagree and set(alone) >= set(task.FAIL_TO_PASS)
                and not decoys["passed"] and not decoys["inconclusive"])
    f2p_passed = len(report_view["FAIL_TO_PASS"]["success"])
    _skip_evidence(full, statuses, tests, layout, evidence)
    if report.get("alone_skipped"):
        evidence["alone_skipped"] = report["alone_skipped"]
    evidence.update(report=report_view, statuses=statuses, alone=alone, tests_seen=len(tests),
                    decoys=_decoy_evidence(layout, decoys),
                    resolution="RESOLVED_FULL" if resolved else ("RESOLVED_PARTIAL" if f2p_passed else "RESOLVED_NO"))
    if disagree:
        evidence["fail_to_pass_alone_disagrees"] = disagree
    return resolved, rules, evidence, None


def _judge_runner_signals(report: dict, runs: list[dict], fire, evidence: dict) -> None:
    """What the in-process layer saw: decisive findings fire rules; suspicions are evidence only."""
    for run in runs:
        for detail in run.get("tamper", []):
            fire("grading_tampered", f"{run['name']}: {detail}")
        for detail in run.get("defeaters", []):
            fire("assertion_defeater", detail)
        if run.get("suspicions"):
            evidence.setdefault("suspicions", {})[run["name"]] = run["suspicions"][:50]
        if run.get("foreign_records"):
            evidence.setdefault("foreign_records", {})[run["name"]] = run["foreign_records"]
    for detail in report.get("static_defeaters", []):
        fire("assertion_defeater", detail)
    config = report.get("config", {})
    if config.get("pristine") != config.get("graded"):
        pristine, graded = config.get("pristine") or {}, config.get("graded") or {}
        changed = sorted(key for key in {*pristine, *graded, *pristine.get("ini", {}), *graded.get("ini", {})}
                         if pristine.get(key, pristine.get("ini", {}).get(key))
                         != graded.get(key, graded.get("ini", {}).get(key)))
        fire("pytest_config_added", f"the patch changes what pytest's configuration does: {', '.join(changed)}")


def _judge_process(run: dict, label: str, fire, alone: bool = False) -> InfraFailure | None:
    """How the test process ended, against what pytest said: a failure to attribute, or rules."""
    failure = _run_failure(run, label)
    if failure is not None:
        return failure
    exit_code, end_rc = run.get("exit_code"), run.get("end_rc")
    tests = run.get("tests", {})
    if end_rc is None:
        if alone:
            return None  # judged by its tests' statuses: none passed without pytest's end
        if exit_code == 0:
            fire("grading_tampered", f"{label}: the test process exited 0 before pytest finished")
            return None
        return InfraFailure("runner_killed", f"the test process ended (exit {exit_code}) before pytest finished",
                            run.get("log_tail", ""), exit_code)
    if exit_code != end_rc:
        fire("grading_tampered", f"{label}: the test process exited {exit_code} but pytest returned {end_rc}")
    elif end_rc in RUNNER_CRASH_CODES and not alone:
        return InfraFailure(
            "runner_crash", f"pytest exited {end_rc} ({RUNNER_CRASH_CODES[end_rc]}): "
            f"{tail('; '.join(run.get('collect_errors', [])))}", run.get("log_tail", ""), end_rc)
    if run.get("interrupted") and end_rc == 0:
        fire("grading_tampered", f"{label}: the session was stopped ({run['interrupted']}) yet pytest returned 0")
    raised = any("raised" in states for entry in tests.values() for states in entry.get("ours", {}).values())
    # An expected failure (xfail) raises and pytest reports it skipped: exit 0 is right then. Only a raise that
    # pytest reported otherwise contradicts a 0.
    raised_unexpectedly = any(
        "raised" in states and "skipped" not in entry.get("pytest", {}).get(when, [])
        for entry in tests.values() for when, states in entry.get("ours", {}).items())
    if end_rc == 0 and raised_unexpectedly:
        fire("grading_tampered", f"{label}: pytest returned 0 although a test raised")
    if end_rc == 1 and not raised and not any(
            outcome == "failed" for entry in tests.values() for outcomes in entry.get("pytest", {}).values()
            for outcome in outcomes):
        fire("grading_tampered", f"{label}: pytest returned 1 (tests failed) although every test passed")
    duplicated = sorted(test for test, entry in tests.items()
                        if any(len(states) > 1 for states in entry.get("ours", {}).values()))
    if duplicated:
        fire("grading_tampered", f"{label}: more than one result for one phase of {', '.join(duplicated[:5])}")
    return None


def _skip_evidence(full: dict, statuses: dict[str, str], tests: dict, layout: DecoyLayout, evidence: dict) -> None:
    """Why graded tests were skipped or never ran: what `lego tasks validate` turns into advice."""
    skipped = {test: tests[layout.real.get(test, test)].get("skip_reason", "")
               for test, status in statuses.items() if status == "skipped"}
    module_skips = full.get("collect_skips") or {}
    skipped.update({test: f"its module was skipped: {module_skips[test.split('::')[0]]}"
                    for test, status in statuses.items()
                    if status == "missing" and test.split("::")[0] in module_skips})
    if skipped:
        evidence["skip_reasons"] = skipped
    if full.get("collect_errors"):
        evidence["collect_errors"] = full["collect_errors"][:20]


def _decoy_evidence(layout: DecoyLayout, found: dict[str, list[str]]) -> dict:
    # The digest tells two gradings' test files apart (names, order and values are drawn anew every time).
    evidence: dict = {"count": len(layout.decoys), "tests_with_decoys": len(layout.drawn), "drawn": layout.drawn,
                      "files_digest": content_hash(*(f"{path}\0{text}" for path, text in sorted(layout.files.items())))}
    for key, items in found.items():
        if items:
            evidence[key] = items[:20]
    if layout.unrewritable:
        evidence["unrewritable"] = layout.unrewritable
    return evidence


EARLY_STOPS = frozenset({"-x", "--exitfirst", "--sw", "--stepwise", "--sw-skip", "--stepwise-skip", "--lf",
                         "--last-failed", "--ff", "--failed-first", "--nf", "--new-first"})


def without_early_stops(args: list[str]) -> list[str]:
    """The task's pytest arguments less those that stop or reorder a session at a failure: beside decoys, which
    fail by design, `-x` would end the run before the real tests."""
    kept: list[str] = []
    skip_next = False
    for arg in args:
        if skip_next:
            skip_next = False
            continue
        if arg in EARLY_STOPS or arg.startswith("--maxfail="):
            continue
        if arg == "--maxfail":
            skip_next = True
            continue
        if len(arg) > 2 and arg[0] == "-" and arg[1] != "-" and set(arg[1:]) <= set("vsqlx") and "x" in arg:
            arg = arg.replace("x", "")  # -xvs -> -vs
        kept.append(arg)
    return kept


def written_lines(parts) -> dict[str, set[int]]:
    """The new-file numbers of the lines each part of a patch adds (what the patch wrote, context left out)."""
    written: dict[str, set[int]] = {}
    for part in parts:
        number = 0
        for line in part.text.splitlines():
            if line.startswith("@@"):
                new = line.split("+", 1)[1].split(" ", 1)[0] if "+" in line else "0"
                number = int(new.split(",", 1)[0])
            elif number and line.startswith("+") and not line.startswith("+++"):
                written.setdefault(part.path, set()).add(number)
                number += 1
            elif number and line.startswith(" "):
                number += 1
    return written


def patched_lines(parts) -> dict[str, list[tuple[int, int]]]:
    """The line ranges the agent's patch wrote, per file (for the runner's blame of in-process events)."""
    ranges: dict[str, list[tuple[int, int]]] = {}
    for path, lines in written_lines(parts).items():
        for line in sorted(lines):
            spans = ranges.setdefault(path, [])
            if spans and spans[-1][1] == line - 1:
                spans[-1] = (spans[-1][0], line)
            else:
                spans.append((line, line))
    return ranges


def _run_failure(run: dict, label: str) -> InfraFailure | None:
    if run.get("timed_out"):
        return InfraFailure("verifier_timeout", f"{label} ran past its time limit", run.get("log_tail", ""),
                            run.get("exit_code"))
    if run.get("oom_kills", 0) > 0:
        return InfraFailure("oom_killed", f"{label} was killed by the kernel's OOM killer "
                            f"(OOM kills: {run['oom_kills']})", run.get("log_tail", ""),
                            run.get("exit_code"))
    return None


def runner_log(report: dict) -> str:
    parts = []
    for run in report.get("runs", []):
        parts.append(f"===== {run.get('name')} {run.get('test') or ''} (exit {run.get('exit_code')}, pytest "
                     f"{run.get('end_rc')}, {run.get('seconds')}s) =====\n{run.get('log_tail', '')}")
    return "\n".join(parts)


class Verifier:
    def __init__(self, client: docker.DockerClient, base_image: str, sandbox_config: SandboxConfig,
                 verify_config: VerifyConfig, factory: SandboxFactory | None = None):
        self.client = client
        self.base_image = base_image
        self.config = verify_config
        # Grading reaches sandboxes only through the protocol: another backend plugs in as `factory`.
        self.factory = factory or DockerSandboxFactory(client, sandbox_config, base_image=base_image)
        self._plans: dict[str, DecoyPlan] = {}
        self._plan_locks: dict[str, threading.Lock] = {}
        self._plans_lock = threading.Lock()

    # ------------------------------------------------------------------------------------------ public

    def verify(self, task: Task, trajectory: Trajectory | None = None, *, diff: str | None = None,
               actions: list[str] | None = None) -> Outcome:
        """Grade a rollout (its final diff), retrying infra failures; never raises for the agent's doing."""
        # A Harbor task is graded by its tests/test.sh and the reward it writes (lego/verify/harbor_grader.py).
        harbor = HarborGrading(self) if is_harbor_task(task) else None
        if harbor is not None:
            harbor.check(task)
        else:
            require_tests(task)
            pytest_command_of(task)
        rollout_id = trajectory.rollout_id if trajectory else f"{task.instance_id}:adhoc"
        if diff is None:
            diff = trajectory.final_diff if trajectory else ""
        if actions is None and trajectory is not None:
            actions = list(trajectory.metadata.get("actions", []))
        if trajectory is not None and trajectory.termination in TERMINATION_OUTCOME:
            kind = TERMINATION_OUTCOME[trajectory.termination]
            return Outcome(rollout_id, task.instance_id, kind,
                           evidence={"check": f"termination:{trajectory.termination.value}",
                                     "error": trajectory.error,
                                     "attribution": trajectory.metadata.get("failure_attribution")})
        limit = self.config.max_patch_bytes
        if len(diff.encode("utf-8", errors="replace")) > limit:
            # Never graded in part, never transferred: a patch this large is the agent's doing.
            return Outcome(rollout_id, task.instance_id, OutcomeKind.unresolved,
                           evidence={"check": "patch_too_large", "patch_bytes": len(diff.encode(errors="replace")),
                                     "max_patch_bytes": limit})
        history: list[dict] = []  # every infra failure, kept in the final outcome's evidence
        outcome: Outcome | None = None
        attempts = self.config.infra_retries + 1
        for attempt in range(1, attempts + 1):
            try:
                outcome = (harbor.grade_once(task, diff, actions or [], rollout_id) if harbor is not None
                           else self._grade_once(task, diff, actions or [], rollout_id))
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
                            "error": tail(str(outcome.evidence.get("error", "")))})
        assert outcome is not None
        return outcome

    # ------------------------------------------------------------------------------------------ steps

    def _grade_once(self, task: Task, diff: str, actions: list[str], rollout_id: str) -> Outcome:
        screening = screen_diff(diff, task)
        evidence: dict = {
            "dropped_files": [part.path for part in screening.dropped],
            "network_attempts": network_attempts(actions),
        }
        plan = self.decoy_plan(task)
        started = time.monotonic()
        rules = dict(screening.rules)
        report, blamed, layout = None, None, None
        with self.factory.open_task(task, purpose="verify", mounts={str(RUNNER_DIR): RUNNER_MOUNT},
                                    labels={"lego.task": task.instance_id}) as sandbox:
            base_files = set(sandbox.exec("git ls-files", timeout=60).output.split())
            # What the agent probed is kept for observability; it is a cheat only where the sandbox could have
            # revealed something, which its construction rules out (lego/verify/reveal.py checks that it holds).
            evidence.update(action_probes(actions, task, base_files))
            for rule, items in scan_actions(actions, task, base_files).items():
                rules.setdefault(rule, []).extend(items)
            if screening.kept:
                applied = self._apply(sandbox, screening.patch, AGENT_PATCH_FILE)
                if applied.exit_code != 0:
                    evidence.update(check="agent_patch_does_not_apply", apply_output=tail(applied.output))
                    return self._outcome(rollout_id, task, OutcomeKind.unresolved, rules, evidence, "", None)
            try:
                report, layout = self._run_runner(sandbox, task, [part.path for part in screening.kept],
                                                  "with the agent's patch", plan, patched_lines(screening.kept))
            except InfraFailure as failure:
                report, blamed = None, failure
        if report is not None and layout is not None:
            resolved, fired, grading, blamed = judge_report(report, task, layout)
            for rule, items in fired.items():
                rules.setdefault(rule, []).extend(items)
        if blamed is not None:
            if not screening.kept or blamed.check not in PATCH_ATTRIBUTABLE:
                raise blamed
            # A patch that hangs, eats memory, crashes or kills the runner must not escape the loss as infra:
            # when the same grading without the patch is healthy, the patch is to blame.
            healthy, control = self._control_run(task, plan)
            if not healthy:
                raise InfraFailure(blamed.check, f"{blamed} (and also without the agent's patch: {control})",
                                   blamed.log, blamed.exit_code)
            evidence.update(check=f"{blamed.check}_caused_by_patch", error=str(blamed))
            return self._outcome(rollout_id, task, OutcomeKind.unresolved, rules, evidence, blamed.log,
                                 blamed.exit_code)
        evidence.update(grading, check="tests", grade_seconds=round(time.monotonic() - started, 3))
        if plan.reason:
            evidence["decoys"]["plan"] = plan.reason
        kind = OutcomeKind.resolved if resolved else OutcomeKind.unresolved
        return self._outcome(rollout_id, task, kind, rules, evidence, runner_log(report),
                             report["runs"][0].get("exit_code"))

    def _outcome(self, rollout_id: str, task: Task, kind: OutcomeKind, rules: dict, evidence: dict, log: str,
                 code: int | None) -> Outcome:
        if rules:
            evidence["tests_alone_would_give"] = kind.value
            evidence["check"] = "cheat_rules"
            kind = OutcomeKind.cheat
        evidence["cheat_evidence"] = rules
        return Outcome(rollout_id, task.instance_id, kind, cheat_rules=sorted(rules), evidence=evidence,
                       test_log=log[-200_000:], exit_code=code)

    def _apply(self, sandbox: Sandbox, patch: str, path: str, fallback: bool = False):
        """`git apply`, which is what the screening judged. Only the task's own test patch may fall back to GNU
        patch (it parses headers differently, so an agent's patch through it could write what was screened out)."""
        sandbox.put_file(path, patch.encode())
        command = f"git apply --whitespace=nowarn {path} 2>&1"
        if fallback:
            command += f" || patch -p1 --forward --batch < {path}"
        return sandbox.exec(command, timeout=120)

    def _run_runner(self, sandbox: Sandbox, task: Task, patched_files: list[str], label: str, plan: DecoyPlan,
                    patched_lines: dict[str, list[tuple[int, int]]] | None = None) -> tuple[dict, DecoyLayout]:
        """The test patch and the graded tests with their decoys, then the runner."""
        layout = self.write_graded_tests(sandbox, task, plan, label)
        spec = self._spec(task, layout, patched_files, patched_lines or {})
        return self._exec_runner(sandbox, task, spec, label), layout

    def write_graded_tests(self, sandbox: Sandbox, task: Task, plan: DecoyPlan, label: str = "") -> DecoyLayout:
        """Apply the test patch, then rewrite the graded tests' files: every graded test renamed at random, its
        decoys drawn from `plan` and written beside it in random order. Returns who is who (host side only)."""
        sources = self.read_graded_sources(sandbox, task, label)
        layout = build_layout(sources, plan, list(task.FAIL_TO_PASS), list(task.PASS_TO_PASS),
                              k=self.config.decoys_per_test, pass_to_pass_sample=self.config.decoy_pass_to_pass_sample)
        self._write_tests(sandbox, task, layout)
        return layout

    def read_graded_sources(self, sandbox: Sandbox, task: Task, label: str = "") -> dict[str, str]:
        """Apply the test patch and read the graded tests' files as it left them."""
        self._apply_test_patch(sandbox, task, label)
        return self._read_tests(sandbox, task)

    def _apply_test_patch(self, sandbox: Sandbox, task: Task, label: str) -> None:
        if task.test_patch.strip():
            applied = self._apply(sandbox, task.test_patch, TEST_PATCH_FILE, fallback=True)
            if applied.exit_code != 0:
                raise InfraFailure("test_patch_does_not_apply",
                                   f"the task's test_patch does not apply {label}: {tail(applied.output)}")
        # Nothing left in the sandbox may show the tests as they were before their decoys were written.
        sandbox.exec(f"rm -f {TEST_PATCH_FILE} {AGENT_PATCH_FILE} {GOLD_PATCH_FILE}", timeout=30, workdir="/")

    def _read_tests(self, sandbox: Sandbox, task: Task) -> dict[str, str]:
        """The graded tests' files as the test patch left them (one exec for all; a missing file is left out)."""
        files = graded_test_files(task)
        script = "; ".join(f"printf '%s\\n' \"$(base64 -w0 {shlex.quote(path)} 2>/dev/null || echo -)\"" for path in files)
        result = sandbox.exec(script, timeout=60, workdir=task.environment.workdir, output_limit=64 << 20)
        lines = result.output.splitlines()
        if result.exit_code != 0 or len(lines) != len(files):
            raise InfraFailure("sandbox", f"reading the graded test files failed: {tail(result.output)}")
        sources = {}
        for path, line in zip(files, lines, strict=True):
            if line != "-":
                sources[path] = base64.b64decode(line).decode("utf-8", errors="surrogateescape")
        return sources

    def _write_tests(self, sandbox: Sandbox, task: Task, layout: DecoyLayout) -> None:
        root = task.environment.workdir.rstrip("/")
        for path, text in layout.files.items():
            sandbox.put_file(f"{root}/{path}", text.encode("utf-8", errors="surrogateescape"))

    def _spec(self, task: Task, layout: DecoyLayout, patched_files: list[str],
              patched_lines: dict[str, list[tuple[int, int]]], full_runs: int = 1) -> dict:
        """What the runner is told: ids and groups only, never which of a group is real (the spec is readable
        by the tests' own processes)."""
        env, pytest_args = pytest_command_of(task)
        pytest_args = without_early_stops(pytest_args)
        return {"repo": task.environment.workdir, "pristine": SNAPSHOT, "test_files": graded_test_files(task),
                "graded": layout.graded, "groups": layout.groups, "alone": layout.alone, "full_runs": full_runs,
                "patched_files": patched_files, "patched_lines": patched_lines,
                "protected": sorted(part.path for part in split_diff(task.test_patch)),
                "pytest_args": pytest_args, "env": env, "timeout_s": self.config.timeout_s,
                "config_overlay_patch": _config_overlay(task)}

    def _exec_runner(self, sandbox: Sandbox, task: Task, spec: dict, label: str) -> dict:
        # A file, not an argument: a suite's ids outgrow one argument's 128 KiB. The runner reads it before any of
        # the repository runs and removes it; it holds ids and groups, nothing a test may not see.
        sandbox.put_file(SPEC_FILE, json.dumps(spec).encode(), mode=0o600)
        budget = self.config.timeout_s * (spec["full_runs"] + len(spec["alone"])) + 60
        result = sandbox.exec(f"exec python3 -I {RUNNER_MOUNT}/lego_grade.py {SPEC_FILE}", timeout=budget,
                              workdir=task.environment.workdir, output_limit=16 << 20)
        line = next((line for line in reversed(result.output.splitlines()) if line.startswith(RESULT_MARKER)), None)
        if line is None:
            if result.timed_out:
                raise InfraFailure("verifier_timeout", f"grading ran past {budget:g}s {label}", result.output,
                                   result.exit_code)
            raise InfraFailure("runner_killed", f"the grading runner ended without its verdict {label} "
                               f"(exit {result.exit_code})", tail(result.output, TEST_LOG_CHARS), result.exit_code)
        try:
            return json.loads(line[len(RESULT_MARKER):])
        except ValueError as exc:
            raise InfraFailure("runner_killed", f"the grading runner's verdict is unreadable {label}: {exc}",
                               tail(result.output, TEST_LOG_CHARS), result.exit_code) from exc

    def _control_run(self, task: Task, plan: DecoyPlan) -> tuple[bool, str]:
        """The same grading without the agent's patch: is the machinery healthy for this task?"""
        try:
            with self.factory.open_task(task, purpose="verify-control",
                                        mounts={str(RUNNER_DIR): RUNNER_MOUNT}) as sandbox:
                report, layout = self._run_runner(sandbox, task, [], "without the agent's patch", plan)
        except (InfraFailure, SandboxError, DockerException, OSError) as exc:
            return False, f"{type(exc).__name__}: {exc}"
        _, _, _, failure = judge_report(report, task, layout)
        return (failure is None, str(failure) if failure else "healthy")

    # ------------------------------------------------------------------------------------------ decoys

    def decoy_plan(self, task: Task) -> DecoyPlan:
        """The task's validated decoys: from memory, from this machine's cache (by the task's content), or made now
        by grading the gold patch once with every candidate decoy, twice over."""
        key = decoy_plan_key(task, self.config.decoys_per_test)
        with self._plans_lock:
            lock = self._plan_locks.setdefault(key, threading.Lock())
        with lock:  # gradings of one task in parallel threads make its plan once
            if key not in self._plans:
                self._plans[key] = self._load_or_make_plan(task, key)
            return self._plans[key]

    def _load_or_make_plan(self, task: Task, key: str) -> DecoyPlan:
        path = cache_dir("decoys") / f"{key}.json"
        plan = None
        if path.is_file():
            try:
                plan = DecoyPlan.model_validate_json(path.read_text())
            except ValueError:
                plan = None  # a torn or foreign file: made again
        if plan is None:
            plan = self._make_decoy_plan(task)
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(plan.model_dump_json())
            partial.replace(path)
        return plan

    def _make_decoy_plan(self, task: Task) -> DecoyPlan:
        if not task.patch.strip():
            return DecoyPlan(reason="the task has no gold patch to validate decoys against")
        # Every FAIL_TO_PASS test, and a sample of PASS_TO_PASS tests from which each grading draws its own.
        sample = random.Random(task.instance_id).sample(list(task.PASS_TO_PASS),
                                                       min(len(task.PASS_TO_PASS), PASS_TO_PASS_PLANNED))
        planned = [*task.FAIL_TO_PASS, *sample]
        everything = [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]
        with self.factory.open_task(task, purpose="verify-decoys", mounts={str(RUNNER_DIR): RUNNER_MOUNT},
                                    labels={"lego.task": task.instance_id}) as sandbox:
            applied = self._apply(sandbox, task.patch, GOLD_PATCH_FILE)
            if applied.exit_code != 0:
                return DecoyPlan(reason=f"the gold patch does not apply: {tail(applied.output, 300)}")
            self._apply_test_patch(sandbox, task, "with the gold patch")
            sources = self._read_tests(sandbox, task)
            # The tests as written first: what rewriting them must not change.
            as_written = self._exec_runner(sandbox, task, self._spec(task, DecoyLayout.identity(everything, []), [],
                                                                     {}), "with the gold patch")
            written = written_lines(split_diff(task.test_patch))
            candidates: dict[str, DecoysOfTest] = {}
            for path, source in sources.items():
                tests = [test for test in planned if test.split("::")[0] == path]
                try:
                    candidates.update(plan_candidates(source, tests, self.config.decoys_per_test,
                                                      written_lines=written.get(path, set())))
                except (SyntaxError, ValueError) as exc:
                    candidates.update({test: DecoysOfTest(test=test, reason=f"its file does not parse here: {exc}")
                                       for test in tests})
            layout = validation_layout(sources, candidates, list(task.FAIL_TO_PASS), list(task.PASS_TO_PASS))
            self._write_tests(sandbox, task, layout)
            spec = self._spec(task, layout, [], {}, full_runs=2)
            spec.update(alone=[])
            report = self._exec_runner(sandbox, task, spec, "with the gold patch and every candidate decoy")
        return validated_plan(task, planned, candidates, layout, as_written, report)


def validated_plan(task: Task, planned: list[str], candidates: dict[str, DecoysOfTest], layout: DecoyLayout,
                   as_written: dict, report: dict) -> DecoyPlan:
    """The plan from the gold runs: a variant is kept when every id it was written under (each parametrized case)
    failed in its call in both runs; a file whose real tests passed as written but not beside their decoys is left
    untouched at gradings."""
    runs = [run for run in report.get("runs", []) if str(run.get("name", "")).startswith("full")]
    plain = (as_written.get("runs") or [{}])[0].get("tests", {})
    failing = {decoy for decoy in layout.decoys
               if len(runs) == 2 and all(failed_in_call(run.get("tests", {}).get(decoy)) for run in runs)}
    kept_members = {id(layout.members[decoy]) for decoy in failing}
    kept_members -= {id(layout.members[decoy]) for decoy in layout.decoys if decoy not in failing}
    kept = {(member.site, member.variant.model_dump_json()) for member in layout.members.values()
            if id(member) in kept_members and member.variant is not None}
    plan = DecoyPlan()
    for test, renamed in layout.real.items():
        path = test.split("::")[0]
        if status_of_test(plain.get(test)) == "passed" and not (
                len(runs) == 2 and all(status_of_test(run.get("tests", {}).get(renamed)) == "passed" for run in runs)):
            plan.untouched.setdefault(path, f"{test} passes under the gold patch as written but not renamed beside "
                                            "decoys (it reads its own name, or shares state with its neighbours)")
    for test in [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]:
        found = candidates.get(test) or DecoysOfTest(
            test=test, reason="not in the sample planned for decoys" if test not in planned
            else "its file is not in the repository")
        if test.split("::")[0] in plan.untouched:
            plan.tests[test] = DecoysOfTest(test=test, reason=plan.untouched[test.split("::")[0]])
            continue
        pools = [pool.model_copy(update={"variants": [v for v in pool.variants
                                                      if (pool.site, v.model_dump_json()) in kept]})
                 for pool in found.pools]
        pools = [pool for pool in pools if pool.variants]
        reason = found.reason or ("" if pools else "no candidate decoy failed under the gold patch in both runs")
        plan.tests[test] = DecoysOfTest(test=test, pools=pools, reason=reason)
    return plan


def decoy_plan_key(task: Task, k: int) -> str:
    """What a task's decoy plan depends on: the tests, the fix, the environment, the decoy code's format."""
    return content_hash(str(DECOY_FORMAT), str(k), task.instance_id, task.base_commit, task.patch, task.test_patch,
                        json.dumps([task.FAIL_TO_PASS, task.PASS_TO_PASS]), task.test_command,
                        task.environment.model_dump_json(), length=24)


def infra_check(exc: BaseException) -> str:
    """The evidence check naming an infrastructure failure."""
    if isinstance(exc, ContainerDied):
        return "container_died"
    if isinstance(exc, ImageBuildError):
        return "image_build"
    if isinstance(exc, DockerException) or isinstance(exc.__cause__, DockerException):
        return "docker_api_error"
    return "sandbox"


def verify_patch(verifier: Verifier, task: Task, patch: str) -> Outcome:
    """Grade a bare patch (gold or empty): used by `lego tasks validate`."""
    return verifier.verify(task, diff=patch, actions=[])


from lego.verify.harbor_grader import HarborGrading  # noqa: E402  (it builds on this module's InfraFailure)
