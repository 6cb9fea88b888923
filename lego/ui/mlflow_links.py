"""Links from the dashboard into MLflow's UI: a pipeline run's page, and a rollout's trace when one is stored.

The tracking store is only read. A rollout's trace is found by its `lego.rollout_id` tag (what the rollout
traces are tagged with: lego/track/traces.py) through MLflow's public search API, in the experiment of the
pipeline's MLflow run. Answers are cached: a run's experiment never changes, and a trace found stays found.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from lego.config import LegoConfig
from lego.track.tracker import tracking_uri
from lego.workdir import WorkDir

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

log = logging.getLogger(__name__)

LOCAL_UI_URL = "http://127.0.0.1:5000"  # where `lego server` serves MLflow's UI for a local store


class MlflowLinks:
    def __init__(self, config: LegoConfig, work: WorkDir, ui_url: str | None = None) -> None:
        self.uri = tracking_uri(config, work)
        remote = self.uri.startswith(("http://", "https://"))
        self.ui_url = (ui_url or (self.uri if remote else LOCAL_UI_URL)).rstrip("/")
        self._client: MlflowClient | None = None
        self._experiments: dict[str, str] = {}
        self._traces: dict[str, str] = {}
        self._lock = threading.Lock()
        self.problem: str | None = None  # why MLflow could not be read, the last time it could not

    def _store_exists(self) -> bool:
        # Opening a SQLite store that is not there would create an empty one: never write from the dashboard.
        if self.uri.startswith("sqlite:///"):
            return Path(self.uri.removeprefix("sqlite:///")).is_file()
        return True

    def client(self) -> MlflowClient | None:
        with self._lock:
            if self._client is None and self._store_exists():
                from mlflow.tracking import MlflowClient

                self._client = MlflowClient(tracking_uri=self.uri)
            return self._client

    def experiment_of(self, mlflow_run_id: str) -> str | None:
        if mlflow_run_id in self._experiments:
            return self._experiments[mlflow_run_id]
        client = self.client()
        if client is None:
            return None
        try:
            experiment = client.get_run(mlflow_run_id).info.experiment_id
        except Exception as exc:  # noqa: BLE001 - any MLflow failure only costs the link
            self.problem = f"MLflow ({self.uri}) did not answer for run {mlflow_run_id}: {type(exc).__name__}: {exc}"
            log.warning(self.problem)
            return None
        self._experiments[mlflow_run_id] = experiment
        return experiment

    def run_url(self, mlflow_run_id: str | None) -> str | None:
        experiment = self.experiment_of(mlflow_run_id) if mlflow_run_id else None
        return f"{self.ui_url}/#/experiments/{experiment}/runs/{mlflow_run_id}" if experiment else None

    def traces_url(self, mlflow_run_id: str | None) -> str | None:
        """The run's Traces tab (the traces linked to it)."""
        url = self.run_url(mlflow_run_id)
        return f"{url}/traces" if url else None

    def trace_url(self, mlflow_run_id: str | None, rollout_id: str) -> str | None:
        """The rollout's trace in MLflow's trace viewer, when the tracking store holds one."""
        experiment = self.experiment_of(mlflow_run_id) if mlflow_run_id else None
        if experiment is None:
            return None
        trace_id = self._traces.get(rollout_id)
        client = self.client()
        if trace_id is None and client is not None:
            quoted = rollout_id.replace("'", "\\'")
            try:
                found = client.search_traces(locations=[experiment], max_results=1, include_spans=False,
                                             filter_string=f"tags.`lego.rollout_id` = '{quoted}'")
            except Exception as exc:  # noqa: BLE001 - any MLflow failure only costs the link
                self.problem = f"MLflow ({self.uri}) trace search failed: {type(exc).__name__}: {exc}"
                log.warning(self.problem)
                return None
            if not found:
                return None
            trace_id = found[0].info.trace_id
            self._traces[rollout_id] = trace_id
        return f"{self.ui_url}/#/experiments/{experiment}/traces?selectedEvaluationId={trace_id}"
