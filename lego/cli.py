"""The `lego` command line. Thin: each command loads the config and calls into the library or a flow."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lego.errors import LegoError, NotBuiltYetError

console = Console(stderr=True)
app = typer.Typer(
    help="Lego: RL for coding agents on the exact harness they are deployed with.\n\n"
    "Pipeline: tasks -> filter -> rollout -> verify -> dataset -> train -> evaluate. "
    "Every command takes -c CONFIG and trailing key=value overrides (for example train.lr=1e-5).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
model_app = typer.Typer(help="Policy checkpoints.", no_args_is_help=True)
docker_app = typer.Typer(help="The Docker engine that runs sandboxes.", no_args_is_help=True)
tasks_app = typer.Typer(help="Task sets: list, synthesize, validate (part: Reliable execution).", no_args_is_help=True)
data_app = typer.Typer(help="Token datasets in DuckDB/Parquet (part: Token datasets).", no_args_is_help=True)
app.add_typer(model_app, name="model")
app.add_typer(docker_app, name="docker")
app.add_typer(tasks_app, name="tasks")
app.add_typer(data_app, name="data")

ConfigOption = Annotated[str, typer.Option("--config", "-c", help="Config name in configs/ or a YAML path.")]
Overrides = Annotated[list[str] | None, typer.Argument(help="Overrides: section.key=value ...", show_default=False)]


def _load(config: str, overrides: list[str] | None):
    from lego.config import load_config
    from lego.workdir import WorkDir

    cfg = load_config(config, overrides or [])
    return cfg, WorkDir.create(cfg.project.work_dir)


def _not_built(part: str) -> None:
    raise NotBuiltYetError(f"this command belongs to the {part} part of the pipeline and is not built yet")


@app.command()
def setup(config: ConfigOption = "default", overrides: Overrides = None) -> None:
    """Prepare a machine: Docker engine, sandbox base image, Qwen3 tokenizer, tiny policy checkpoint."""
    from lego.engine.checkpoint import default_model_path, init_tiny_model
    from lego.engine.tokenizer import ensure_tokenizer
    from lego.sandbox.daemon import docker_engine
    from lego.sandbox.image import ensure_base_image

    cfg, work = _load(config, overrides)
    console.print(f"work dir: {work.root}")
    path = ensure_tokenizer()
    console.print(f"[green]tokenizer[/] {path}")
    with docker_engine(work.docker_root, cfg.docker.host, cfg.docker.start_private_daemon) as engine:
        console.print(f"[green]docker[/] {engine.base_url} ({'private dockerd' if engine.private else 'user engine'})")
        tag = ensure_base_image(engine.client, cfg.docker, console)
        console.print(f"[green]base image[/] {tag}")
    model = init_tiny_model(cfg.model.init, default_model_path(cfg, work), seed=cfg.project.seed)
    console.print(f"[green]policy[/] {model}")


@app.command()
def doctor(config: ConfigOption = "default", overrides: Overrides = None) -> None:
    """Check everything a run needs; exit non-zero when something required is missing."""
    from lego.doctor import run_checks

    cfg, work = _load(config, overrides)
    checks = run_checks(cfg, work)
    table = Table(title="lego doctor")
    for column in ("check", "status", "detail", "fix"):
        table.add_column(column, overflow="fold")
    for check in checks:
        status = "[green]ok[/]" if check.ok else ("[red]MISSING[/]" if check.required else "[yellow]optional[/]")
        table.add_row(check.name, status, escape(check.detail), "" if check.ok else escape(check.fix))
    Console().print(table)
    if any(not check.ok and check.required for check in checks):
        raise typer.Exit(1)


@model_app.command("init")
def model_init(
    config: ConfigOption = "default",
    overrides: Overrides = None,
    out: Annotated[Path | None, typer.Option(help="Directory to write (default: the config's model path).")] = None,
    force: bool = False,
) -> None:
    """Write the seeded random-init tiny Qwen3-MoE checkpoint with the real Qwen3 tokenizer."""
    from lego.engine.checkpoint import default_model_path, init_tiny_model

    cfg, work = _load(config, overrides)
    path = init_tiny_model(cfg.model.init, out or default_model_path(cfg, work), seed=cfg.project.seed, force=force)
    print(path)


@docker_app.command("up")
def docker_up(config: ConfigOption = "default", overrides: Overrides = None) -> None:
    """Make sure an engine is reachable; start (and leave running) a private dockerd if needed."""
    from lego.sandbox.daemon import connect

    cfg, work = _load(config, overrides)
    engine = connect(work.docker_root, cfg.docker.host, cfg.docker.start_private_daemon)
    print(engine.base_url)


@docker_app.command("down")
def docker_down(config: ConfigOption = "default", overrides: Overrides = None) -> None:
    """Stop the private dockerd of this work dir, if one runs."""
    from lego.sandbox.daemon import PrivateDockerd

    _, work = _load(config, overrides)
    stopped = PrivateDockerd(work.docker_root).stop()
    console.print("stopped the private dockerd" if stopped else "no private dockerd was running")


@app.command()
def run(config: ConfigOption = "default", overrides: Overrides = None) -> None:
    """Run the whole pipeline (filter, rollout, verify, dataset, train, evaluate) for N iterations."""
    _not_built("pipeline")


@app.command()
def stage(
    name: Annotated[str, typer.Argument(help="filter | rollout | verify | dataset | train | evaluate")],
    config: ConfigOption = "default",
    overrides: Overrides = None,
    from_run: Annotated[str | None, typer.Option("--from", help="Reuse the cached artifacts of this run.")] = None,
    force: bool = False,
) -> None:
    """Rerun one stage alone from the cached artifacts of an earlier run."""
    _not_built("pipeline")


@tasks_app.command("list")
def tasks_list(config: ConfigOption = "default", overrides: Overrides = None) -> None:
    """List the configured task set."""
    _not_built("task sets (Reliable execution)")


@tasks_app.command("synth")
def tasks_synth(config: ConfigOption = "default", overrides: Overrides = None) -> None:
    """Make SWE-style tasks from a Python package by procedural bug injection."""
    _not_built("task sets (Reliable execution)")


@tasks_app.command("validate")
def tasks_validate(config: ConfigOption = "default", overrides: Overrides = None) -> None:
    """Run gold and empty patches for every task in sandboxes; report broken tasks."""
    _not_built("verification (Reliable execution)")


@data_app.command("show")
def data_show(config: ConfigOption = "default", overrides: Overrides = None) -> None:
    """Tables, sizes and per-iteration summaries of the DuckDB catalog."""
    from lego.data.catalog import Catalog

    cfg, work = _load(config, overrides)
    out = Console()
    with Catalog.open(work, cfg) as catalog:
        out.print(f"data: {work.data}   catalog: {catalog.path or 'in memory (catalog file locked)'}")
        tables = Table(title="tables")
        for column in ("table", "files", "on disk", "rows", "bytes/row"):
            tables.add_column(column, justify="left" if column == "table" else "right")
        entries = catalog.table_files()
        for entry in entries:
            rows = catalog.one(f"SELECT count(*) FROM {entry.table}")[0]
            per_row = f"{entry.bytes / rows:,.0f}" if rows else "-"
            tables.add_row(entry.table, str(entry.files), _human_bytes(entry.bytes), f"{rows:,}", per_row)
        out.print(tables)
        tokens = catalog.one("SELECT coalesce(sum(num_tokens), 0) FROM segments")[0]
        segment_bytes = sum(e.bytes for e in entries if e.table == "segments")
        if tokens:
            out.print(f"segments: {tokens:,} tokens, {segment_bytes / tokens:.1f} bytes/token on disk (routing included)")
        summary = catalog.rows("SELECT * FROM iteration_summary ORDER BY run_id, stage, iteration")
        iterations = Table(title="per iteration")
        columns = ("run_id", "stage", "iteration", "rollouts", "tokens", "resolved", "unresolved", "cheat",
                   "infra_error", "ungraded", "mean_reward")
        for column in columns:
            iterations.add_column(column, justify="left" if column in ("run_id", "stage") else "right")
        for row in summary:
            mean = row["mean_reward"]
            iterations.add_row(*(f"{row[c]:,}" if isinstance(row[c], int) else str(row[c]) for c in columns[:-1]),
                               "-" if mean is None else f"{mean:.3f}")
        if summary:
            out.print(iterations)
        else:
            out.print("no rollouts stored yet")


def _human_bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} TB"


@data_app.command("export")
def data_export(
    run_id: Annotated[str, typer.Option("--run", help="The run id whose data to export.")],
    iteration: Annotated[int, typer.Option("--iteration", help="The iteration whose training batch to export.")],
    out: Annotated[Path, typer.Option("--out", help="Directory to write rl_dataset.parquet and batch.npz to.")],
    config: ConfigOption = "default",
    overrides: Overrides = None,
) -> None:
    """Export a run's tasks as verl's RL parquet and an iteration's training batch as verl actor tensors."""
    from lego.data.catalog import Catalog
    from lego.data.export import export_iteration

    cfg, work = _load(config, overrides)
    with Catalog.open(work, cfg) as catalog:
        summary = export_iteration(catalog, run_id, iteration, out)
    print(json.dumps(summary, indent=2))


@app.command()
def deploy(config: ConfigOption = "default", overrides: Overrides = None) -> None:
    """Serve the pipeline and stage flows on cron schedules (Prefect deployments)."""
    _not_built("pipeline (deployments)")


@app.command()
def server(config: ConfigOption = "default", overrides: Overrides = None) -> None:
    """Start a local Prefect server and MLflow server on loopback for their UIs."""
    _not_built("pipeline (tracking)")


@app.command()
def compare(config: ConfigOption = "default", overrides: Overrides = None) -> None:
    """Compare harness runs and policy versions from MLflow (table + PNG)."""
    _not_built("evaluation (harness comparison)")


@app.command()
def status(config: ConfigOption = "default", overrides: Overrides = None) -> None:
    """Diagnose a running training: policy degradation versus environment trouble."""
    _not_built("observable training")


@app.command()
def bench(
    name: Annotated[str, typer.Argument(help="Benchmark name: sandbox | proxy | dataset | rollout | r3")],
    config: ConfigOption = "default",
    overrides: Overrides = None,
) -> None:
    """Run a benchmark and print its JSON result."""
    from lego.bench import run_benchmark

    cfg, work = _load(config, overrides)
    print(json.dumps(run_benchmark(name, cfg, work), indent=2))


def main() -> None:
    try:
        app()
    except LegoError as exc:
        console.print(f"[red]error:[/] {exc}")
        sys.exit(2)


if __name__ == "__main__":
    main()
