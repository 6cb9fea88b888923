"""The `lego` command line. Thin: each command loads the config and calls into the library (`lego`) or a Prefect
flow (`flows`). It lives outside `lego/` because it imports both: the library itself never imports Prefect."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lego.bench import MODULES as BENCHMARK_MODULES
from lego.errors import LegoError

if TYPE_CHECKING:
    from lego.pipeline.evaluation import PolicyEvaluation

console = Console(stderr=True)
app = typer.Typer(
    help="Lego: RL for coding agents on the exact harness they are deployed with.\n\n"
    "Pipeline: taskset -> warmstart -> filter -> rollout -> verify -> dataset -> train -> evaluate. "
    "Every command takes -c CONFIG and trailing key=value overrides (for example train.lr=1e-5).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
model_app = typer.Typer(help="Policy checkpoints.", no_args_is_help=True)
docker_app = typer.Typer(help="The Docker engine that runs sandboxes.", no_args_is_help=True)
tasks_app = typer.Typer(help="Task sets: list, synthesize, reshape, fetch SWE-bench, validate, export.",
                        no_args_is_help=True)
data_app = typer.Typer(help="Token datasets in DuckDB/Parquet.", no_args_is_help=True)
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


@app.command()
def setup(config: ConfigOption = "default", overrides: Overrides = None) -> None:
    """Prepare a machine: Docker engine, sandbox base image, Qwen3 tokenizer, tiny policy checkpoint."""
    from lego_cli.run_output import quiet_libraries

    quiet_libraries()  # one line per step, no third-party bars
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
    model = init_tiny_model(cfg.model.init, default_model_path(cfg, work), seed=cfg.project.seed,
                            on_progress=console.print)
    console.print(f"[green]policy[/] {model}")
    from lego.harness import get_harness
    from lego.harness.install import ensure_installed

    harness = ensure_installed(get_harness(cfg.harness.name), cfg.harness.version)
    console.print(f"[green]harness[/] {cfg.harness.name} at {harness}")


@app.command()
def doctor(
    config: ConfigOption = "default",
    overrides: Overrides = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the checks as JSON (ok, and each check's name, ok, "
                                                         "required, detail, fix).")] = False,
) -> None:
    """Check everything a run needs; exit non-zero when something required is missing."""
    import dataclasses

    from lego.doctor import run_checks

    cfg, work = _load(config, overrides)
    checks = run_checks(cfg, work)
    missing = any(not check.ok and check.required for check in checks)
    if as_json:
        print(json.dumps({"ok": not missing, "work_dir": str(work.root),
                          "checks": [dataclasses.asdict(check) for check in checks]}, indent=2))
        if missing:
            raise typer.Exit(1)
        return
    table = Table(title="lego doctor")
    for column in ("check", "status", "detail", "fix"):
        table.add_column(column, overflow="fold")
    for check in checks:
        status = "[green]ok[/]" if check.ok else ("[red]MISSING[/]" if check.required else "[yellow]optional[/]")
        table.add_row(check.name, status, escape(check.detail), "" if check.ok else escape(check.fix))
    Console().print(table)
    if missing:
        raise typer.Exit(1)


@model_app.command("init")
def model_init(
    config: ConfigOption = "default",
    overrides: Overrides = None,
    out: Annotated[Path | None, typer.Option(help="Directory to write (default: the config's model path).")] = None,
    force: bool = False,
) -> None:
    """Write the seeded random-init tiny Qwen3-MoE checkpoint with the real Qwen3 tokenizer (copy-pretrained when
    model.init.copy_pretraining says so)."""
    from lego.engine.checkpoint import default_model_path, init_tiny_model

    cfg, work = _load(config, overrides)
    path = init_tiny_model(cfg.model.init, out or default_model_path(cfg, work), seed=cfg.project.seed, force=force,
                           on_progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(path)


@docker_app.command("up")
def docker_up(config: ConfigOption = "default", overrides: Overrides = None) -> None:
    """Make sure an engine is reachable; start a private dockerd if needed and keep it until `lego docker down`."""
    from lego.sandbox.daemon import connect

    cfg, work = _load(config, overrides)
    engine = connect(work.docker_root, cfg.docker.host, cfg.docker.start_private_daemon, pin=True)
    print(engine.base_url)


@docker_app.command("down")
def docker_down(
    config: ConfigOption = "default",
    overrides: Overrides = None,
    force: Annotated[bool, typer.Option(help="Stop it now, even while other lego commands run sandboxes on it.")]
    = False,
) -> None:
    """Stop the private dockerd of this work dir; while other lego commands use it, the last of them stops it."""
    from lego.sandbox.daemon import shut_down

    _, work = _load(config, overrides)
    stopped, holders = shut_down(work.docker_root, force=force)
    if stopped:
        console.print("stopped the private dockerd" + (f" (still used by pids {holders})" if holders else ""))
    elif holders:
        console.print(f"the private dockerd is still used by lego processes {holders}: it stops when the last of "
                      "them ends (--force stops it now)")
    else:
        console.print("no private dockerd was running")


@app.command()
def run(
    config: ConfigOption = "default",
    overrides: Overrides = None,
    resume: Annotated[str | None, typer.Option("--resume", help="Continue this run id (its finished stages are "
                                                                "served from their artifacts).")] = None,
    force: Annotated[bool, typer.Option(help="Recompute every stage, ignoring cached artifacts.")] = False,
) -> None:
    """Run the whole pipeline (warm start, rollout, verify, dataset, train, evaluate) for N iterations.

    The terminal gets a line per stage and the summary; the full log is the run's run.log."""
    import contextlib
    import time

    from lego.config import _resolve_config_path
    from lego.pipeline.manifest import new_run_id
    from lego.pipeline.pipeline_run import RUN_LOGGER
    from lego.pipeline.prefect_env import configure_prefect_env
    from lego.pipeline.progress import show_progress_on
    from lego.pipeline.report import RUN_LOG
    from lego.termination import stop_on_sigterm
    from lego_cli.run_output import run_output

    cfg, work = _load(config, overrides)
    configure_prefect_env(work)
    stop_on_sigterm()
    run_id = resume or new_run_id()
    log_path = work.root / "runs" / run_id / RUN_LOG
    started = time.monotonic()
    with run_output(log_path, RUN_LOGGER) as out:
        out.echo(f"lego run {run_id} (config {config}; work dir {work.root})")
        out.echo(f"full log: {log_path}")
        show_progress_on(out.terminal)
        try:
            with contextlib.ExitStack() as stack:
                if cfg.pipeline.runner is None:
                    stack.enter_context(_embedded_setup(cfg, work, out))
                from flows.pipeline import pipeline_flow

                summary = pipeline_flow(config=str(_resolve_config_path(config)), overrides=list(overrides or []),
                                        run_id=run_id, resume=bool(resume), force=force)
            from lego_cli.run_summary import print_run_summary

            print_run_summary(cfg, work, summary, out, _cli_args(config, overrides), time.monotonic() - started)
        except BaseException as exc:
            out.echo(f"run {run_id} stopped: {type(exc).__name__}: {exc}")
            out.echo(f"the full log: {log_path}")
            raise
        finally:
            show_progress_on(None)


def _cli_args(config: str, overrides: list[str] | None) -> list[str]:
    """What another command needs to find this run: the config, and the overrides of where its work dir is."""
    args = [] if config == "default" else ["-c", config]
    return args + [item for item in overrides or [] if item.startswith("project.")]


def _embedded_setup(cfg, work, out=None, policy_needed: bool = True):
    """Docker engine (kept up for the whole run), sandbox base image, tokenizer, tiny policy if missing.
    `out`: a run's output (one line for the set-up); else each part is printed as it is ready. `policy_needed`
    False: the command brings its own policy (`lego eval --policy DIR`), so the configured one is not made (a
    copy-pretrained base takes hours)."""
    import concurrent.futures
    import contextlib
    import time

    from lego.engine.checkpoint import default_model_path, init_tiny_model
    from lego.engine.tokenizer import ensure_tokenizer
    from lego.harness import get_harness
    from lego.harness.install import ensure_installed
    from lego.sandbox.daemon import docker_engine
    from lego.sandbox.image import ensure_base_image

    def say(line: str) -> None:  # a long set-up step's progress (the copy pretraining of a model spec)
        if out is not None:
            out.echo(f"{'set-up':<12} {line}")
        else:
            console.print(escape(line))

    @contextlib.contextmanager
    def context():
        started = time.monotonic()
        terminal = out.terminal if out is not None else console
        if cfg.pipeline.task_runner == "ray" and cfg.pipeline.ray_address is not None:
            # A cluster: each worker's shards use that worker's engine and install their harness there; this
            # process (the head) samples and grades nothing itself.
            tokenizer = ensure_tokenizer()
            policy = None
            if cfg.model.path is None and policy_needed:
                policy = init_tiny_model(cfg.model.init, default_model_path(cfg, work), seed=cfg.project.seed,
                                         on_progress=say)
            parts = [f"Ray cluster {cfg.pipeline.ray_address} (each worker's own Docker engine)",
                     f"tokenizer {tokenizer}"] + ([f"policy {policy}"] if policy is not None else [])
            yield from _report_setup(parts, started, out, None)
            return
        # The run's harness and the tokenizer install beside the base image (on a first run each takes from
        # seconds to a minute, mostly waiting on package servers).
        pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="set-up")
        harness = pool.submit(ensure_installed, get_harness(cfg.harness.name), cfg.harness.version)
        tokenizer = pool.submit(ensure_tokenizer)
        pool.shutdown(wait=False)
        with docker_engine(work.docker_root, cfg.docker.host, cfg.docker.start_private_daemon) as engine:
            image = ensure_base_image(engine.client, cfg.docker, terminal)
            policy = None
            if cfg.model.path is None and policy_needed:
                policy = init_tiny_model(cfg.model.init, default_model_path(cfg, work), seed=cfg.project.seed,
                                         on_progress=say)
            parts = [f"Docker engine {engine.base_url}", f"base image {image}", f"tokenizer {tokenizer.result()}",
                     f"harness {cfg.harness.name} {harness.result()}"]
            parts += [f"policy {policy}"] if policy is not None else []
            yield from _report_setup(parts, started, out, engine)

    return context()


def _report_setup(parts: list[str], started: float, out, engine):
    import time

    if out is not None:
        out.echo(f"{'set-up':<12} {', '.join(parts)}  ({time.monotonic() - started:.1f} s)")
    else:
        for part in parts:
            console.print(f"[green]ready[/] {escape(part)}")
    yield engine


@app.command()
def status(
    arguments: Annotated[list[str] | None, typer.Argument(
        metavar="[RUN] [OVERRIDES]...", show_default=False,
        help="The run id (default: the newest run of the work dir), then overrides section.key=value ...")] = None,
    config: ConfigOption = "default",
    as_json: Annotated[bool, typer.Option("--json", help="Print the diagnosis as JSON.")] = False,
    stall_minutes: Annotated[float | None, typer.Option(
        help="A running run without progress for this many minutes is stalled (default 15).")] = None,
) -> None:
    """Diagnose a live or finished run: named signatures (log-prob mismatch, infra errors, no learning signal,
    tool-call collapse, stalls ...), each with its evidence and what to check. Exits 1 when a finding is an error."""
    from lego.pipeline.diagnosis import STALL_MINUTES, diagnose, format_diagnosis

    # A run id never contains '=': the first plain argument is the run, the key=value ones are overrides.
    runs = [item for item in arguments or [] if "=" not in item]
    if len(runs) > 1:
        raise typer.BadParameter(f"one run at a time; got {', '.join(runs)}")
    cfg, work = _load(config, [item for item in arguments or [] if "=" in item])
    diagnosis = diagnose(work, cfg, runs[0] if runs else "latest",
                         stall_minutes=STALL_MINUTES if stall_minutes is None else stall_minutes)
    if as_json:
        print(diagnosis.model_dump_json(indent=2))
    else:
        print(format_diagnosis(diagnosis))
    if diagnosis.has_errors:
        raise typer.Exit(1)


@app.command()
def ui(
    arguments: Annotated[list[str] | None, typer.Argument(
        metavar="[RUN]... [OVERRIDES]...", show_default=False,
        help="Run ids to show (default: every run of the work dir), then overrides section.key=value ...")] = None,
    config: ConfigOption = "default",
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1 (0: a free one).", min=0, max=65535)] = 8050,
    refresh: Annotated[float, typer.Option(help="Seconds between refreshes while a run is live.")] = 5.0,
    mlflow_ui: Annotated[str | None, typer.Option(
        help="MLflow UI base URL for links (default: the tracking server, or `lego server`'s on port 5000).")] = None,
) -> None:
    """A live dashboard of one run or several on loopback: overview, live rollouts, fidelity, task grid,
    token-level trajectories, logs, harness comparison. Ctrl-C stops it."""
    from lego.ui import serve

    # As in `lego status`: a run id never contains '='; the key=value arguments are overrides.
    runs = [item for item in arguments or [] if "=" not in item]
    cfg, work = _load(config, [item for item in arguments or [] if "=" in item])
    server = serve(work, cfg, runs or None, port=port, refresh_s=refresh, mlflow_ui=mlflow_ui)
    shown = ", ".join(runs) if runs else f"every run in {work.root / 'runs'}"
    console.print(f"Lego dashboard  {server.url}   ({shown}; Ctrl-C stops it)", soft_wrap=True)
    print(server.url, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()


@app.command()
def stage(
    name: Annotated[str, typer.Argument(help="taskset | warmstart | filter | baseline | rollout | verify | dataset | train | evaluate")],
    config: ConfigOption = "default",
    overrides: Overrides = None,
    from_run: Annotated[str | None, typer.Option("--from", help="Reuse the cached artifacts of this run "
                                                               "('latest': the newest run).")] = "latest",
    iteration: Annotated[int, typer.Option(help="The iteration of an iterated stage.")] = 0,
    force: bool = False,
) -> None:
    """Rerun one stage alone from the cached artifacts of an earlier run."""
    import contextlib

    from lego.config import _resolve_config_path
    from lego.pipeline.prefect_env import configure_prefect_env
    from lego.termination import stop_on_sigterm

    cfg, work = _load(config, overrides)
    configure_prefect_env(work)
    stop_on_sigterm()
    with contextlib.ExitStack() as stack:
        if cfg.pipeline.runner is None and name in ("warmstart", "filter", "baseline", "rollout", "verify", "evaluate"):
            stack.enter_context(_embedded_setup(cfg, work))
        from flows.pipeline import stage_flow

        summary = stage_flow(stage=name, config=str(_resolve_config_path(config)), overrides=list(overrides or []),
                             from_run=from_run, iteration=iteration, force=force)
    info = summary.get("stage") or {}
    console.print(f"run {summary['run_id']} (from {from_run}): {name} "
                  f"{'served from cache' if info.get('cached') else 'computed'} -> {info.get('path')}")
    print(json.dumps(summary, indent=2, default=str))


@tasks_app.command("list")
def tasks_list(
    config: ConfigOption = "default",
    overrides: Overrides = None,
    split: Annotated[str | None, typer.Option(help="train | eval | all (default: tasks.split).")] = None,
) -> None:
    """List the configured task set (tasks.source) with each task's split, difficulty and test counts."""
    from lego.config import load_config
    from lego.tasksets.load import load_configured

    cfg = load_config(config, overrides or [])
    loaded = load_configured(cfg.tasks, split)
    table = Table(title=f"tasks: {cfg.tasks.source} ({split or cfg.tasks.split})")
    for column in ("id", "repo", "split", "difficulty", "#F2P", "#P2P"):
        table.add_column(column, overflow="fold", justify="right" if column.startswith("#") else "left")
    for task in loaded.tasks:
        table.add_row(task.instance_id, task.repo, task.split, task.difficulty or "-",
                      str(len(task.FAIL_TO_PASS)), str(len(task.PASS_TO_PASS)))
    Console(width=max(Console().width, 140)).print(table)
    for error in loaded.errors:
        console.print(f"[yellow]skipped[/] {error}")
    console.print(f"{len(loaded.tasks)} task(s), {len(loaded.errors)} malformed row(s) skipped")


@tasks_app.command("synth")
def tasks_synth(
    config: ConfigOption = "default",
    overrides: Overrides = None,
    package: Annotated[Path | None, typer.Option(help="A package source directory with a pytest suite.")] = None,
    pypi: Annotated[str | None, typer.Option(help="NAME==VERSION: download its sdist from PyPI.")] = None,
    out: Annotated[Path, typer.Option(help="Output directory: tasks.jsonl and repos/<name>.bundle.")] = Path(
        "synth-tasks"),
    max_tasks: Annotated[int, typer.Option(min=1)] = 5,
    max_candidates: Annotated[int, typer.Option(min=1, help="Mutations to try at most.")] = 60,
    seed: Annotated[int | None, typer.Option(help="Mutation order seed (default: project.seed).")] = None,
    split: str = "train",
    p2p_sample: Annotated[int | None, typer.Option(
        min=1, help="Keep a seeded sample of this many PASS_TO_PASS tests (default: every passing test).")] = None,
) -> None:
    """Make SWE-style tasks from a Python package by procedural bug injection."""
    from lego.config import load_config
    from lego.tasksets.synth import synthesize

    cfg = load_config(config, overrides or [])
    report = synthesize(package_dir=package, requirement=pypi, out_dir=out, max_tasks=max_tasks,
                        max_candidates=max_candidates, seed=cfg.project.seed if seed is None else seed, split=split,
                        p2p_sample=p2p_sample)
    for task in report.tasks:
        prov = task.provenance
        console.print(f"[green]{task.instance_id}[/] {prov['operator']} in {prov['file']}:{prov['function']} "
                      f"({len(task.FAIL_TO_PASS)} F2P, {len(task.PASS_TO_PASS)} P2P)")
    console.print(f"{len(report.tasks)} task(s) from {report.candidates_tried} mutation(s) tried "
                  f"({report.undetected} undetected, {len(report.rejected)} rejected)")
    print(report.tasks_file)


@tasks_app.command("swebench")
def tasks_swebench(
    which: Annotated[str, typer.Argument(help="verified | lite")],
    out: Annotated[Path, typer.Option(help="The JSONL task set to write (then tasks.source=OUT).")],
    config: ConfigOption = "default",
    overrides: Overrides = None,
    limit: Annotated[int | None, typer.Option(min=1, help="The first N instances.")] = None,
    instance: Annotated[list[str] | None, typer.Option(help="Only these instance ids (repeatable).")] = None,
    pull: Annotated[bool, typer.Option(help="Also pull each instance's published evaluation image.")] = True,
) -> None:
    """Real SWE-bench (needs the Hugging Face hub and an image registry): the instances as a task set on their
    published images, graded with their own test specs; instances whose spec is not pytest are listed and left out."""
    from lego.evaluate.swebench import DATASETS, export_swebench, pull_images
    from lego.sandbox.daemon import docker_engine
    from lego.tasksets.load import load_tasks

    if which not in DATASETS:
        raise typer.BadParameter(f"choose one of {', '.join(DATASETS)}")
    cfg, work = _load(config, overrides)
    path, skipped = export_swebench(which, out, limit=limit, instance_ids=instance)
    for why in skipped.values():
        console.print(f"[yellow]left out[/] {escape(why)}")
    tasks = load_tasks(path, split="eval", strict=True).tasks
    if pull:
        with docker_engine(work.docker_root, cfg.docker.host, cfg.docker.start_private_daemon) as engine:
            pull_images(engine.client, [task.environment.image for task in tasks if task.environment.image])
    console.print(f"{len(tasks)} task(s) in {path}; evaluate with: lego eval tasks.source={path} --harness NAME")


@tasks_app.command("validate")
def tasks_validate(
    config: ConfigOption = "default",
    overrides: Overrides = None,
    runs: Annotated[int, typer.Option(min=1, help="Grade each patch this many times (flaky = results differ).")] = 3,
    concurrency: Annotated[int, typer.Option(min=1, help="Sandboxes grading at once.")] = 2,
) -> None:
    """Run gold and empty patches for every task in sandboxes; report broken tasks (exit 1 if any)."""
    from lego.sandbox.daemon import docker_engine
    from lego.sandbox.image import ensure_base_image
    from lego.tasksets.load import load_tasks
    from lego.verify.grader import Verifier
    from lego.verify.validate import validate_tasks, write_report

    cfg, work = _load(config, overrides)
    loaded = load_tasks(cfg.tasks.source, "all", cfg.tasks.strict, cfg.tasks.limit)
    for error in loaded.errors:
        console.print(f"[yellow]skipped malformed row[/] {escape(str(error))}")
    with docker_engine(work.docker_root, cfg.docker.host, cfg.docker.start_private_daemon) as engine:
        base = ensure_base_image(engine.client, cfg.docker, console)
        verifier = Verifier(engine.client, base, cfg.sandbox, cfg.verify)
        console.print(f"validating {len(loaded.tasks)} task(s): gold and empty patch, {runs} run(s) each, "
                      f"{concurrency} at a time")
        report = validate_tasks(verifier, loaded.tasks, runs=runs, concurrency=concurrency, console=console)
    path = write_report(report, work.artifacts / "validate")
    table = Table(title=f"lego tasks validate ({report.seconds:.0f}s)")
    for column in ("task", "gold", "empty", "decoys (F2P with k)", "problems"):
        table.add_column(column, overflow="fold")
    for task in report.tasks:
        status = "[red]" + ", ".join(task.problems) + "[/]" if task.broken else "[green]ok[/]"
        decoys = task.decoys
        coverage = (f"{decoys['fail_to_pass_with_k']}/{len(decoys['fail_to_pass'])}" if "fail_to_pass" in decoys
                    else decoys.get("error", "-"))
        table.add_row(task.instance_id, " ".join(task.gold), " ".join(task.empty), coverage, status)
    Console().print(table)
    totals = report.decoy_totals()
    if totals["fail_to_pass_tests"]:
        console.print(f"decoys: {totals['with_k_decoys']} of {totals['fail_to_pass_tests']} FAIL_TO_PASS tests have "
                      f"{cfg.verify.decoys_per_test} decoys that fail under the gold patch; "
                      f"{totals['with_no_decoy']} have none")
        for task in report.tasks:
            for test, why in task.decoys.get("without", {}).items():
                if test in task.decoys.get("fail_to_pass", {}):
                    console.print(f"  no decoy for {escape(test)} ({escape(task.instance_id)}): {escape(why)}")
    for task in report.tasks:  # Harbor tasks: the reward channel and the trust boundary that remains
        if task.reward_channel:
            console.print(f"  {escape(task.instance_id)}: {escape(task.reward_channel)}")
    console.print(f"report: {path}")
    if report.broken:
        console.print(f"[red]{len(report.broken)} broken task(s)[/]: " + ", ".join(t.instance_id for t in report.broken))
        for task in report.broken:
            for line in task.advice:
                console.print(f"  {escape(task.instance_id)}: {escape(line)}")
        raise typer.Exit(1)


@tasks_app.command("export")
def tasks_export(
    harbor: Annotated[Path, typer.Option("--harbor", help="Write the task set as Harbor task directories here.")],
    config: ConfigOption = "default",
    overrides: Overrides = None,
    split: Annotated[str | None, typer.Option(help="train | eval | all (default: all).")] = None,
) -> None:
    """Write the configured task set (tasks.source) as Harbor task directories, hidden tests in tests/ only."""
    from lego.sandbox.daemon import docker_engine
    from lego.sandbox.image import ensure_base_image
    from lego.tasksets.harbor_export import export_harbor
    from lego.tasksets.load import load_tasks

    cfg, work = _load(config, overrides)
    loaded = load_tasks(cfg.tasks.source, split or "all", cfg.tasks.strict, cfg.tasks.limit)
    for error in loaded.errors:
        console.print(f"[yellow]skipped malformed row[/] {escape(str(error))}")
    # The exported Dockerfiles build FROM Lego's base image (python3, pytest, git): the engine must have it.
    with docker_engine(work.docker_root, cfg.docker.host, cfg.docker.start_private_daemon) as engine:
        base = ensure_base_image(engine.client, cfg.docker, console)
    exported = export_harbor(loaded.tasks, harbor, base, verifier_timeout_s=cfg.verify.timeout_s)
    console.print(f"{len(exported)} Harbor task dir(s) in {harbor} (environment FROM {base})")
    print(harbor)


from lego_cli import tasks_reshape as _tasks_reshape  # noqa: E402, F401  (registers `lego tasks reshape`)


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
def deploy(
    config: ConfigOption = "default",
    overrides: Overrides = None,
    prefect_port: Annotated[int, typer.Option(help="Port of the Prefect server started when PREFECT_API_URL "
                                                   "is not set.")] = 4200,
) -> None:
    """Serve the pipeline and stage flows on cron schedules (Prefect deployments)."""
    import os
    import subprocess

    from lego.config import _resolve_config_path
    from lego.pipeline.prefect_env import configure_prefect_env, start_prefect_server

    cfg, work = _load(config, overrides)
    configure_prefect_env(work)
    server = None
    if not os.environ.get("PREFECT_API_URL"):
        # Prefect's ephemeral API runs no scheduler: schedules need a real server.
        console.print(f"starting a Prefect server on 127.0.0.1:{prefect_port} (PREFECT_HOME {work.prefect_home})")
        server = start_prefect_server(work, prefect_port)
    try:
        from flows.deploy import serve_deployments

        serve_deployments(cfg, str(_resolve_config_path(config)), list(overrides or []))
    finally:
        if server is not None:  # serve has stopped first; now the server
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()


@app.command()
def server(
    config: ConfigOption = "default",
    overrides: Overrides = None,
    prefect_port: Annotated[int, typer.Option(help="Prefect server port.")] = 4200,
    mlflow_port: Annotated[int, typer.Option(help="MLflow server port.")] = 5000,
) -> None:
    """Start a local Prefect server and MLflow server on loopback for their UIs."""
    import os
    import signal
    import subprocess
    import time

    from lego.child_process import ends_with_parent
    from lego.pipeline.prefect_env import launch_prefect_server
    from lego.track.tracker import tracking_uri

    cfg, work = _load(config, overrides)
    work.mlflow_db.parent.mkdir(parents=True, exist_ok=True)
    processes = {"prefect": launch_prefect_server(work, prefect_port)}
    mlflow = [str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri", tracking_uri(cfg, work),
              "--artifacts-destination", str(work.mlflow_artifacts), "--host", "127.0.0.1",
              "--port", str(mlflow_port), "--workers", "1"]
    processes["mlflow"] = subprocess.Popen(mlflow, env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
                                           stdout=open(work.logs / "mlflow-server.log", "ab"),
                                           stderr=subprocess.STDOUT, preexec_fn=ends_with_parent())
    console.print(f"Prefect UI  http://127.0.0.1:{prefect_port}   (export PREFECT_API_URL="
                  f"http://127.0.0.1:{prefect_port}/api)\nMLflow UI   http://127.0.0.1:{mlflow_port}\n"
                  f"logs in {work.logs}; Ctrl-C stops both")
    try:
        while all(process.poll() is None for process in processes.values()):
            time.sleep(1)
        failed = [name for name, process in processes.items() if process.poll() is not None]
        console.print(f"[red]{', '.join(failed)} server exited[/]; see {work.logs}")
    except KeyboardInterrupt:
        pass
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        for process in processes.values():
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


@app.command()
def compare(
    config: ConfigOption = "default",
    overrides: Overrides = None,
    run: Annotated[list[str] | None, typer.Option("--run", help="Pipeline run ids to compare (default: all).")] = None,
    harness: Annotated[list[str] | None, typer.Option("--harness", help="Only these harnesses.")] = None,
    out: Annotated[Path | None, typer.Option(help="Directory for compare.png / compare.html.")] = None,
) -> None:
    """Compare harness runs and policy versions from MLflow (table + PNG)."""
    from lego.evaluate.compare import compare_runs
    from lego.track.tracker import Tracker

    cfg, work = _load(config, overrides)
    tracker = Tracker(cfg, work)
    result = compare_runs(tracker, out or work.root / "reports" / "compare", run_ids=run, harnesses=harness,
                          confidence=cfg.eval.confidence)
    Console().print(result["table"])
    if not result["rows"]:
        console.print(f"no evaluation runs in MLflow ({tracker.uri}); run `lego run` first")
    console.print(f"plot: {result['png']}\npage: {result['html']}")


@app.command("eval")
def eval_command(
    config: ConfigOption = "default",
    overrides: Overrides = None,
    policy: Annotated[str | None, typer.Option(
        "--policy", help="A checkpoint directory, or a scripted policy: gold (each task's gold patch through the "
                         "harness's tools) or empty (hands in no change). Default: the configured checkpoint.")] = None,
    run: Annotated[str | None, typer.Option("--run", help="Evaluate a pipeline run's policy (with --policy-version; "
                                                         "'latest': the newest run).")] = None,
    policy_version: Annotated[int | None, typer.Option(
        "--policy-version", help="With --run: 0 is the policy RL started from, i the one after iteration i-1.")] = None,
    harness: Annotated[list[str] | None, typer.Option(
        "--harness", help="A harness to evaluate with; repeat for several (default: harness.name).")] = None,
    split: Annotated[str | None, typer.Option(help="train | eval | all (default: tasks.eval_split).")] = None,
    limit: Annotated[int | None, typer.Option(help="The first N tasks of the split (default: eval.limit).",
                                              min=1)] = None,
    samples: Annotated[int | None, typer.Option(
        help="Attempts per task (default: the split's eval.samples_per_split, else eval.samples_per_task).",
        min=1)] = None,
    fresh: Annotated[bool, typer.Option(help="Attempt everything anew instead of resuming the attempts stored by "
                                             "an earlier identical evaluation.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the evaluation as JSON on stdout.")] = False,
) -> None:
    """Evaluate a policy on a task set with one or more harnesses, graded by the verifier: resolved rate with its
    Wilson interval per harness and per repo, infra failures apart. Tracked in MLflow (`lego compare` lists it).
    Exits 1 when an evaluation graded fewer than eval.min_coverage of its planned attempts."""
    import contextlib

    from lego.pipeline.artifacts import StageContext
    from lego.pipeline.evaluation import EvalError, eval_tasks, harness_config, new_eval_id, run_eval
    from lego.pipeline.evaluation_tracking import track_evaluation
    from lego.pipeline.progress import RunProgress
    from lego.pipeline.runners import load_runner
    from lego.termination import stop_on_sigterm
    from lego.track.tracker import Tracker

    cfg, work = _load(config, overrides)
    stop_on_sigterm()
    if run is not None and (policy is not None or policy_version is None):
        raise EvalError("--run takes --policy-version N and no --policy")
    if policy_version is not None and run is None:
        raise EvalError("--policy-version needs --run RUN (the run whose policy it is)")
    tasks = eval_tasks(cfg, split, limit)
    harnesses = harness or [cfg.harness.name]
    for name in harnesses:
        harness_config(cfg, name)  # an unknown harness fails now, not after the engine and images are up
    eval_id = new_eval_id()
    with contextlib.ExitStack() as stack:
        if cfg.pipeline.runner is None:
            # a checkpoint directory or a run's policy is evaluated as it is: the configured base is not needed
            own_policy = run is not None or policy not in (None, "gold", "empty")
            stack.enter_context(_embedded_setup(cfg, work, policy_needed=not own_policy))
        chosen = _evaluated_policy(cfg, work, policy, run, policy_version)
        console.print(f"[bold]lego eval[/] {eval_id}: policy {chosen.label} ({chosen.source}) on {len(tasks)} "
                      f"task(s) with {', '.join(harnesses)}")
        progress = RunProgress(console.print)
        ctx = StageContext(config=cfg, work=work, run_id=eval_id, runner=load_runner(cfg.pipeline.runner),
                           log=console.print, progress=progress)
        try:
            samples = samples or cfg.eval.samples_for(split or cfg.tasks.eval_split)
            evaluation, keys = run_eval(ctx, tasks, chosen, harnesses, samples=samples, fresh=fresh)
        finally:
            progress.close()
    tracker = Tracker(cfg, work)
    track_evaluation(tracker, eval_id, evaluation, keys, work.root / "reports" / eval_id)
    table = _evaluation_table(eval_id, chosen.label, evaluation, cfg.eval.confidence)
    if not as_json:
        Console().print(table)
    for name, result in evaluation.harnesses.items():
        console.print(f"{name}: {escape(result.report.headline())}")
    console.print(f"MLflow: {tracker.uri} (run {eval_id}); side by side: lego compare --run {eval_id}")
    if as_json:
        print(evaluation.model_dump_json(indent=2))
    if not evaluation.covered:
        raise typer.Exit(1)


def _evaluated_policy(cfg, work, policy: str | None, run: str | None, policy_version: int | None):
    """The policy `lego eval` evaluates: a run's version, a scripted one (gold, empty), or a checkpoint."""
    from lego.pipeline.evaluation import checkpoint_policy, run_policy, scripted_policy

    if run is not None:
        return run_policy(work, run, policy_version)
    if policy in ("gold", "empty"):
        return scripted_policy(policy, cfg, work)
    from lego.engine.checkpoint import default_model_path

    return checkpoint_policy(policy or default_model_path(cfg, work))


def _evaluation_table(eval_id: str, label: str, evaluation: PolicyEvaluation, confidence: float) -> Table:
    """Resolved counts, rates and intervals per harness, and per repo under each."""
    table = Table(title=f"{eval_id}: policy {label}, temperature {evaluation.temperature:g}, "
                        f"{evaluation.samples_per_task} attempt(s) per task")
    for column in ("harness", "repo", "resolved", "rate", f"{confidence:.0%} interval", "coverage",
                   "infra failures"):
        table.add_column(column)
    for name, result in evaluation.harnesses.items():
        report = result.report
        if report.covered and report.resolved_rate is not None:
            rate, interval = f"{report.resolved_rate:.1%}", f"[{report.resolved_low:.1%}, {report.resolved_high:.1%}]"
        else:
            rate, interval = ("coverage short", "-") if not report.covered else ("-", "-")
        table.add_row(name, "(all)", f"{report.resolved}/{report.attempts}", rate, interval,
                      f"{report.attempts}/{report.planned} = {report.coverage:.0%}",
                      ", ".join(f"{k} x{v}" for k, v in sorted(report.infra_checks.items())) or "0")
        for repo, counts in report.per_repo.items():
            shown = report.covered and counts.resolved_rate is not None
            table.add_row("", repo, f"{counts.resolved}/{counts.attempts}",
                          f"{counts.resolved_rate:.1%}" if shown else "-",
                          f"[{counts.resolved_low:.1%}, {counts.resolved_high:.1%}]" if shown else "-", "",
                          str(counts.infra_errors))
    return table


@app.command()
def bench(
    name: Annotated[str, typer.Argument(help="Benchmark name: " + " | ".join(BENCHMARK_MODULES))],
    config: ConfigOption = "default",
    overrides: Overrides = None,
    option: Annotated[list[str] | None, typer.Option(
        "--option", "-o", help="A benchmark's own knob, KEY=VALUE (repeatable), e.g. proxy: sessions, turns, rounds, "
        "measure=instructions, profiles=DIR; rollout: harnesses=a,b; learn: config=NAME, arms=sft,rft,grpo,"
        "success_mass, seeds=0,1,2")] = None,
) -> None:
    """Run a benchmark and print its JSON result."""
    from lego.bench import run_benchmark

    options = dict(item.partition("=")[::2] for item in option or [])
    cfg, work = _load(config, overrides)
    print(json.dumps(run_benchmark(name, cfg, work, options), indent=2))


def main() -> None:
    try:
        app()
    except LegoError as exc:
        console.print(f"[red]error:[/] {exc}")
        sys.exit(2)
