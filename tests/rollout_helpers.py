"""Shared pieces of the harness and rollout tests: scripted gold solutions in each harness's tool format, engines,
and a rollout worker (proxy + sandbox factory + harness install) over the real Docker engine."""

from __future__ import annotations

import contextlib

import pytest

from lego.tasksets.task import Task


def tool_call(name: str, arguments: dict) -> str:
    from lego.harness.base import tool_call as write

    return write(name, arguments)


def gold_command(task: Task) -> str:
    from lego.harness.base import apply_patch_command

    return apply_patch_command(task.patch)


def gold_path(task: Task) -> str:
    return next(line[6:] for line in task.patch.splitlines() if line.startswith("+++ b/"))


def gold_edit(task: Task) -> tuple[str, str]:
    """The removed and the added lines of a one-hunk gold patch (a str_replace that applies it)."""
    body = [line for line in task.patch.splitlines() if not line.startswith(("---", "+++"))]
    return ("\n".join(line[1:] for line in body if line.startswith("-")),
            "\n".join(line[1:] for line in body if line.startswith("+")))


def gold_script(harness: str, task: Task) -> list[str]:
    """The gold solution as a scripted policy for `harness`: the adapter's own (shell tool, then its finish), except
    OpenHands, whose fix goes through its file editor here so that the edit must land in the container."""
    from lego.harness.base import get_harness

    if harness == "openhands":
        old, new = gold_edit(task)
        return ["Let me look first.\n" + tool_call("terminal", {"command": "git status --short && pwd"}),
                "I will fix it.\n" + tool_call("file_editor", {
                    "command": "str_replace", "path": f"{task.environment.workdir}/{gold_path(task)}",
                    "old_str": old, "new_str": new}),
                tool_call("finish", {"message": "The fix is applied."})]
    return get_harness(harness).gold_replies(gold_command(task))


def bundled_task(instance_id: str = "lego-bundled__unitconv-1") -> Task:
    from lego.tasksets.load import load_tasks

    tasks = {task.instance_id: task for task in load_tasks("bundled").tasks}
    return tasks[instance_id]


def installed(name: str):
    """The harness adapter and its install dir, or a skip saying why it cannot be installed here."""
    from lego.errors import LegoError
    from lego.harness.base import get_harness
    from lego.harness.install import ensure_installed

    adapter = get_harness(name)
    try:
        return adapter, ensure_installed(adapter)
    except LegoError as exc:
        pytest.skip(f"{name} cannot be installed here: {exc}")


@contextlib.asynccontextmanager
async def worker(config, work_dir, docker_engine, base_image, engine, harness: str):
    from lego.rollout.resources import rollout_resources

    async with rollout_resources(config, work_dir, engine, harness=harness, docker_client=docker_engine.client,
                                 docker_host=docker_engine.base_url, base_image=base_image) as pair:
        yield pair


def with_overrides(config, **sections):
    """A copy of `config` with some fields of some sections replaced: with_overrides(c, harness={"max_turns": 2})."""
    updates = {name: getattr(config, name).model_copy(update=values) for name, values in sections.items()}
    return config.model_copy(update=updates)
