"""The Dash app of `lego ui` and its server on 127.0.0.1.

One page: a run picker, the run's header (status, stage, iteration, step, elapsed, last progress, MLflow link)
and seven tabs. A `dcc.Interval` ticks every `refresh_s`: while the shown run is `running`, each tick re-reads
it and re-renders the header and the open tab; a finished run is re-rendered only when its manifest changes.
The trajectory viewer is rendered on its own (the chosen rollout, segment and window survive refreshes), and so
are the run picker's and the rollout picker's options.

A page opens on `?run=RUN&tab=TAB&rollout=DATA_RUN/ROLLOUT` when given (links can be shared).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from dash import Dash, Input, Output, State, ctx, dcc, html, no_update
from dash.exceptions import PreventUpdate
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from lego.config import LegoConfig
from lego.data import queries
from lego.data.catalog import Catalog
from lego.errors import LegoError
from lego.pipeline.manifest import load_manifest, manifest_path
from lego.ui import data, panels
from lego.ui.mlflow_links import MlflowLinks
from lego.ui.trajectory import WINDOW, TokenText, trajectory_view
from lego.workdir import WorkDir

HOST = "127.0.0.1"  # loopback only: the dashboard shows prompts, diffs and logs, and has no authentication
TABS = {"overview": "Overview", "rollouts": "Rollouts (live)", "fidelity": "Fidelity", "tasks": "Tasks",
        "trajectory": "Trajectory", "logs": "Logs", "harnesses": "Harnesses"}
REFRESHED = ("overview", "rollouts", "fidelity", "tasks", "logs", "harnesses")  # re-rendered on a tick
RUN_CHOICES = 100  # runs offered in the picker when the dashboard serves the whole work dir
ROLLOUT_CHOICES = 1000  # newest rollouts offered in the trajectory viewer's picker
ASSETS = Path(__file__).parent / "assets"


class UiError(LegoError):
    """The dashboard cannot be served."""


class Dashboard:
    """What the callbacks share: the work dir, the config, the runs shown, MLflow links, the tokenizer."""

    def __init__(self, work: WorkDir, config: LegoConfig, runs: list[str] | None, refresh_s: float,
                 mlflow_ui: str | None) -> None:
        self.work = work
        self.config = config
        self.fixed_runs = list(runs) if runs else None
        self.refresh_s = refresh_s
        self.links = MlflowLinks(config, work, mlflow_ui)
        self.text = TokenText()

    def run_ids(self) -> list[str]:
        if self.fixed_runs is not None:
            return self.fixed_runs
        return data.list_runs(self.work)[:RUN_CHOICES]

    def mark(self, run_id: str) -> int:
        """Changes whenever the run's manifest is rewritten (a stage recorded, the run ended)."""
        path = manifest_path(self.work, run_id)
        return path.stat().st_mtime_ns if path.is_file() else 0


def _params(search: str | None) -> dict[str, str]:
    return {key: values[-1] for key, values in parse_qs((search or "").lstrip("?")).items() if values}


def _hidden(visible: bool) -> dict[str, str]:
    return {} if visible else {"display": "none"}


def layout(dashboard: Dashboard) -> html.Div:
    trajectory_controls = html.Div([
        html.Div([html.Label("rollout"), dcc.Dropdown(id="rollout", placeholder="choose a rollout",
                                                      clearable=False, optionHeight=40)], className="grow"),
        html.Div([html.Label("segment"), dcc.Dropdown(id="segment", clearable=False)], className="narrow"),
        html.Div([html.Label(f"from token (window of {WINDOW})"),
                  dcc.Input(id="token-start", type="number", min=0, step=WINDOW, value=0, debounce=True)],
                 className="narrow"),
    ], className="controls")
    log_controls = html.Div([html.Label("at least"), dcc.RadioItems(
        id="log-level", options=[{"label": level, "value": level} for level in data.LEVELS], value="info",
        inline=True)], className="controls")
    bodies = []
    for key in TABS:
        children: list[Any] = [html.Div(id=f"{key}-body", className="body")]
        if key == "trajectory":
            children.insert(0, trajectory_controls)
        elif key == "logs":
            children.insert(0, log_controls)
        bodies.append(html.Div(children, id=f"panel-{key}", className="panel", style=_hidden(key == "overview")))
    return html.Div([
        dcc.Location(id="url", refresh=False),
        html.Div([html.Div([html.H1("Lego"), html.Span("training dashboard", className="subtle")],
                           className="brand"),
                  dcc.Dropdown(id="run", clearable=False, placeholder="run", className="run-picker")],
                 className="top"),
        html.Div(id="header", className="header"),
        dcc.Tabs(id="tab", value="overview", className="tabs",
                 children=[dcc.Tab(label=label, value=key, id=f"tab-{key}") for key, label in TABS.items()]),
        html.Div(bodies, className="panels"),
        dcc.Interval(id="tick", interval=int(dashboard.refresh_s * 1000)),
        dcc.Store(id="shown"),
    ], className="lego-ui")


def _rollout_options(state: data.RunState) -> list[dict[str, str]]:
    labels = {(run.data_run_id, run.stage, run.iteration): run.label for run in state.runs}
    with state.catalog() as catalog:
        rows = queries.rollout_index(catalog, state.ids(), ROLLOUT_CHOICES)
    return [{"label": f"{labels.get((row['run_id'], row['stage'], int(row['iteration'])), row['run_id'])} · "
                      f"{row['task_id']} #{row['sample_index']} · {row['kind'] or 'not graded'}",
             "value": f"{row['run_id']}/{row['rollout_id']}"} for row in rows]


def create_app(work: WorkDir, config: LegoConfig, runs: list[str] | None = None, *, refresh_s: float = 5.0,
               mlflow_ui: str | None = None) -> Dash:
    """The dashboard over `runs` (every run of the work dir when None, newest first)."""
    dashboard = Dashboard(work, config, runs, refresh_s, mlflow_ui)
    app = Dash(__name__, title="Lego", update_title=None, assets_folder=str(ASSETS), serve_locally=True)
    app.layout = lambda: layout(dashboard)
    _navigation(app, dashboard)
    _refresh(app, dashboard)
    _trajectory(app, dashboard)
    return app


def chosen_run(wanted: str | None, fired: set[str], current: str | None, runs: list[str]) -> str | None:
    """The run to show: the URL's `wanted` when the URL fired or nothing is shown yet, else the one shown, else the
    newest. Every input that fired counts, not only the first: on a busy machine the page's first call and a tick
    arrive together, and a URL taken for a tick showed the newest run instead of the one asked for."""
    if wanted and (not fired or "url.search" in fired or current is None):
        return wanted
    return current if current in runs else (runs[0] if runs else None)


def _navigation(app: Dash, dashboard: Dashboard) -> None:
    """The run, tab and panel shown follow the URL and the run list."""

    @app.callback(Output("run", "options"), Output("run", "value"),
                  Input("url", "search"), Input("tick", "n_intervals"), State("run", "value"),
                  State("run", "options"))
    def choose_run(search: str | None, _tick: int | None, current: str | None, shown: list[dict] | None):
        runs = dashboard.run_ids()
        value = chosen_run(_params(search).get("run"), set(ctx.triggered_prop_ids), current, runs)
        options = [{"label": run, "value": run} for run in runs]
        if value and value not in runs:
            options.insert(0, {"label": value, "value": value})  # asked for by the URL: say what is wrong with it
        # Setting a prop, even to its value, fires the callbacks that read it: only what changed is set.
        return (no_update if options == shown else options), (no_update if value == current else value)

    @app.callback(Output("tab", "value"), Input("url", "search"))
    def choose_tab(search: str | None) -> str:
        tab = _params(search).get("tab", "overview")
        return tab if tab in TABS else "overview"

    @app.callback([Output(f"panel-{key}", "style") for key in TABS], Input("tab", "value"))
    def show_panel(tab: str) -> list[dict[str, str]]:
        return [_hidden(key == tab) for key in TABS]


def _refresh(app: Dash, dashboard: Dashboard) -> None:
    """The header and the shown tab's body, drawn again at each tick while the run may change."""

    # The tick is off while a render runs. Otherwise a render slower than the tick (a busy machine, a long run) is
    # outdated by the next tick before it arrives and the browser drops it, again and again: nothing is ever shown.
    @app.callback(Output("header", "children"), [Output(f"{key}-body", "children") for key in REFRESHED],
                  Output("rollout", "options"), Output("shown", "data"),
                  Input("run", "value"), Input("tab", "value"), Input("tick", "n_intervals"),
                  Input("log-level", "value"), State("shown", "data"),
                  running=[(Output("tick", "disabled"), True, False)])
    def refresh(run_id: str | None, tab: str, _tick: int | None, level: str, shown: dict | None):
        keep = [no_update] * len(REFRESHED)
        if not run_id:
            return ([html.Div(f"no run in {dashboard.work.root / 'runs'} yet: start one with `lego run`",
                              className="subtle")], *keep, no_update, None)
        now = {"run": run_id, "tab": tab, "level": level, "mark": dashboard.mark(run_id)}
        if ctx.triggered_id == "tick" and shown and shown.get("status") != "running" and \
                {k: shown.get(k) for k in now} == now:
            raise PreventUpdate  # a finished run whose manifest did not change: nothing new to show
        try:
            state = data.load_run(dashboard.work, dashboard.config, run_id)
        except LegoError as exc:
            return [html.Div(str(exc), className="bad", id="run-error")], *keep, no_update, None
        bodies = dict(zip(REFRESHED, keep, strict=True))
        options: Any = no_update
        if tab == "overview":
            model = data.overview(state)
            top = model.header
            bodies["overview"] = panels.overview(model)
        else:
            top = data.header(state)
            if tab == "rollouts":
                bodies["rollouts"] = panels.rollouts(data.rollouts(state))
            elif tab == "fidelity":
                bodies["fidelity"] = panels.fidelity(data.fidelity(state))
            elif tab == "tasks":
                bodies["tasks"] = panels.tasks(data.task_grid(state))
            elif tab == "logs":
                bodies["logs"] = panels.logs(data.logs(state, level if level in data.LEVELS else "info"))
            elif tab == "harnesses":
                bodies["harnesses"] = panels.harnesses(data.harnesses(dashboard.work, dashboard.config,
                                                                      dashboard.run_ids()))
            elif tab == "trajectory":
                options = _rollout_options(state)
        mlflow_run = state.manifest.mlflow_run_id
        note = dashboard.links.problem if mlflow_run else "no MLflow run recorded"
        return (panels.header(top, dashboard.links.run_url(mlflow_run), dashboard.links.traces_url(mlflow_run), note), *[bodies[key] for key in REFRESHED], options,
                {**now, "status": state.manifest.status})


def _trajectory(app: Dash, dashboard: Dashboard) -> None:
    """The trajectory tab: which rollout, segment and tokens are shown."""

    @app.callback(Output("rollout", "value"), Input("rollout", "options"), State("rollout", "value"),
                  State("url", "search"))
    def default_rollout(options: list[dict] | None, current: str | None, search: str | None):
        values = [option["value"] for option in options or []]
        if current in values:
            raise PreventUpdate
        wanted = _params(search).get("rollout")
        if wanted in values:
            return wanted
        return values[0] if values else None

    @app.callback(Output("trajectory-body", "children"), Output("segment", "options"), Output("segment", "value"),
                  Output("token-start", "value"),
                  Input("rollout", "value"), Input("segment", "value"), Input("token-start", "value"),
                  State("run", "value"))
    def show_trajectory(choice: str | None, segment: int | None, start: int | None, run_id: str | None):
        if not choice or "/" not in choice:
            return panels.trajectory(None), [], None, 0
        if ctx.triggered_id == "rollout":
            segment, start = 0, 0
        data_run_id, rollout_id = choice.split("/", 1)
        with Catalog.open(dashboard.work, dashboard.config, in_memory=True) as catalog:
            view = trajectory_view(catalog, data_run_id, rollout_id, dashboard.text, segment=segment or 0,
                                   start=int(start or 0))
        if view is None:
            return panels.trajectory(None, f"no stored rollout {rollout_id} in {data_run_id}"), [], None, 0
        if run_id:
            try:
                view.trace_url = dashboard.links.trace_url(load_manifest(dashboard.work, run_id).mlflow_run_id,
                                                           rollout_id)
            except LegoError:
                view.trace_url = None
        options = [{"label": f"{s.index} · {s.thread} · {s.reason} · {s.tokens} tokens", "value": s.index}
                   for s in view.segments]
        shown = view.segment
        return (panels.trajectory(view), options, shown.index if shown else None, shown.start if shown else 0)


# ---------------------------------------------------------------------------------------------- the server


class _QuietHandler(WSGIRequestHandler):
    """Logs failed requests only (each refresh is a request)."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if str(code)[:1] in ("4", "5"):
            super().log_request(code, size)


class UiServer:
    """The dashboard's WSGI server on 127.0.0.1; `start()` serves from a thread, `serve_forever()` blocks."""

    def __init__(self, app: Dash, port: int = 0) -> None:
        try:
            self._server: BaseWSGIServer = make_server(HOST, port, app.server, threaded=True,
                                                       request_handler=_QuietHandler)
        except OSError as exc:
            raise UiError(f"cannot listen on {HOST}:{port} ({exc.strerror or exc}); pick another port with --port, "
                          "or --port 0 for a free one") from None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/"

    def start(self) -> UiServer:
        self._thread = threading.Thread(target=self._server.serve_forever, name="lego-ui", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def shutdown(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> UiServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


def serve(work: WorkDir, config: LegoConfig, runs: list[str] | None = None, *, port: int = 0,
          refresh_s: float = 5.0, mlflow_ui: str | None = None) -> UiServer:
    """The dashboard's server, bound but not yet serving (call start() or serve_forever())."""
    if refresh_s <= 0:
        raise UiError(f"the refresh interval must be positive, got {refresh_s}s")
    for run_id in runs or []:
        load_manifest(work, run_id)  # an unknown run fails here, naming the runs there are
    return UiServer(create_app(work, config, runs, refresh_s=refresh_s, mlflow_ui=mlflow_ui), port)
