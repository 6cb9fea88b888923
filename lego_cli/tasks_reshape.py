"""`lego tasks reshape`: a task set in SWE-bench's shape (the FAIL_TO_PASS tests added by test_patch, not at
base_commit). Its own module because lego_cli/__init__.py is near the 800-line limit; importing it registers it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from lego_cli import ConfigOption, Overrides, console, tasks_app


@tasks_app.command("reshape")
def tasks_reshape(
    out: Annotated[Path, typer.Option(help="Output directory: tasks.jsonl and repos/<name>.bundle.")],
    config: ConfigOption = "default",
    overrides: Overrides = None,
    source: Annotated[str | None, typer.Option(
        help="The task set to reshape: a tasks.jsonl of bundle tasks, or 'bundled' (default: tasks.source).")] = None,
) -> None:
    """Move each task's FAIL_TO_PASS test functions out of base_commit into its test_patch, as SWE-bench's are."""
    from lego.config import load_config
    from lego.tasksets.load import load_tasks
    from lego.tasksets.reshape import ID_SUFFIX, ReshapeError, ReshapeOutcome, swebench_shape

    cfg = load_config(config, overrides or [])
    source = source or cfg.tasks.source
    loaded = load_tasks(source, "all")
    for error in loaded.errors:
        console.print(f"[yellow]skipped malformed row[/] {escape(str(error))}")
    if not loaded.tasks:
        raise ReshapeError(f"task set {source} has no task to reshape; give a tasks.jsonl written by "
                           "`lego tasks synth` (--source PATH)")
    skipped: dict[str, str] = {}

    def progress(outcome: ReshapeOutcome) -> None:
        if outcome.task is None:
            skipped[outcome.instance_id] = outcome.skipped or ""
            console.print(f"[yellow]skipped[/] {escape(outcome.instance_id)}: {escape(outcome.skipped or '')}")
            return
        task = outcome.task
        moved = (f"{len(outcome.removed)} FAIL_TO_PASS function(s) moved from base_commit into test_patch"
                 if outcome.removed else "its test_patch already adds its FAIL_TO_PASS functions")
        console.print(f"[green]{escape(task.instance_id)}[/] {moved} ({len(task.FAIL_TO_PASS)} F2P, "
                      f"{len(task.PASS_TO_PASS)} P2P)")

    tasks = swebench_shape(loaded.tasks, out, progress)
    if not tasks:
        raise ReshapeError(f"none of the {len(loaded.tasks)} task(s) of {source} could be reshaped (reasons above); "
                           "reshape a task set of bundle tasks whose FAIL_TO_PASS ids name test functions")
    console.print(f"{len(tasks)} task(s) reshaped ({ID_SUFFIX} ids), {len(skipped)} skipped, "
                  f"{len(loaded.errors)} malformed row(s)")
    print(out / "tasks.jsonl")
