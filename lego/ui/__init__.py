"""`lego ui`: a live dashboard of one pipeline run or several, served on loopback.

Built on Dash (Plotly): components and callbacks in Python, Plotly figures for the curves, `dcc.Interval` for the
live refresh; its Flask server is served by Werkzeug on 127.0.0.1 only. Modules:

- `data.py`: what each panel shows (pydantic models), read from the run's manifest, `lego status`'s diagnosis
  (lego/pipeline/diagnosis.py: stage in progress, last progress, live rollouts, findings) and the DuckDB catalog
  (lego/data/queries.py); nothing there knows about Dash.
- `trajectory.py`: one rollout's segments token by token (the real Qwen3 tokenizer), with mask, log-prob and
  routed experts per token: what MLflow's trace viewer cannot show.
- `mlflow_links.py`: links into MLflow's UI (the run, a rollout's trace when one is stored).
- `panels.py`: the Dash components of each panel; `app.py`: the app, its callbacks and the server.
- `browser.py`: headless Chromium through Selenium, for the dashboard's test and its screenshot.
"""

from lego.ui.app import UiServer, create_app, serve

__all__ = ["UiServer", "create_app", "serve"]
