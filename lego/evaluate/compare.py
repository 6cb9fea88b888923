"""Harness runs and policy versions side by side, from the evaluation stage runs recorded in MLflow."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from rich.table import Table

from lego.track.traces import run_traces_url, traces_filter
from lego.track.tracker import Tracker

COLUMNS = ("run", "harness", "policy", "iteration", "attempts", "resolved", "resolved_rate", "ci_low", "ci_high",
           "coverage", "mean_turns", "mean_tokens", "infra_error_rate", "cheat_rate")
# What an evaluation short of coverage (eval.min_coverage) shows instead of its rate.
SHORT = "coverage short"


def comparison_rows(tracker: Tracker, run_ids: list[str] | None = None, harnesses: list[str] | None = None,
                    max_results: int = 1000) -> list[dict[str, Any]]:
    """One row per distinct evaluation artifact (a cache hit in a later run does not add a row)."""
    query = "tags.`lego.kind` = 'stage' and tags.`lego.stage` = 'evaluate'"
    runs = tracker.client.search_runs([tracker.experiment_id], filter_string=query, max_results=max_results,
                                      order_by=["attributes.start_time ASC"])
    rows: dict[str, dict[str, Any]] = {}
    for run in runs:
        tags, metrics = run.data.tags, run.data.metrics
        if run_ids and tags.get("lego.run_id") not in run_ids:
            continue
        if harnesses and tags.get("lego.harness") not in harnesses:
            continue
        # An evaluation short of coverage logs no rate (lego.evaluate.report) but is listed, saying so.
        if "resolved_low" not in metrics and "coverage" not in metrics:
            continue
        key = tags.get("lego.artifact_key") or run.info.run_id
        if key in rows:
            continue
        rows[key] = {
            "run": tags.get("lego.run_id", ""), "harness": tags.get("lego.harness", ""),
            "policy": int(tags["lego.policy_version"]) if tags.get("lego.policy_version", "").isdigit() else None,
            # `lego eval`'s name of the policy: vN, or a scripted one (gold, empty)
            "policy_label": tags.get("lego.policy") or (f"v{tags['lego.policy_version']}"
                                                        if tags.get("lego.policy_version") else "-"),
            "coverage": metrics.get("coverage"), "coverage_short": bool(metrics.get("coverage_short")),
            "iteration": tags.get("lego.iteration", ""), "attempts": int(metrics.get("attempts", 0)),
            "resolved": int(metrics.get("resolved", 0)), "resolved_rate": metrics.get("resolved_rate"),
            "ci_low": metrics.get("resolved_low"), "ci_high": metrics.get("resolved_high"),
            "mean_turns": metrics.get("mean_turns"), "mean_tokens": metrics.get("mean_tokens"),
            "infra_error_rate": metrics.get("infra_error_rate"), "cheat_rate": metrics.get("cheat_rate"),
            "artifact_key": key, "mlflow_run_id": run.info.run_id,
            # the evaluation's rollouts, each an MLflow trace linked to this stage run (lego/track/traces.py)
            "traces_url": run_traces_url(tracker.uri, tracker.experiment_id, run.info.run_id),
            "traces_filter": traces_filter(tags.get("lego.run_id", ""), "evaluate", tags.get("lego.iteration")),
        }
    return sorted(rows.values(), key=lambda r: (r["harness"], r["policy"] if r["policy"] is not None else -1,
                                                r["policy_label"], r["run"]))


def _fmt(value: Any, percent: bool = False) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1%}" if percent else f"{value:,.1f}"
    return str(value)


PERCENT = {"resolved_rate", "ci_low", "ci_high", "coverage", "infra_error_rate", "cheat_rate"}


def _cell(row: dict[str, Any], column: str) -> str:
    if column == "policy":
        return row["policy_label"]
    if row["coverage_short"] and column in ("resolved_rate", "ci_low", "ci_high"):
        return SHORT if column == "resolved_rate" else "-"
    return _fmt(row[column], column in PERCENT)


def render_table(rows: list[dict[str, Any]], confidence: float = 0.95) -> Table:
    table = Table(title=f"harness comparison (resolved rate, {confidence:.0%} Wilson interval; infra errors apart)")
    for column in COLUMNS:
        table.add_column(column, justify="left" if column in ("run", "harness") else "right")
    for row in rows:
        table.add_row(*(_cell(row, c) for c in COLUMNS))
    return table


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def row_label(row: dict[str, Any]) -> str:
    return f"{row['harness']} {row['policy_label']}\n{row['run'][-10:]}"


def plot_comparison(rows: list[dict[str, Any]], path: Path, confidence: float = 0.95) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    width = max(4.0, 1.3 * len(rows) + 2)
    fig, (left, right) = plt.subplots(1, 2, figsize=(width * 1.6, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    xs = list(range(len(rows)))
    # a shortfall is drawn as no bar (its rate is not known), its label saying so
    rates = [0.0 if row["coverage_short"] else row["resolved_rate"] or 0.0 for row in rows]
    lower = [max(0.0, rate - _or(row["ci_low"], rate)) for rate, row in zip(rates, rows, strict=True)]
    upper = [max(0.0, _or(row["ci_high"], rate) - rate) for rate, row in zip(rates, rows, strict=True)]
    harnesses = sorted({row["harness"] for row in rows})
    colors = {name: plt.cm.tab10(i % 10) for i, name in enumerate(harnesses)}
    left.bar(xs, rates, color=[colors[row["harness"]] for row in rows], alpha=0.75)
    left.errorbar(xs, rates, yerr=[lower, upper], fmt="none", ecolor="black", capsize=4)
    left.set_xticks(xs, [row_label(row) + (f"\n{SHORT}" if row["coverage_short"] else "") for row in rows],
                    fontsize=8)
    left.set_ylim(0, 1)
    left.set_ylabel("resolved rate")
    left.set_title(f"resolved rate ({confidence:.0%} Wilson interval)", fontsize=10)
    infra = [row["infra_error_rate"] or 0.0 for row in rows]
    cheat = [row["cheat_rate"] or 0.0 for row in rows]
    right.bar([x - 0.2 for x in xs], infra, width=0.4, label="infra errors", color="tab:gray")
    right.bar([x + 0.2 for x in xs], cheat, width=0.4, label="cheats", color="tab:red")
    right.set_xticks(xs, [row_label(row) for row in rows], fontsize=8)
    right.set_ylim(0, 1)
    right.set_title("infra errors and cheats", fontsize=10)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_html(rows: list[dict[str, Any]], png: Path, path: Path) -> Path:
    header = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS) + "<th>traces</th>"
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(row, c))}</td>" for c in COLUMNS)
                   + f'<td><a href="{html.escape(row["traces_url"])}" title="{html.escape(row["traces_filter"])}">'
                     "rollouts</a></td></tr>"
                   for row in rows)
    path.write_text(f"""<!doctype html><html><head><meta charset="utf-8"><title>lego compare</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;
padding:4px 8px;text-align:right}}td:first-child,td:nth-child(2){{text-align:left}}</style></head><body>
<h1>Harness comparison</h1><img src="{html.escape(png.name)}" alt="resolved rate plot">
<table><tr>{header}</tr>{body}</table></body></html>
""")
    return path


def compare_runs(tracker: Tracker, out_dir: Path, run_ids: list[str] | None = None,
                 harnesses: list[str] | None = None, confidence: float = 0.95) -> dict[str, Any]:
    rows = comparison_rows(tracker, run_ids, harnesses)
    out_dir.mkdir(parents=True, exist_ok=True)
    png = plot_comparison(rows, out_dir / "compare.png", confidence)
    page = write_html(rows, png, out_dir / "compare.html")
    return {"rows": rows, "png": png, "html": page, "table": render_table(rows, confidence)}
