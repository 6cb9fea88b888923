"""`lego bench decoy-sites`: how many FAIL_TO_PASS tests of a task set offer k candidate decoys, read offline.

The upper bound on decoy coverage before any gold run: each task's graded test files (its repository bundle at
base_commit, with the test patch applied) go through the same site finding and candidate generation a decoy plan
starts from (`plan_candidates`); validation (`lego tasks validate`) then keeps the candidates that fail under the
gold patch. Cheap (no Docker, no test run), so a change to site finding can be measured on every set at once.
Only tasks whose environment is a bundle are read; the others are counted as not read.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

from lego.bench import register
from lego.config import LegoConfig
from lego.tasksets.gitutil import apply_patch, clone
from lego.tasksets.load import load_tasks
from lego.tasksets.task import Task
from lego.verify.cheat import split_diff
from lego.verify.decoys import plan_candidates
from lego.verify.pytest_grading import written_lines
from lego.workdir import WorkDir


def candidate_decoys(task: Task, k: int) -> dict[str, int]:
    """FAIL_TO_PASS test id -> candidate decoys available (at most k), from the task's bundle."""
    with tempfile.TemporaryDirectory() as tmp:
        repo = clone(task.environment.bundle, Path(tmp) / "repo", task.base_commit)
        apply_patch(repo, task.test_patch)
        written = written_lines(split_diff(task.test_patch))
        by_file: dict[str, list[str]] = {}
        for test in task.FAIL_TO_PASS:
            by_file.setdefault(test.split("::")[0], []).append(test)
        found: dict[str, int] = {}
        for path, tests in by_file.items():
            try:
                plans = plan_candidates((repo / path).read_text(), tests, k, random.Random(0),
                                        written_lines=written.get(path, set()))
            except (OSError, SyntaxError, ValueError):
                plans = {}
            found.update({test: plans[test].available(k) if test in plans else 0 for test in tests})
        return found


@register("decoy-sites")
def bench_decoy_sites(config: LegoConfig, work: WorkDir) -> dict[str, Any]:
    k = config.verify.decoys_per_test
    tasks = load_tasks(config.tasks.source, "all", strict=True, limit=config.tasks.limit).tasks
    per_task: dict[str, dict[str, int]] = {}
    not_read = []
    for task in tasks:
        if task.environment.kind != "bundle" or not task.environment.bundle:
            not_read.append(task.instance_id)
            continue
        per_task[task.instance_id] = candidate_decoys(task, k)
    counts = [available for found in per_task.values() for available in found.values()]
    covered = sum(available >= k for available in counts)
    return {
        "task_source": str(config.tasks.source), "k": k, "tasks": len(tasks), "tasks_not_read": not_read,
        "fail_to_pass": len(counts), "with_k_candidates": covered,
        "fraction": round(covered / len(counts), 4) if counts else None,
        "short": sorted(f"{instance_id} {test}" for instance_id, found in per_task.items()
                        for test, available in found.items() if available < k),
    }
