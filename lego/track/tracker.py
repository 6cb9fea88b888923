"""A thin, thread-safe layer over MlflowClient: no global active run, every call names its run id.

Runs carry the tags `lego.run_id` (the pipeline run), `lego.kind` (pipeline | stage), `lego.stage`,
`lego.iteration`, `lego.artifact_key`, `lego.cached`; `lego compare` searches on them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lego.config import LegoConfig, flatten
from lego.track.store_seed import seed_sqlite_store
from lego.workdir import WorkDir

# Files up to this size are copied into MLflow on a fresh computation; larger ones are referenced by path.
LOG_FILE_LIMIT_BYTES = 2 * 1024 * 1024
PARAM_VALUE_LIMIT = 6000


def tracking_uri(config: LegoConfig, work: WorkDir) -> str:
    return config.tracking.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI") or work.mlflow_uri


def experiment_name(config: LegoConfig) -> str:
    return config.tracking.experiment or config.project.name


def config_tags(config: LegoConfig) -> dict[str, str]:
    return {"lego.harness": config.harness.name, "lego.model": config.model.name,
            "lego.task_set": config.tasks.source, "lego.engine": config.engine.kind}


class Tracker:
    def __init__(self, config: LegoConfig, work: WorkDir):
        from mlflow.tracking import MlflowClient

        self.config = config
        self.work = work
        self.uri = tracking_uri(config, work)
        seed_sqlite_store(self.uri)
        self.client = MlflowClient(tracking_uri=self.uri)
        self.experiment_id = self._experiment()

    def _experiment(self) -> str:
        name = experiment_name(self.config)
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        location = None
        if self.uri.startswith("sqlite:") or self.uri.startswith("file:"):
            self.work.mlflow_artifacts.mkdir(parents=True, exist_ok=True)
            location = self.work.mlflow_artifacts.as_uri()
        try:
            return self.client.create_experiment(name, artifact_location=location)
        except Exception:  # another process created it first
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    # ------------------------------------------------------------------------------------------ runs
    def find_run(self, tags: Mapping[str, str]) -> str | None:
        query = " and ".join(f"tags.`{key}` = '{value}'" for key, value in tags.items())
        runs = self.client.search_runs([self.experiment_id], filter_string=query, max_results=1)
        return runs[0].info.run_id if runs else None

    def start_pipeline_run(self, run_id: str, extra_tags: Mapping[str, str] | None = None) -> str:
        """The parent run of a pipeline run; a resumed run reuses its parent."""
        existing = self.find_run({"lego.run_id": run_id, "lego.kind": "pipeline"})
        if existing:
            self.client.update_run(existing, status="RUNNING")
            return existing
        tags = {"lego.run_id": run_id, "lego.kind": "pipeline", **config_tags(self.config), **(extra_tags or {})}
        run = self.client.create_run(self.experiment_id, run_name=run_id, tags=tags)
        self.log_params(run.info.run_id, flatten(self.config.model_dump(mode="json")))
        return run.info.run_id

    def start_stage_run(self, parent: str, run_id: str, stage: str, iteration: int | None) -> str:
        name = stage if iteration is None else f"{stage}/{iteration}"
        tags = {"mlflow.parentRunId": parent, "lego.run_id": run_id, "lego.kind": "stage", "lego.stage": stage,
                "lego.iteration": "" if iteration is None else str(iteration), **config_tags(self.config)}
        run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
        return run.info.run_id

    def end(self, mlflow_run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(mlflow_run_id, status=status)

    # ------------------------------------------------------------------------------------------ logging
    def log_params(self, mlflow_run_id: str, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(key, _param_value(value)) for key, value in params.items()]
        for start in range(0, len(items), 100):
            self.client.log_batch(mlflow_run_id, params=items[start:start + 100])

    def log_metrics(self, mlflow_run_id: str, metrics: Mapping[str, float], step: int = 0) -> None:
        import math
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(_metric_key(key), float(value), now, step) for key, value in metrics.items()
                 if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(float(value))]
        for start in range(0, len(items), 500):
            self.client.log_batch(mlflow_run_id, metrics=items[start:start + 500])

    def log_metric_steps(self, mlflow_run_id: str, steps: Sequence[tuple[int, Mapping[str, float]]]) -> None:
        """Log a series: each (step, metrics) pair at its own step, in batches (one call per step would be one
        SQLite write each: a warm start of hundreds of steps)."""
        import math
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(_metric_key(key), float(value), now, int(step)) for step, metrics in steps
                 for key, value in metrics.items()
                 if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(float(value))]
        for start in range(0, len(items), 500):
            self.client.log_batch(mlflow_run_id, metrics=items[start:start + 500])

    def set_tags(self, mlflow_run_id: str, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(key, str(value)[:PARAM_VALUE_LIMIT]) for key, value in tags.items()]
        if items:
            self.client.log_batch(mlflow_run_id, tags=items)

    def log_outputs(self, mlflow_run_id: str, outputs: Mapping[str, Path], *, copy: bool) -> None:
        """Reference every output by path (tag `lego.ref.<name>`); copy small files into the run when `copy`.

        On a cache hit `copy` is False: the run links the artifact that already exists, nothing is duplicated.
        """
        self.set_tags(mlflow_run_id, {f"lego.ref.{name}": str(path) for name, path in outputs.items()})
        if not copy:
            return
        for name, path in outputs.items():
            path = Path(path)
            if path.is_file() and path.stat().st_size <= LOG_FILE_LIMIT_BYTES:
                self.client.log_artifact(mlflow_run_id, str(path), artifact_path=name)


def _param_value(value: Any) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= PARAM_VALUE_LIMIT else text[:PARAM_VALUE_LIMIT - 3] + "..."


def _metric_key(key: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "_-./ " else "_" for ch in key)
