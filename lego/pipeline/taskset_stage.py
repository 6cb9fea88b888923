"""Stage `tasks`: the configured task set, split into training and evaluation lists."""

from __future__ import annotations

import json
from pathlib import Path

from lego.cache import content_hash
from lego.config import LegoConfig
from lego.errors import LegoError
from lego.pipeline.artifacts import StageContext, StageOutput, StageResult, run_cached
from lego.tasksets.task import Task, TaskSetError


def load_task_set(ctx: StageContext) -> list[Task]:
    """Every task of the configured source; the loader makes bundle paths absolute, so the tasks written below
    and read back by later stages find their bundles from anywhere."""
    from lego.tasksets.load import load_tasks

    loaded = load_tasks(ctx.config.tasks.source, split="all", strict=ctx.config.tasks.strict)
    for error in loaded.errors:
        ctx.log(f"tasks: skipped a malformed row: {error}")
    return list(loaded.tasks)


def split_tasks(ctx: StageContext, tasks: list[Task]) -> tuple[list[Task], list[Task]]:
    settings = ctx.config.tasks

    def pick(split: str, limit: int | None) -> list[Task]:
        chosen = [task for task in tasks if split == "all" or task.split == split]
        chosen.sort(key=lambda task: task.instance_id)
        return chosen[:limit] if limit else chosen

    return pick(settings.split, settings.limit), pick(settings.eval_split, ctx.config.eval.limit)


def write_tasks(path: Path, tasks: list[Task]) -> Path:
    path.write_text("".join(task.model_dump_json() + "\n" for task in tasks))
    return path


def read_tasks(path: str | Path) -> list[Task]:
    return [Task.model_validate_json(line) for line in Path(path).read_text().splitlines() if line.strip()]


def demonstrated(config: LegoConfig, train: list[Task]) -> list[Task]:
    """The training tasks the warm start demonstrates: the first `warmstart.tasks` of the split, in its order."""
    return train[:config.warmstart.tasks] if config.warmstart.tasks is not None else train


def practised(config: LegoConfig, train: list[Task]) -> list[Task]:
    """The training tasks RL's rollouts cover: all, or those the warm start did not demonstrate."""
    if config.rollout.practise_demonstrated:
        return train
    shown = {task.instance_id for task in demonstrated(config, train)}
    rest = [task for task in train if task.instance_id not in shown]
    if not rest:
        raise TaskSetError(f"rollout.practise_demonstrated is false and the warm start demonstrates all {len(train)} "
                           "training tasks: lower warmstart.tasks, or set rollout.practise_demonstrated: true")
    return rest


def run_taskset_stage(ctx: StageContext) -> StageResult:
    all_tasks = load_task_set(ctx)
    train, evaluation = split_tasks(ctx, all_tasks)
    contents = content_hash(*(task.model_dump_json() for task in train), "|eval|",
                            *(task.model_dump_json() for task in evaluation))
    inputs = {"tasks": ctx.config.section_dict("tasks"), "eval_limit": ctx.config.eval.limit,
              "contents": contents}

    def compute(directory: Path) -> StageOutput:
        from lego.data.writer import DatasetWriter

        if not train:
            raise LegoError(f"the task set {ctx.config.tasks.source!r} has no {ctx.config.tasks.split!r} task; "
                            "check tasks.source and tasks.split")
        DatasetWriter(ctx.work, f"tasks-{directory.name[:16]}").append_tasks(train + evaluation)
        summary = {"train": [t.instance_id for t in train], "eval": [t.instance_id for t in evaluation]}
        (directory / "summary.json").write_text(json.dumps(summary, indent=2))
        return StageOutput(
            metrics={"train_tasks": len(train), "eval_tasks": len(evaluation)},
            outputs={"train_tasks": write_tasks(directory / "train_tasks.jsonl", train),
                     "eval_tasks": write_tasks(directory / "eval_tasks.jsonl", evaluation),
                     "task_summary": directory / "summary.json"},
            data={"source": ctx.config.tasks.source},
        )

    return run_cached(ctx, "taskset", None, inputs, compute)
