"""`lego tasks validate`: is every task gradeable?

Each task's gold patch and the empty patch are graded in fresh sandboxes, `runs` times each, a bounded
number at a time. A task is broken when its gold patch does not resolve, when the empty patch resolves
(the tests do not test the fix), when a patch's results differ between runs (flaky), or when grading
itself keeps failing (infra_error after retries). A task without a FAIL_TO_PASS test is broken without being
graded (`no_fail_to_pass`: any patch would resolve it; the loaders refuse such rows, this catches a task
built around them). The report is JSON under the work dir.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from docker.errors import DockerException
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from lego.errors import ImageBuildError, LegoError, tail
from lego.records import Outcome, OutcomeKind
from lego.sandbox.task_image import ensure_task_image
from lego.tasksets.task import Task, is_harbor_task
from lego.verify.grader import Verifier
from lego.verify.grading import InfraFailure
from lego.verify.harbor_grading import trust_boundary

PATCHES = ("gold", "empty")


@dataclass
class TaskValidation:
    instance_id: str
    gold: list[str] = field(default_factory=list)  # outcome kind of each run
    empty: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    evidence: dict[str, dict] = field(default_factory=dict)  # why, for each problem
    advice: list[str] = field(default_factory=list)  # what to change, in words (see `advise`)
    decoys: dict = field(default_factory=dict)  # decoy coverage (see `decoy_coverage`)
    reward_channel: str = ""  # a Harbor task: the reward file read, sealed or not, and the trust boundary left

    @property
    def broken(self) -> bool:
        return bool(self.problems)


@dataclass
class ValidationReport:
    tasks: list[TaskValidation]
    runs: int
    concurrency: int
    seconds: float
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    @property
    def broken(self) -> list[TaskValidation]:
        return [task for task in self.tasks if task.broken]

    def decoy_totals(self) -> dict:
        """FAIL_TO_PASS tests over all tasks: how many have k decoys that fail under gold, and how many none."""
        counts = [n for task in self.tasks for n in task.decoys.get("fail_to_pass", {}).values()]
        full = [n for task in self.tasks for n in task.decoys.get("fail_to_pass", {}).values()
                if n >= task.decoys.get("k", 2)]
        return {"fail_to_pass_tests": len(counts), "with_k_decoys": len(full),
                "with_no_decoy": sum(1 for n in counts if n == 0),
                "share_with_k_decoys": round(len(full) / len(counts), 4) if counts else None}

    def to_dict(self) -> dict:
        return {"created_at": self.created_at, "runs": self.runs, "concurrency": self.concurrency,
                "seconds": round(self.seconds, 1), "tasks_total": len(self.tasks), "decoys": self.decoy_totals(),
                "tasks_broken": len(self.broken), "broken": [task.instance_id for task in self.broken],
                "tasks": [asdict(task) for task in self.tasks]}


def classify(gold: list[str], empty: list[str]) -> list[str]:
    """The problems of a task given the outcome kinds of its gold and empty runs."""
    problems = []
    if OutcomeKind.infra_error.value in gold + empty:
        problems.append("infra_error")
    graded_gold = [kind for kind in gold if kind != OutcomeKind.infra_error.value]
    graded_empty = [kind for kind in empty if kind != OutcomeKind.infra_error.value]
    if len(set(graded_gold)) > 1 or len(set(graded_empty)) > 1:
        problems.append("flaky")
    if any(kind != OutcomeKind.resolved.value for kind in graded_gold):
        problems.append("gold_not_resolved")
    if OutcomeKind.resolved.value in graded_empty:
        problems.append("empty_resolves")
    return problems


_NO_MODULE = re.compile(r"No module named '([^']+)'")
_DEPENDENCY_HINT = ("a test that passed where the task was made but does not run in the sandbox usually lacks a "
                    "dependency there: declare it in the task's environment.requires (python: [\"name==version\"], "
                    "or debian: [...]), or in the task set's environments.json")


def advise(task: Task, outcome: Outcome) -> list[str]:
    """What a user can change, read from a gold run that did not resolve: graded tests skipped in the sandbox
    (with pytest's skip reason), tests never collected, modules the sandbox lacks."""
    evidence = outcome.evidence
    statuses: dict[str, str] = evidence.get("statuses") or {}
    reasons: dict[str, str] = evidence.get("skip_reasons") or {}
    advice = []
    for group in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        names = getattr(task, group)
        skipped = [test for test in names if statuses.get(test) == "skipped"]
        # A module skipped whole (pytest.importorskip at its top) leaves its tests uncollected, with pytest's reason.
        skipped += [test for test in names if statuses.get(test) == "missing" and test in reasons]
        by_reason: dict[str, list[str]] = {}
        for test in skipped:
            by_reason.setdefault(reasons.get(test) or "no reason given", []).append(test)
        for reason, tests in by_reason.items():
            advice.append(f"{len(tests)} {group} test(s) were skipped in the sandbox (e.g. {tests[0]}); pytest's "
                          f"skip reason: {reason!r}. {_DEPENDENCY_HINT[0].upper()}{_DEPENDENCY_HINT[1:]}")
        missing = [test for test in names if statuses.get(test) == "missing" and test not in reasons]
        if missing:
            advice.append(f"{len(missing)} {group} test(s) did not run in the sandbox at all (e.g. {missing[0]}): "
                          "their file failed to import or they are not collected there; " + _DEPENDENCY_HINT)
    text = " ".join([str(evidence.get("error") or ""), *map(str, evidence.get("collect_errors") or []),
                     outcome.test_log or ""])
    for module in sorted(set(_NO_MODULE.findall(text))):
        advice.append(f"the sandbox has no module {module!r} (ModuleNotFoundError while grading): add the "
                      f"package that provides it to environment.requires.python")
    return advice


def _summary(outcome: Outcome) -> dict:
    evidence = outcome.evidence
    report = evidence.get("report") or {}
    return {"kind": outcome.kind.value, "check": evidence.get("check"), "attempts": outcome.attempts,
            "error": evidence.get("error"), "cheat_rules": outcome.cheat_rules,
            "failing": {name: sorted(group.get("failure", [])) for name, group in report.items()
                        if group.get("failure")},
            "log_tail": tail(outcome.test_log)}


def decoy_coverage(verifier: Verifier, task: Task) -> dict:
    """How many decoys each graded test can have at a grading, and the tests no decoy could be made for (why)."""
    plan = verifier.pytest_grading.decoy_plan(task)
    k = verifier.config.decoys_per_test
    fail_to_pass = plan.coverage(list(task.FAIL_TO_PASS), k)
    pass_to_pass = plan.coverage(list(task.PASS_TO_PASS), k)
    without = {test: (plan.tests[test].reason if test in plan.tests else plan.reason) or "no decoy"
               for test, n in {**fail_to_pass, **pass_to_pass}.items() if n == 0}
    return {"k": k, "fail_to_pass": fail_to_pass, "fail_to_pass_with_k": sum(n >= k for n in fail_to_pass.values()),
            "pass_to_pass_with_decoys": sum(n > 0 for n in pass_to_pass.values()), "without": without,
            "plan": plan.reason}


def coverage_or_error(verifier: Verifier, task: Task) -> dict:
    """`decoy_coverage`, or why the task's plan could not be made (an engine error, a gold run past
    verify.timeout_s): that task's row says so and the other tasks go on."""
    try:
        return decoy_coverage(verifier, task)
    except (InfraFailure, LegoError, DockerException, OSError) as exc:
        return {"error": f"{type(exc).__name__}: {tail(str(exc))}"}


def _prepare_images(verifier: Verifier, tasks: list[Task]) -> dict[str, str]:
    """Build each task image once, one at a time (tasks sharing an image would race); image errors by task."""
    errors = {}
    for task in tasks:
        try:
            ensure_task_image(verifier.client, task, verifier.base_image)
        except ImageBuildError as exc:
            errors[task.instance_id] = str(exc)
    return errors


def _judge(verifier: Verifier, task: Task, result: TaskValidation,
           outcomes: dict[tuple[str, str], list[Outcome]]) -> None:
    """What the task's gradings say: its problems, a graded run as evidence of each, and advice where the task
    itself may be at fault."""
    if is_harbor_task(task):  # drawn by the gradings (cached): no run here
        try:
            result.reward_channel = trust_boundary(verifier.harbor_grading.profile(task))
        except (InfraFailure, LegoError, DockerException) as exc:
            result.reward_channel = f"unknown: {exc}"
    result.problems = classify(result.gold, result.empty)
    for problem in result.problems:
        patch = "empty" if problem == "empty_resolves" else "gold"
        runs_of = outcomes.get((task.instance_id, patch), [])
        if problem in ("infra_error", "flaky"):
            runs_of = [o for p in PATCHES for o in outcomes.get((task.instance_id, p), [])]
        wanted = {"gold_not_resolved": lambda o: o.kind != OutcomeKind.resolved,
                  "empty_resolves": lambda o: o.kind == OutcomeKind.resolved,
                  "infra_error": lambda o: o.kind == OutcomeKind.infra_error}.get(problem, lambda o: True)
        example = next((o for o in runs_of if wanted(o)), None)
        if example is not None:
            result.evidence[problem] = _summary(example)
            if problem in ("gold_not_resolved", "infra_error", "flaky"):
                result.advice += [line for line in advise(task, example) if line not in result.advice]


def validate_tasks(verifier: Verifier, tasks: Iterable[Task], runs: int = 3, concurrency: int = 2,
                   console: Console | None = None) -> ValidationReport:
    """Grade gold and empty patches `runs` times for every task; `console` shows progress when given."""
    tasks = list(tasks)
    started = time.monotonic()
    results = {task.instance_id: TaskValidation(task.instance_id) for task in tasks}
    # A Harbor task is graded by its tests/test.sh (lego/verify/harbor_grading.py), not by FAIL_TO_PASS.
    untested = {task.instance_id for task in tasks if not [name for name in task.FAIL_TO_PASS if name.strip()]
                and not is_harbor_task(task)}
    for instance_id in untested:
        results[instance_id].problems.append("no_fail_to_pass")
        results[instance_id].evidence["no_fail_to_pass"] = {
            "error": "no FAIL_TO_PASS test: zero FAIL_TO_PASS and PASS_TO_PASS tests count as a full pass, so any "
                     "patch (the empty one too) would resolve it; not graded"}
    tasks = [task for task in tasks if task.instance_id not in untested]
    image_errors = _prepare_images(verifier, tasks)
    for instance_id, error in image_errors.items():
        results[instance_id].problems.append("image_build")
        results[instance_id].evidence["image_build"] = {"error": tail(error)}
    jobs = [(task, patch, run) for task in tasks if task.instance_id not in image_errors
            for patch in PATCHES for run in range(runs)]
    outcomes: dict[tuple[str, str], list[Outcome]] = {}

    # A Harbor task's gold patch is what its solution/solve.sh (Harbor's oracle) does: taken once, before grading.
    golds: dict[str, str] = {}
    for task in tasks:
        if is_harbor_task(task) and not task.patch.strip() and task.instance_id not in image_errors:
            try:
                golds[task.instance_id] = verifier.harbor_grading.solution_diff(task)
            except (LegoError, DockerException) as exc:
                image_errors[task.instance_id] = f"no gold patch from solution/solve.sh: {exc}"

    def gold_of(task: Task) -> str:
        return golds.get(task.instance_id, task.patch)

    def grade(task: Task, patch: str) -> Outcome:
        return verifier.verify(task, diff=gold_of(task) if patch == "gold" else "", actions=[])

    progress = Progress(TextColumn("[bold]validate[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("{task.description}"), console=console, disable=console is None)
    with progress, ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        # Each task's decoys first (once, under its gold patch): the gradings that follow draw from them.
        planned = [task for task in tasks if task.instance_id not in image_errors and not is_harbor_task(task)]
        decoy_bar = progress.add_task("decoys", total=len(planned))
        plans = {pool.submit(coverage_or_error, verifier, task): task.instance_id for task in planned}
        for future in as_completed(plans):
            instance_id = plans[future]
            results[instance_id].decoys = future.result()
            progress.update(decoy_bar, advance=1, description=f"{instance_id} decoys")
        bar = progress.add_task("", total=len(jobs))
        futures = {pool.submit(grade, task, patch): (task.instance_id, patch) for task, patch, _ in jobs}
        for future in as_completed(futures):
            instance_id, patch = futures[future]
            outcomes.setdefault((instance_id, patch), []).append(future.result())
            progress.update(bar, advance=1, description=f"{instance_id} {patch}")

    for task in tasks:
        result = results[task.instance_id]
        for patch in PATCHES:
            kinds = [outcome.kind.value for outcome in outcomes.get((task.instance_id, patch), [])]
            setattr(result, patch, kinds)
        if task.instance_id not in image_errors:
            _judge(verifier, task, result, outcomes)
    return ValidationReport(list(results.values()), runs, concurrency, time.monotonic() - started)


def write_report(report: ValidationReport, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = report.created_at.replace(":", "").replace("-", "").replace("+0000", "Z")
    path = out_dir / f"tasks-validate-{stamp}.json"
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(report.to_dict(), indent=2))
    partial.replace(path)
    return path
