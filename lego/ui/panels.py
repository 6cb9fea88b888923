"""The dashboard's panels as Dash components, from lego.ui.data's and lego.ui.trajectory's models.

Numbers are shown as text beside every figure (a user reads exact counts; a test reads them too), figures are
Plotly's. Component ids used by the callbacks and the test are stable: `header`, `<panel>-body`, ...
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from dash import dcc, html

from lego.pipeline.diagnosis import Finding
from lego.ui.data import (
    OUTCOME_KINDS,
    FidelityPanel,
    HarnessPanel,
    Header,
    LogsPanel,
    Overview,
    RolloutsPanel,
    StepPoint,
    TaskGrid,
)
from lego.ui.trajectory import TokenView, TrajectoryView

KIND_COLORS = {"resolved": "#2e9d5b", "unresolved": "#9aa5b1", "cheat": "#d64545", "agent_timeout": "#8e6bc4",
               "overlong": "#b7791f", "infra_error": "#3d4852", "not_graded": "#9cc3e6"}
SERIES = (("train_split", "train split (RL rollouts)", "circle"), ("train_split_eval", "train split (evaluation)",
                                                                   "square"), ("eval_split", "eval split (held out)",
                                                                               "triangle-up"))


# ---------------------------------------------------------------------------------------------- formatting


def pct(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value * 100:.{digits}f}%"


def num(value: float | None, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, int) or float(value).is_integer() and abs(value) < 1e9:
        return f"{int(value)}"
    return f"{value:.{digits}g}" if abs(value) < 1e-3 else f"{value:.{digits}f}".rstrip("0").rstrip(".")


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def moment(iso: str | None) -> str:
    """An ISO time as `YYYY-MM-DD HH:MM:SS` (UTC)."""
    return (iso or "—").replace("T", " ")[:19]


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, id: str | None = None,
          class_name: str = "grid") -> html.Table:
    head = html.Thead(html.Tr([html.Th(h) for h in headers]))
    body = html.Tbody([html.Tr([cell if isinstance(cell, html.Td) else html.Td(cell) for cell in row])
                       for row in rows])
    return html.Table([head, body], id=id, className=class_name) if id else html.Table([head, body],
                                                                                        className=class_name)


def card(label: str, value: Any, *, id: str | None = None, hint: str | None = None) -> html.Div:
    children = [html.Div(label, className="card-label"), html.Div(value, className="card-value")]
    if hint:
        children.append(html.Div(hint, className="card-hint"))
    return html.Div(children, className="card", id=id) if id else html.Div(children, className="card")


def section(title: str, *children: Any, id: str | None = None) -> html.Section:
    return html.Section([html.H3(title), *children], id=id) if id else html.Section([html.H3(title), *children])


def figure(fig: go.Figure, id: str, height: int = 300) -> dcc.Graph:
    fig.update_layout(height=height, margin={"l": 50, "r": 20, "t": 30, "b": 40}, template="plotly_white",
                      legend={"orientation": "h", "y": -0.25}, uirevision=id)
    return dcc.Graph(id=id, figure=fig, style={"height": f"{height}px"}, config={"displaylogo": False})


def outcome_text(outcomes: dict[str, int]) -> html.Span:
    parts: list[Any] = []
    for kind, count in outcomes.items():
        parts += [html.Span(f"{kind} {count}", className=f"kind kind-{kind}"), " "]
    return html.Span(parts[:-1] or "none")


def findings_list(findings: list[Finding], healthy_text: str) -> html.Div:
    if not findings:
        return html.Div(healthy_text, className="healthy", id="findings")
    items = []
    for found in findings:
        evidence = [html.Li(f"{name}: {value}") for name, value in found.evidence.items() if value not in (None, [], {})]
        checks = [html.Li(f"check: {item}") for item in found.what_to_check]
        items.append(html.Details([
            html.Summary([html.Span(found.severity.upper(), className=f"sev sev-{found.severity}"),
                          html.Span(f" {found.signature} ", className="signature"),
                          html.Span(f"({found.area}) {found.summary}")]),
            html.Ul(evidence + checks)], className="finding"))
    return html.Div(items, id="findings")


# ---------------------------------------------------------------------------------------------- header


def header(model: Header, mlflow_url: str | None, traces_url: str | None, mlflow_note: str | None) -> list[Any]:
    status_class = {"running": "live", "completed": "done", "failed": "failed"}.get(model.status, "")
    stage = model.current_stage or ("—" if model.status == "running" else "finished")
    progress = f"{model.minutes_since_progress:g} min ago" if model.minutes_since_progress is not None else "—"
    health = ("healthy" if not (model.errors or model.warnings)
              else f"{model.errors} errors, {model.warnings} warnings")
    cards = [
        card("status", html.Span(model.status, className=f"status status-{status_class}"), id="h-status"),
        card("stage", stage, id="h-stage", hint=f"{model.stages_done} done, {model.stages_left} left"),
        card("iteration", num(model.iteration), id="h-iteration"),
        card("step", num(model.step), id="h-step", hint="optimizer steps"),
        card("elapsed", duration(model.elapsed_s), id="h-elapsed"),
        card("last progress", progress, id="h-progress", hint=model.last_progress_source)
        if model.status == "running" else card("ended", moment(model.ended_at), id="h-ended", hint="UTC"),
        card("lego status", health, id="h-health"),
    ]
    links = [html.Span(model.run_id, className="run-id", id="h-run"),
             html.Span(f"{model.harness} · {model.model} · started {moment(model.created_at)} UTC",
                       className="subtle")]
    if mlflow_url:
        links.append(html.A("MLflow run ↗", href=mlflow_url, target="_blank", id="mlflow-run-link",
                            className="link"))
    if traces_url:
        links.append(html.A("its traces ↗", href=traces_url, target="_blank", id="mlflow-traces-link",
                            className="link"))
    elif mlflow_note:
        links.append(html.Span(mlflow_note, className="subtle", id="mlflow-note"))
    links.append(html.Span(f"updated {moment(model.checked_at)[11:]} UTC", className="subtle", id="updated-at"))
    return [html.Div(cards, className="cards"), html.Div(links, className="header-links")]


# ---------------------------------------------------------------------------------------------- overview


def _rate_text(rate: Any) -> str:
    return "—" if rate is None else f"{rate.resolved}/{rate.attempts} ({pct(rate.rate)}, {pct(rate.low)}–{pct(rate.high)})"


def _steps_figure(steps: list[StepPoint], names: Sequence[tuple[str, str]], id: str, *,
                  threshold: float | None = None) -> dcc.Graph:
    fig = go.Figure()
    for name, label in names:
        points = [(p.step, p.loss if name == "loss" else p.metrics.get(name)) for p in steps]
        points = [(x, y) for x, y in points if y is not None]
        if points:
            fig.add_trace(go.Scatter(x=[x for x, _ in points], y=[y for _, y in points], mode="lines+markers",
                                     name=label))
    if not fig.data:
        fig.add_annotation(text=f"{', '.join(label for _, label in names)}: not recorded by this run's trainer",
                           showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
        fig.update_xaxes(visible=False)
        fig.update_yaxes(visible=False)
        return figure(fig, id, 260)
    if threshold is not None and steps:
        fig.add_hline(y=threshold, line_dash="dot", line_color="#d64545", annotation_text=f"{threshold}")
    fig.update_xaxes(title="optimizer step", dtick=1 if steps and steps[-1].step <= 20 else None)
    return figure(fig, id, 260)


def overview(model: Overview) -> list[Any]:
    rates = go.Figure()
    for key, label, marker in SERIES:
        points = [(p.policy, getattr(p, key)) for p in model.curve if getattr(p, key) is not None]
        if points:
            rates.add_trace(go.Scatter(
                x=[x for x, _ in points], y=[r.rate for _, r in points], name=label, mode="lines+markers",
                marker_symbol=marker,
                error_y={"type": "data", "symmetric": False, "array": [r.high - r.rate for _, r in points],
                         "arrayminus": [r.rate - r.low for _, r in points]}))
    rates.update_yaxes(range=[-0.02, 1.02], title="resolved rate")
    rates.update_xaxes(title="policy (0: RL's start; i: after iteration i)", dtick=1)
    rewards = go.Figure(go.Bar(x=[p.label for p in model.rewards], y=[p.mean_reward for p in model.rewards],
                               marker_color=["#9cc3e6" if p.live else "#2e9d5b" for p in model.rewards],
                               text=[f"{num(p.mean_reward, 3)} ({p.graded})" for p in model.rewards]))
    rewards.update_yaxes(range=[0, 1.05], title="mean reward")
    curve_rows = [[p.policy, _rate_text(p.train_split), _rate_text(p.train_split_eval), _rate_text(p.eval_split)]
                  for p in model.curve]
    reward_rows = [[p.label, p.rollouts, p.graded, p.resolved, num(p.mean_reward)]
                   for p in model.rewards]
    stage_rows = [[s.label, "cached" if s.cached else duration(s.seconds), moment(s.created_at), s.summary]
                  for s in model.stages]
    return [
        section("Findings (lego status)", findings_list(model.findings, "no problem found"),
                *[html.Div(f"note: {note}", className="subtle") for note in model.notes]),
        html.Div([
            section("Resolved rate per policy", figure(rates, "overview-rates"),
                    table(["policy", "train split (RL rollouts)", "train split (evaluation)", "eval split"],
                          curve_rows, id="overview-curve")),
            section("Reward per iteration", figure(rewards, "overview-rewards"),
                    table(["iteration", "rollouts", "graded", "resolved", "mean reward"], reward_rows,
                          id="overview-reward-table")),
        ], className="two"),
        section("Training", html.Div([
            _steps_figure(model.steps, [("loss", "loss"), ("entropy", "entropy")], "overview-loss"),
            _steps_figure(model.steps, [("grad_norm", "grad norm"), ("clip_fraction", "clip fraction")],
                          "overview-grad"),
            _steps_figure(model.steps, [("learning_rate", "learning rate")], "overview-lr")], className="three")
                if model.steps else html.Div("no optimizer step yet", className="subtle")),
        section("Stages", table(["stage", "took", "recorded (UTC)", "numbers"], stage_rows, id="overview-stages")),
    ]


# ---------------------------------------------------------------------------------------------- rollouts


def rollouts(model: RolloutsPanel) -> list[Any]:
    live = [s for s in model.stages if s.live]
    cards = []
    for stage in live:
        cards += [card("done", f"{stage.stored}" + (f" / {stage.planned}" if stage.planned else ""),
                       id="live-done", hint=stage.label),
                  card("running", "—" if stage.running is None else f"≤ {stage.running}", id="live-running",
                       hint=f"rollout.concurrency {model.concurrency} per worker"),
                  card("graded", stage.graded, id="live-graded"),
                  card("outcomes so far", outcome_text(stage.outcomes), id="live-outcomes")]
    if not live:
        cards.append(card("in progress", model.current_stage or ("nothing: the run is " + model.status),
                          id="live-none"))
    bars = go.Figure()
    ordered = list(reversed(model.stages))
    for kind in OUTCOME_KINDS:
        values = [s.outcomes.get(kind, 0) for s in ordered]
        if any(values):
            bars.add_trace(go.Bar(x=[s.label for s in ordered], y=values, name=kind,
                                  marker_color=KIND_COLORS[kind]))
    bars.update_layout(barmode="stack")
    bars.update_yaxes(title="rollouts")
    stage_rows = [[s.label, s.stored, num(s.planned), num(s.left), s.graded,
                   outcome_text(s.outcomes), num(s.mean_turns, 2), num(s.mean_tokens, 1), moment(s.last_write)]
                  for s in model.stages]
    harness_rows = [[h.harness, h.rollouts, outcome_text(h.outcomes), num(h.mean_reward)] for h in model.harnesses]
    live_rows = [[s.data_run_id, s.stage, s.iteration, s.rollouts, outcome_text(s.outcomes), moment(s.last_write)]
                 for s in model.live]
    return [
        html.Div(cards, className="cards", id="live-cards"),
        section("Findings (lego status)", findings_list(model.findings, "no problem found")),
        section("Outcomes by stage", figure(bars, "rollouts-bars"),
                table(["stage", "done", "planned", "left", "graded", "outcomes", "mean turns", "mean tokens",
                       "last stored (UTC)"], stage_rows, id="rollouts-stages")),
        html.Div([
            section("RL rollouts by harness", table(["harness", "rollouts", "outcomes", "mean reward"],
                                                    harness_rows, id="rollouts-harness")),
            section("Stored since the last recorded stage (lego status)",
                    table(["data run", "stage", "iteration", "rollouts", "outcomes", "last write (UTC)"],
                          live_rows, id="rollouts-live") if live_rows
                    else html.Div("nothing in progress", className="subtle")),
        ], className="two"),
    ]


# ---------------------------------------------------------------------------------------------- fidelity


def fidelity(model: FidelityPanel) -> list[Any]:
    rows = []
    for r in model.rows:
        pearson = html.Td(num(r.pearson, 6), className="bad" if r.pearson is not None and r.pearson < model.pearson_min
                          else "")
        segments = ", ".join(f"{reason} {count}" for reason, count in sorted(r.segments.items())) or "—"
        calls = ", ".join(f"{kind} {count}" for kind, count in sorted(r.calls.items())) or "—"
        rows.append([r.label, pearson, num(r.kl, 3), num(r.abs_diff_mean, 3),
                     num(r.abs_diff_max, 3), num(r.routing_differs_share, 3), pct(r.routing_coverage),
                     r.rewrites, r.subagent_calls, segments, calls, r.failed_calls])
    cov = go.Figure(go.Bar(x=[r.label for r in model.rows], y=[r.routing_coverage for r in model.rows],
                           marker_color="#4c78a8"))
    cov.update_yaxes(range=[0, 1.05], title="tokens with routed experts")
    threads = go.Figure()
    for name, values in (("rewrites", [r.rewrites for r in model.rows]),
                         ("sub-agent calls", [r.subagent_calls for r in model.rows])):
        threads.add_trace(go.Bar(x=[r.label for r in model.rows], y=values, name=name))
    return [
        section("Per iteration", table(
            ["rollouts", "Pearson (train/inference)", "KL to inference", "|Δ log-prob| mean", "|Δ log-prob| max",
             "routing differs", "routing coverage", "rewrites", "sub-agent calls", "segments", "LLM calls",
             "failed calls"], rows, id="fidelity-table"),
                html.Div(f"Pearson below {model.pearson_min} means the trainer does not score what was sampled "
                         "(R3 off or misaligned, dtype drift).", className="subtle")),
        html.Div([
            section("Pearson per step", _steps_figure(model.steps, [("logprob_pearson", "Pearson")],
                                                      "fidelity-pearson", threshold=model.pearson_min)),
            section("KL to inference per step", _steps_figure(model.steps, [("kl_to_inference", "KL")],
                                                              "fidelity-kl")),
        ], className="two"),
        html.Div([section("Routing coverage", figure(cov, "fidelity-coverage", 240)),
                  section("Rewrites and sub-agent calls", figure(threads, "fidelity-threads", 240))],
                 className="two"),
    ]


# ---------------------------------------------------------------------------------------------- tasks


def _cell_style(rate: float | None) -> dict[str, str]:
    if rate is None:
        return {"background": "#f3f4f6"}
    # red (never solved) through amber to green (always solved)
    hue = int(rate * 120)
    return {"background": f"hsl({hue}, 65%, 82%)"}


def tasks(model: TaskGrid) -> list[Any]:
    rows = []
    for row in model.rows:
        cells: list[Any] = [html.Td(row.task_id, className="task-id")]
        for column in model.columns:
            cell = row.cells.get(column)
            if cell is None:
                cells.append(html.Td("", className="empty"))
                continue
            text = f"{cell.resolved}/{cell.graded}" + (f" +{cell.infra_errors} infra" if cell.infra_errors else "")
            cells.append(html.Td(text, style=_cell_style(cell.rate), title=f"{row.task_id} · {column}: "
                                 f"{cell.resolved} resolved of {cell.graded} graded ({cell.attempts} attempts, "
                                 f"{cell.infra_errors} infra errors), pass rate {pct(cell.rate)}"))
        rows.append(cells)
    if not rows:
        return [html.Div("no rollout stored yet", className="subtle")]
    return [section("Pass rate per task (resolved / graded)",
                    table(["task", *model.columns], rows, id="task-grid", class_name="grid taskgrid"),
                    html.Div("Infra errors are left out of the rate (they say nothing about the task).",
                             className="subtle"))]


# ---------------------------------------------------------------------------------------------- trajectory


def token_title(token: TokenView) -> str:
    parts = [f"#{token.position}", f"id {token.token_id}", "sampled (mask 1)" if token.sampled else "prompt (mask 0)"]
    if token.logprob is not None:
        parts.append(f"logprob {token.logprob:.4f} (p {math.exp(token.logprob):.3f})")
    if token.experts is not None:
        parts.append("experts " + " | ".join(f"L{layer}: {','.join(str(e) for e in picks)}"
                                             for layer, picks in enumerate(token.experts)))
    return " · ".join(parts)


def tokens(window: list[TokenView]) -> html.Div:
    spans = []
    for token in window:
        name = "tok tok-s" if token.sampled else "tok tok-p"
        if token.logprob is not None and token.logprob < math.log(0.5):
            name += " tok-unlikely"
        spans.append(html.Span(token.text, className=name, title=token_title(token)))
    return html.Div(spans, className="tokens", id="tokens")


def trajectory(view: TrajectoryView | None, missing: str | None = None) -> list[Any]:
    if view is None:
        return [html.Div(missing or "choose a rollout", className="subtle")]
    facts = [card("task", view.task_id), card("outcome", view.kind or "not graded", id="t-outcome"),
             card("reward", num(view.reward)), card("termination", view.termination),
             card("policy", view.policy_version), card("turns", view.turns), card("tokens", view.tokens)]
    links = []
    if view.trace_url:
        links.append(html.A("trace in MLflow ↗", href=view.trace_url, target="_blank", id="trace-link",
                            className="link"))
    if view.tokenizer_note:
        links.append(html.Div(view.tokenizer_note, className="subtle"))
    if view.cheat_rules:
        links.append(html.Div(f"cheat rules fired: {', '.join(view.cheat_rules)}", className="bad"))
    if view.error:
        links.append(html.Div(f"error: {view.error}", className="bad"))
    body: list[Any] = [html.Div(facts, className="cards"), html.Div(links, className="header-links")]
    if view.segment is not None:
        seg = view.segment
        end = seg.start + len(seg.window)
        body.append(section(
            f"Segment {seg.index} · {seg.thread} · {seg.reason}: tokens {seg.start}–{end} of {seg.tokens} "
            f"({seg.sampled} sampled, mean log-prob {num(seg.mean_logprob, 4)}"
            f"{', routed experts recorded' if seg.routed else ', no routing (dense model)'})",
            html.Div([html.Span("prompt (mask 0)", className="tok tok-p"),
                      html.Span("sampled (mask 1)", className="tok tok-s"),
                      html.Span("sampled, p < 0.5", className="tok tok-s tok-unlikely"),
                      html.Span("hover a token: id, log-prob, routed experts", className="subtle")],
                     className="legend"),
            tokens(seg.window), id="segment-view"))
    calls = [[c.index, c.kind, c.thread, c.segment_index, c.prompt_tokens, c.new_prompt_tokens, c.completion_tokens,
              f"{c.latency_s:.2f}s", c.finish_reason or "", c.error or ""] for c in view.calls]
    body.append(section("LLM calls", table(["#", "kind", "thread", "segment", "prompt tokens", "new prompt tokens",
                                            "sampled tokens", "latency", "finish", "error"], calls,
                                           id="trajectory-calls")))
    body.append(html.Details([html.Summary("final diff"), html.Pre(view.final_diff or "(empty)")]))
    body.append(html.Details([html.Summary("harness log"), html.Pre(view.harness_log or "(empty)",
                                                                    id="harness-log")]))
    body.append(html.Details([html.Summary("test log"), html.Pre(view.test_log or "(not graded)", id="test-log")]))
    return body


# ---------------------------------------------------------------------------------------------- logs


def logs(model: LogsPanel) -> list[Any]:
    rows = [[moment(event.at), html.Td(event.level, className=f"lvl lvl-{event.level}"), event.source, event.text]
            for event in model.events]
    return [table(["time (UTC)", "level", "source", "event"], rows, id="log-table", class_name="grid logs"),
            html.Div(f"the newest {model.limit} rollouts and gradings at most", className="subtle")]


# ---------------------------------------------------------------------------------------------- harnesses


def harnesses(model: HarnessPanel) -> list[Any]:
    fig = go.Figure()
    for split in ("eval", "train"):
        rows = [r for r in model.evaluations if r.split == split and r.rate is not None]
        if rows:
            fig.add_trace(go.Scatter(
                x=[f"{r.run_id} · {r.harness} · policy {r.policy_version}" for r in rows], y=[r.rate for r in rows],
                mode="markers", name=f"{split} split", marker={"size": 10},
                error_y={"type": "data", "symmetric": False, "array": [(r.high or r.rate) - r.rate for r in rows],
                         "arrayminus": [r.rate - (r.low or r.rate) for r in rows]}))
    fig.update_yaxes(range=[-0.02, 1.02], title="resolved rate")
    evaluation_rows = [[r.run_id, r.harness, r.label, r.policy_version, f"{r.resolved}/{r.attempts}", pct(r.rate),
                        f"{pct(r.low)}–{pct(r.high)}", r.cheat, r.infra_error] for r in model.evaluations]
    rollout_rows = [[r.run_id, r.harness, r.rollouts, r.graded, r.resolved, num(r.mean_reward), num(r.mean_turns, 2),
                     num(r.mean_tokens, 1)] for r in model.rollouts]
    return [
        html.Div(f"runs compared: {', '.join(model.runs) or 'none'}", className="subtle"),
        *[html.Div(f"not read: {item}", className="bad") for item in model.unreadable],
        section("Evaluations: resolved rate per harness and policy (Wilson intervals)", figure(fig, "harness-rates"),
                table(["run", "harness", "evaluation", "policy", "resolved", "rate", "interval", "cheats",
                       "infra errors"], evaluation_rows, id="harness-evaluations")),
        section("RL rollouts per harness", table(["run", "harness", "rollouts", "graded", "resolved", "mean reward",
                                                  "mean turns", "mean tokens"], rollout_rows,
                                                 id="harness-rollouts")),
        html.Div("`lego compare` draws the same comparison from MLflow.", className="subtle"),
    ]
