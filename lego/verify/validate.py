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
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from lego.errors import ImageBuildError, tail
from lego.records import Outcome, OutcomeKind
from lego.sandbox.task_image import ensure_task_image
from lego.tasksets.task import Task
from lego.verify.grader import Verifier

PATCHES = ("gold", "empty")


@dataclass
class TaskValidation:
    instance_id: str
    gold: list[str] = field(default_factory=list)  # outcome kind of each run
    empty: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    evidence: dict[str, dict] = field(default_factory=dict)  # why, for each problem

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

    def to_dict(self) -> dict:
        return {"created_at": self.created_at, "runs": self.runs, "concurrency": self.concurrency,
                "seconds": round(self.seconds, 1), "tasks_total": len(self.tasks),
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


def _summary(outcome: Outcome) -> dict:
    evidence = outcome.evidence
    report = evidence.get("report") or {}
    return {"kind": outcome.kind.value, "check": evidence.get("check"), "attempts": outcome.attempts,
            "error": evidence.get("error"), "cheat_rules": outcome.cheat_rules,
            "failing": {name: sorted(group.get("failure", [])) for name, group in report.items()
                        if group.get("failure")},
            "log_tail": tail(outcome.test_log)}


def _prepare_images(verifier: Verifier, tasks: list[Task]) -> dict[str, str]:
    """Build each task image once, one at a time (tasks sharing an image would race); image errors by task."""
    errors = {}
    for task in tasks:
        try:
            ensure_task_image(verifier.client, task, verifier.base_image)
        except ImageBuildError as exc:
            errors[task.instance_id] = str(exc)
    return errors


def validate_tasks(verifier: Verifier, tasks: Iterable[Task], runs: int = 3, concurrency: int = 2,
                   console: Console | None = None) -> ValidationReport:
    """Grade gold and empty patches `runs` times for every task; `console` shows progress when given."""
    tasks = list(tasks)
    started = time.monotonic()
    results = {task.instance_id: TaskValidation(task.instance_id) for task in tasks}
    untested = {task.instance_id for task in tasks if not [name for name in task.FAIL_TO_PASS if name.strip()]}
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

    def grade(task: Task, patch: str) -> Outcome:
        return verifier.verify(task, diff=task.patch if patch == "gold" else "", actions=[])

    progress = Progress(TextColumn("[bold]validate[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("{task.description}"), console=console, disable=console is None)
    with progress, ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
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
        if task.instance_id in image_errors:
            continue
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
    return ValidationReport(list(results.values()), runs, concurrency, time.monotonic() - started)


def write_report(report: ValidationReport, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = report.created_at.replace(":", "").replace("-", "").replace("+0000", "Z")
    path = out_dir / f"tasks-validate-{stamp}.json"
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(report.to_dict(), indent=2))
    partial.replace(path)
    return path
