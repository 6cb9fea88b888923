"""The closing summary of `lego run`: how long, what came from cache, did the policy improve (lego.pipeline.report),
and the commands to look further, with their addresses."""

from __future__ import annotations

from pathlib import Path

from lego_cli.run_output import RunOutput


def print_run_summary(cfg, work, summary: dict, out: RunOutput, cli_args: list[str], seconds: float) -> None:
    from lego.evaluate.compare import compare_runs
    from lego.pipeline.manifest import load_manifest
    from lego.pipeline.report import duration, learning_lines, next_commands
    from lego.track.tracker import Tracker

    manifest = load_manifest(work, summary["run_id"])
    cached = len(summary["served_from_cache"])
    total = cached + len(summary["computed"])
    out.echo()
    out.echo(f"run {manifest.run_id} completed in {duration(seconds)} "
             f"({cached} of {total} stages served from cache)")
    for line in learning_lines(manifest, manifest.config):
        out.echo(line)
    for label, metrics in summary.get("evaluations", {}).items():
        if metrics.get("coverage_short"):  # no rate: too few of its planned attempts were graded (eval.min_coverage)
            out.echo(f"{label}: coverage short: {int(metrics.get('attempts', 0))} of "
                     f"{int(metrics.get('planned', 0))} planned attempts graded, infra errors "
                     f"{int(metrics.get('infra_errors', 0))}; no resolved rate")
    note = _harbor_note(manifest)
    if note:
        out.echo(note)
    tracker = Tracker(cfg, work)
    compared = compare_runs(tracker, work.root / "reports" / manifest.run_id, run_ids=[manifest.run_id],
                            confidence=cfg.eval.confidence)
    out.echo(f"report: {compared['html']} (plot {compared['png']})")
    out.echo()
    out.echo("next:")
    for line in next_commands(work.root, manifest.run_id, cli_args, tracker.uri):
        out.echo(line)


def _harbor_note(manifest) -> str | None:
    """A run that graded foreign Harbor tasks: the trust boundary left, in one line."""
    taskset = manifest.stages.get("taskset")
    if taskset is None:
        return None
    from lego.pipeline.taskset_stage import read_tasks
    from lego.verify.harbor_grading import harbor_trust_note

    paths = [Path(taskset.outputs[name]) for name in ("train_tasks", "eval_tasks") if name in taskset.outputs]
    return harbor_trust_note([task for path in paths if path.is_file() for task in read_tasks(path)])
