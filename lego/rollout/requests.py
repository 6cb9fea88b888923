"""What to run: one request per (task, sample), and the one rollout id format.

A rollout id is `<data run id>.<task id>.<sample index>`. The data run id names one stage's rollouts of one
iteration under one content key (see lego.pipeline), so the same request always gets the same id: a rerun after a
crash finds what was stored under it and runs only the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lego.tasksets.task import Task


def rollout_id(data_run_id: str, task_id: str, sample_index: int) -> str:
    return f"{data_run_id}.{task_id}.{sample_index}"


@dataclass(frozen=True)
class RolloutRequest:
    task_id: str
    sample_index: int
    rollout_id: str


def rollout_requests(data_run_id: str, tasks: Sequence[Task], samples: int) -> list[RolloutRequest]:
    """`samples` requests per task (a GRPO group per task), in task order."""
    return [RolloutRequest(task.instance_id, sample, rollout_id(data_run_id, task.instance_id, sample))
            for task in tasks for sample in range(samples)]
