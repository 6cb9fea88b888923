"""lego.track: MLflow runs, params, metrics, tags and outputs (logged when computed, referenced when cached)."""

from __future__ import annotations

import os
import subprocess
import sys

from lego.config import load_config
from lego.track.tracker import Tracker
from lego.workdir import WorkDir


def test_pipeline_and_stage_runs(tmp_path):
    config = load_config("test", [f"project.work_dir={tmp_path / 'w'}"])
    work = WorkDir.create(config.project.work_dir)
    tracker = Tracker(config, work)
    assert tracker.uri == work.mlflow_uri
    parent = tracker.start_pipeline_run("run-a")
    assert tracker.start_pipeline_run("run-a") == parent  # a resumed run reuses its parent
    params = tracker.client.get_run(parent).data.params
    assert params["train.lr"] == str(config.train.lr) and params["harness.name"] == "mini-swe-agent"

    small = tmp_path / "report.json"
    small.write_text('{"resolved": 1}')
    stage = tracker.start_stage_run(parent, "run-a", "evaluate", 0)
    tracker.log_metrics(stage, {"resolved_rate": 0.5, "nan": float("nan")}, step=0)
    tracker.log_outputs(stage, {"eval_report": small}, copy=True)
    tracker.end(stage)
    cached = tracker.start_stage_run(parent, "run-a", "evaluate", 1)
    tracker.log_outputs(cached, {"eval_report": small}, copy=False)

    run = tracker.client.get_run(stage)
    assert run.data.tags["mlflow.parentRunId"] == parent
    assert run.data.tags["lego.stage"] == "evaluate" and run.data.tags["lego.iteration"] == "0"
    assert run.data.metrics == {"resolved_rate": 0.5}
    assert run.data.tags["lego.ref.eval_report"] == str(small)
    assert [f.path for f in tracker.client.list_artifacts(stage, "eval_report")] == ["eval_report/report.json"]
    assert tracker.client.list_artifacts(cached) == []  # a cache hit links, never copies
    assert tracker.client.get_run(cached).data.tags["lego.ref.eval_report"] == str(small)
    artifact_root = tracker.client.get_experiment(tracker.experiment_id).artifact_location
    assert artifact_root.startswith(work.mlflow_artifacts.as_uri())


def test_step_series_go_to_the_stage_run_and_the_pipeline_run(tmp_path):
    import json

    import pytest

    from lego.track.steps import StepSeriesError, log_stage_steps, stage_steps

    config = load_config("test", [f"project.work_dir={tmp_path / 'w'}"])
    tracker = Tracker(config, WorkDir.create(config.project.work_dir))
    parent = tracker.start_pipeline_run("run-steps")
    stage = tracker.start_stage_run(parent, "run-steps", "warmstart", None)
    sft = tmp_path / "sft_steps.json"  # the warm start's history: a list without step numbers
    sft.write_text(json.dumps([{"loss": 2.0, "token_accuracy": 0.1}, {"loss": 1.5, "token_accuracy": float("nan")}]))
    assert log_stage_steps(tracker, "warmstart", {"sft_steps": str(sft)}, stage_run=stage,
                           pipeline_run=parent) == {"loss", "token_accuracy"}
    assert [(m.step, m.value) for m in tracker.client.get_metric_history(parent, "warmstart.loss")] == \
        [(1, 2.0), (2, 1.5)]
    assert [m.step for m in tracker.client.get_metric_history(stage, "step.token_accuracy")] == [1]  # NaN left out

    old = tmp_path / "metrics.json"  # a train artifact from before steps were kept
    old.write_text(json.dumps({"loss": 0.5}))
    assert stage_steps("train", {"train_metrics": str(old)}) == []
    assert stage_steps("verify", {"outcomes": str(old)}) == []  # a stage without steps
    old.write_text('{"steps": [{"step": 3, "loss": ')
    with pytest.raises(StepSeriesError, match="lego stage train --force"):
        stage_steps("train", {"train_metrics": str(old)})


def test_a_lego_process_starts_no_mlflow_telemetry():
    """Outside CI and pytest (whose variables MLflow itself reads as "no telemetry"), as a user's `lego run` and the
    cluster's head run: MLflow's telemetry thread, offline, removes an environment variable while a request to the
    tracking server reads the environment, and that request fails."""
    quiet = {"PYTEST_CURRENT_TEST", "CI", "GITHUB_ACTIONS", "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK"}
    env = {key: value for key, value in os.environ.items() if key not in quiet}
    check = ("from mlflow.telemetry.client import get_telemetry_client as client; "
             "from mlflow.telemetry.utils import is_telemetry_disabled as off; print(off(), client() is None)")
    with_lego = subprocess.run([sys.executable, "-c", "import lego, mlflow; " + check], env=env, capture_output=True,
                               text=True, check=True).stdout.split()
    assert with_lego == ["True", "True"], with_lego
    # the control: mlflow alone, in the same environment, would start it
    alone = subprocess.run([sys.executable, "-c", "import mlflow; " + check], env=env, capture_output=True, text=True,
                           check=True).stdout.split()
    assert alone[0] == "False", alone
