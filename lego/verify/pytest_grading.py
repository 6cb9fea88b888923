"""Grading a SWE-bench-format task: its tests and their decoys, in a fresh sandbox, every failure attributed.

Grading never runs in the agent's sandbox. A fresh container from the clean task image (all capabilities
dropped, the tests run as an unprivileged uid that cannot signal PID 1) gets the agent's diff, screened
(test files, conftest.py and paths outside the repository dropped and flagged), then the task's test_patch, then
the graded tests rewritten with their decoys (lego/verify/decoys/), then the grading runner
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

from docker.errors import DockerException

from lego.cache import cache_dir, content_hash, sha256_file, tree_digest
from lego.config import VerifyConfig
from lego.errors import LegoError, tail
from lego.records import Outcome, OutcomeKind
from lego.sandbox import SNAPSHOT, Sandbox, SandboxError, SandboxFactory
from lego.tasksets.task import Task, graded_test_files, pytest_command_of
from lego.verify.cheat import network_attempts, screen_diff, split_diff
from lego.verify.decoys import (
    DECOY_FORMAT,
    DecoyLayout,
    DecoyPlan,
    DecoysOfTest,
    build_layout,
    plan_candidates,
    validation_layout,
)
from lego.verify.grading import (
    AGENT_PATCH_FILE,
    INLINE_BYTES,
    PATCH_ATTRIBUTABLE,
    TEST_LOG_CHARS,
    InfraFailure,
    apply_agent_patch,
    apply_patch,
    graded_outcome,
)
from lego.verify.judge import failed_in_call, judge_report, runner_log, status_of_test
from lego.verify.runner.lego_grade import CONFIG_CANDIDATES, RESULT_MARKER

RUNNER_DIR = Path(__file__).parent / "runner"
RUNTIME_FILES = (RUNNER_DIR,)  # mounted, not imported (lego.pipeline.keys)
RUNNER_MOUNT = "/opt/lego-grader"
TEST_PATCH_FILE = "/tmp/lego-test.patch"
GOLD_PATCH_FILE = "/tmp/lego-gold.patch"
SPEC_FILE = "/tmp/lego-grade-spec.json"
APPLY_LOG = "/tmp/lego-apply.log"
APPLY_FAILED = "LEGO_TEST_PATCH_DOES_NOT_APPLY"
PASS_TO_PASS_PLANNED = 4  # PASS_TO_PASS tests validated for decoys per task (gradings sample from them)


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



class PytestGrading:
    """Grades SWE-bench-format tasks: FAIL_TO_PASS and PASS_TO_PASS with their decoys, by the grading runner."""

    def __init__(self, factory: SandboxFactory, config: VerifyConfig):
        # Grading reaches sandboxes only through the protocol: another backend plugs in as `factory`.
        self.factory = factory
        self.config = config
        self._plans: dict[str, DecoyPlan] = {}
        self._plan_locks: dict[str, threading.Lock] = {}
        self._plans_lock = threading.Lock()

    def check(self, task: Task) -> None:
        require_tests(task)
        pytest_command_of(task)

    def grade_once(self, task: Task, diff: str, actions: list[str], rollout_id: str) -> Outcome:
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
            refused = apply_agent_patch(sandbox, task, screening, actions, rules, evidence, rollout_id)
            if refused is not None:
                return refused
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
            return graded_outcome(rollout_id, task, OutcomeKind.unresolved, rules, evidence, blamed.log,
                                 blamed.exit_code)
        evidence.update(grading, check="tests", grade_seconds=round(time.monotonic() - started, 3))
        if plan.reason:
            evidence["decoys"]["plan"] = plan.reason
        kind = OutcomeKind.resolved if resolved else OutcomeKind.unresolved
        return graded_outcome(rollout_id, task, kind, rules, evidence, runner_log(report),
                             report["runs"][0].get("exit_code"))

    def _run_runner(self, sandbox: Sandbox, task: Task, patched_files: list[str], label: str, plan: DecoyPlan,
                    patched_lines: dict[str, list[tuple[int, int]]] | None = None) -> tuple[dict, DecoyLayout]:
        """The test patch and the graded tests with their decoys, then the runner."""
        layout = self.layout_graded_tests(sandbox, task, plan, label)
        spec = self._spec(task, layout, patched_files, patched_lines or {})
        return self._exec_runner(sandbox, task, spec, label, layout), layout

    def layout_graded_tests(self, sandbox: Sandbox, task: Task, plan: DecoyPlan, label: str = "") -> DecoyLayout:
        """Apply the test patch and draw this grading's layout: every graded test renamed at random, its decoys
        drawn from `plan`, in random order where it stood. Returns who is who (host side only); the runner's exec
        writes the files."""
        sources = self.read_graded_sources(sandbox, task, label)
        return build_layout(sources, plan, list(task.FAIL_TO_PASS), list(task.PASS_TO_PASS),
                            k=self.config.decoys_per_test, pass_to_pass_sample=self.config.decoy_pass_to_pass_sample)

    def write_graded_tests(self, sandbox: Sandbox, task: Task, plan: DecoyPlan, label: str = "") -> DecoyLayout:
        """`layout_graded_tests`, with the files written (what the runner would find)."""
        layout = self.layout_graded_tests(sandbox, task, plan, label)
        root = task.environment.workdir.rstrip("/")
        self._write_files(sandbox, {f"{root}/{path}": text.encode("utf-8", errors="surrogateescape")
                                    for path, text in layout.files.items()})
        return layout

    def read_graded_sources(self, sandbox: Sandbox, task: Task, label: str = "") -> dict[str, str]:
        """Apply the test patch, delete every patch file (nothing left may show the tests as they were before their
        decoys are written), and read the graded tests' files as the patch left them: one exec for all of it (a
        missing file is left out)."""
        files = graded_test_files(task)
        reads = "; ".join(f"printf '%s\\n' \"$(base64 -w0 {shlex.quote(path)} 2>/dev/null || echo -)\"" for path in files)
        cleanup = f"rm -f {TEST_PATCH_FILE} {AGENT_PATCH_FILE} {GOLD_PATCH_FILE} {APPLY_LOG}"
        script = f"{cleanup}; {reads}"
        if task.test_patch.strip():
            encoded = base64.b64encode(task.test_patch.encode()).decode()
            if len(encoded) > INLINE_BYTES:
                sandbox.put_file(TEST_PATCH_FILE, task.test_patch.encode())
                write = "true"
            else:
                write = f"printf %s {encoded} | base64 -d > {TEST_PATCH_FILE}"
            script = (f"{write} && {{ git apply --whitespace=nowarn {TEST_PATCH_FILE} || patch -p1 --forward --batch "
                      f"< {TEST_PATCH_FILE}; }} > {APPLY_LOG} 2>&1 || {{ echo {APPLY_FAILED}; cat {APPLY_LOG}; "
                      f"{cleanup}; exit 0; }}; {script}")
        result = sandbox.exec(script, timeout=120, workdir=task.environment.workdir, output_limit=64 << 20)
        if APPLY_FAILED in result.output:
            raise InfraFailure("test_patch_does_not_apply", f"the task's test_patch does not apply {label}: "
                               f"{tail(result.output.split(APPLY_FAILED, 1)[1])}")
        lines = result.output.splitlines()
        if result.exit_code != 0 or len(lines) != len(files):
            raise InfraFailure("sandbox", f"reading the graded test files failed: {tail(result.output)}")
        return {path: base64.b64decode(line).decode("utf-8", errors="surrogateescape")
                for path, line in zip(files, lines, strict=True) if line != "-"}

    def _write_files(self, sandbox: Sandbox, files: dict[str, bytes]) -> None:
        """One exec for all the files when they fit in one command, one upload each otherwise."""
        encoded = {path: base64.b64encode(data).decode() for path, data in files.items()}
        if sum(map(len, encoded.values())) > INLINE_BYTES:
            for path, data in files.items():
                sandbox.put_file(path, data)
            return
        script = " && ".join(f"printf %s {text} | base64 -d > {shlex.quote(path)}" for path, text in encoded.items())
        result = sandbox.exec(script or "true", timeout=60, workdir="/")
        if result.exit_code != 0:
            raise SandboxError(f"writing the graded test files failed: {tail(result.output)}")

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

    def _exec_runner(self, sandbox: Sandbox, task: Task, spec: dict, label: str, layout: DecoyLayout) -> dict:
        """The rewritten test files and the runner's spec written, then the runner. The spec is a file, not an
        argument (a suite's ids outgrow one argument's 128 KiB); the runner reads it before any of the repository
        runs and removes it. It holds ids and groups, nothing a test may not see."""
        root = task.environment.workdir.rstrip("/")
        files = {f"{root}/{path}": text.encode("utf-8", errors="surrogateescape") for path, text in layout.files.items()}
        self._write_files(sandbox, {**files, SPEC_FILE: json.dumps(spec).encode()})
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
            applied = apply_patch(sandbox, task.patch, GOLD_PATCH_FILE)
            if applied.exit_code != 0:
                return DecoyPlan(reason=f"the gold patch does not apply: {tail(applied.output, 300)}")
            sources = self.read_graded_sources(sandbox, task, "with the gold patch")
            # The planned tests as written first: what rewriting them must not change. Only they run, here and
            # beside their candidates below: a plan does not pay for whole suites.
            as_written_layout = DecoyLayout.identity(everything, [])
            spec = self._spec(task, as_written_layout, [], {})
            spec.update(select=planned)
            as_written = self._exec_runner(sandbox, task, spec, "with the gold patch", as_written_layout)
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
            spec = self._spec(task, layout, [], {}, full_runs=2)
            chosen = {layout.real[test] for test in planned if test in layout.real}
            chosen |= {decoy for decoy, original in layout.decoys.items() if original in planned}
            spec.update(alone=[], select=[test for group in layout.groups for test in group if test in chosen])
            report = self._exec_runner(sandbox, task, spec, "with the gold patch and every candidate decoy", layout)
        cut = [str(run.get("name")) for result in (as_written, report) for run in result.get("runs", [])
               if run.get("timed_out")]
        if cut:
            # Tests a cut run never reached read as failing beside their decoys, which leaves whole files without
            # decoys: such a plan is not made (nor cached) at all.
            raise InfraFailure("verifier_timeout", f"the decoy plan's gold runs ran past verify.timeout_s "
                               f"({', '.join(cut)}); raise verify.timeout_s or plan on a less loaded machine")
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
                        *_environment_identity(task), length=24)


def _environment_identity(task: Task) -> list[str]:
    """The environment as a plan depends on it: a bundle by its bytes and a build context by its files, not by
    where they are kept, so the same task set at another path (another clone, a temporary copy, an export)
    finds its plans already made."""
    env = task.environment
    context = Path(env.dockerfile_dir) if env.kind == "dockerfile" and env.dockerfile_dir else None
    if context is not None and context.is_absolute() and context.is_dir():
        return [env.model_dump_json(exclude={"dockerfile_dir"}), tree_digest(context)]
    bundle = Path(env.bundle) if env.kind == "bundle" and env.bundle else None
    if bundle is None or not bundle.is_absolute() or not bundle.is_file():
        return [env.model_dump_json()]
    return [env.model_dump_json(exclude={"bundle"}), sha256_file(bundle)]


