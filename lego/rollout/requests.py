"""What to run: one request per (task, sample), and the one rollout id format.

A rollout id is `<data run id>.<task id>.<sample index>`. The data run id names one stage's rollouts of one
iteration under one content key (see lego.pipeline), so the same request always gets the same id: a rerun after a
crash finds what was stored under it and runs only the rest.

Each request also carries the seed its sampling draws from (`attempt_seed`). Attempts that share a round, a task and
a sample index draw the same random numbers; the engines sample a token by an exponential race (the argmax of
p / Exp(1) noise), so a policy that gave the token it drew more probability draws it again. Each RL iteration's
rollouts are a round of their own; every evaluation of a run is one round (`EVALUATION_ROUND`), which no rollout
trains on: the evaluation before RL and the one after it pair attempt for attempt, and before -> after compares the
policies, not their luck (common random numbers), with neither side sampled from numbers the policy learned from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lego.cache import derived_seed
from lego.tasksets.task import Task


def rollout_id(data_run_id: str, task_id: str, sample_index: int) -> str:
    return f"{data_run_id}.{task_id}.{sample_index}"


EVALUATION_ROUND = "evaluation"


def round_seed(project_seed: int, round_name: int | str) -> int:
    """The base seed of one round of attempts: an RL iteration's rollouts (its index), or EVALUATION_ROUND."""
    return derived_seed("round", project_seed, round_name)


def attempt_seed(base: int, task_id: str, sample_index: int) -> int:
    return derived_seed("attempt", base, task_id, sample_index)


@dataclass(frozen=True)
class RolloutRequest:
    task_id: str
    sample_index: int
    rollout_id: str
    seed: int | None = None  # the attempt's sampling seed; None: the engine's own random stream


def rollout_requests(data_run_id: str, tasks: Sequence[Task], samples: int,
                     seed: int | None = None) -> list[RolloutRequest]:
    """`samples` requests per task (a GRPO group per task), in task order. `seed`: the round's base seed
    (`round_seed`), from which each attempt gets its own."""
    return [RolloutRequest(task.instance_id, sample, rollout_id(data_run_id, task.instance_id, sample),
                           None if seed is None else attempt_seed(seed, task.instance_id, sample))
            for task in tasks for sample in range(samples)]
