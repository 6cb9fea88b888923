"""What `lego run` prints without a terminal (CI, a pipe, a deployment's log): a line per stage and the summary on
stdout; Prefect's, MLflow's and the libraries' chatter only in the run's log file; both in plain lines (no carriage
return, no ANSI escape); the log ending, as stdout does, with the summary and the next commands.

The run is real (Prefect's ephemeral API, MLflow, DuckDB, the dataset and train stages) on the test config; its
rollouts and grades come from tests/pipeline_doubles.py, as in test_pipeline.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lego import REPO_ROOT

TESTS_DIR = Path(__file__).resolve().parent
CONTROL = re.compile(r"[\r\x1b\x08]")
STAGES = ["taskset", "rollout/0", "verify/0", "dataset/0", "train/0", "evaluate/0"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_model_path):
    work = tmp_path_factory.mktemp("run-output") / "work"
    command = [sys.executable, "-m", "lego_cli", "run", "-c", "test", f"project.work_dir={work}",
               "pipeline.runner=pipeline_doubles:DoubleRunner", "tasks.limit=2", "eval.limit=1",
               "rollout.samples_per_task=2", "eval.splits=[train,eval]", "eval.samples_per_task=2",
               "eval.samples_per_split={eval: 3}", f"model.path={tiny_model_path}"]
    env = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}  # the ephemeral API, as a user
    env["PYTHONPATH"] = f"{TESTS_DIR}:{REPO_ROOT}"
    done = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    logs = sorted(work.glob("runs/*/run.log"))
    assert len(logs) == 1, logs
    return done, logs[0].read_text(), work


def test_the_log_and_stdout_hold_plain_lines(finished_run):
    done, log, _ = finished_run
    assert not CONTROL.search(log), [line for line in log.splitlines() if CONTROL.search(line)][:5]
    assert not CONTROL.search(done.stdout)
    # the third-party chatter is in the log only
    assert "Starting temporary server" in log and "Beginning flow run" in log
    for noise in ("Starting temporary server", "Beginning flow run", "| INFO", "mlflow.store", "Loading weights"):
        assert noise not in done.stdout, noise
    assert done.stderr.strip() == "", done.stderr[-2000:]


def test_stdout_has_a_line_per_stage_and_ends_with_the_summary_and_the_next_commands(finished_run):
    done, _, work = finished_run
    lines = done.stdout.splitlines()
    for stage in STAGES:
        assert sum(1 for line in lines if line.startswith(stage + " ")) == 1, (stage, lines)
    assert any(line.startswith("run run-") and " completed in " in line for line in lines)
    assert any(line.strip().startswith("before RL") for line in lines)
    assert any(line.strip().startswith("after RL") for line in lines)
    tail = lines[lines.index("next:"):]
    for command in ("lego ui", "lego status", "lego server", "lego data show"):
        assert any(line.strip().startswith(f"{command} -c test project.work_dir={work}") for line in tail), command
    assert "http://127.0.0.1:8050" in done.stdout and "http://127.0.0.1:5000" in done.stdout
    assert tail[-1].strip().startswith("this run's files:")


def test_the_log_ends_as_stdout_does(finished_run):
    done, log, _ = finished_run
    summary = done.stdout[done.stdout.index("\nrun run-"):].strip().splitlines()
    assert log.strip().splitlines()[-len(summary):] == summary


def test_each_split_is_attempted_as_often_as_its_samples_say(finished_run):
    from lego.pipeline.manifest import latest_run_id, load_manifest
    from lego.workdir import WorkDir

    work = WorkDir.create(finished_run[2])
    metrics = load_manifest(work, latest_run_id(work)).stages["evaluate/0"].metrics
    # eval.samples_per_split gives the held-out split (1 task) 3 attempts; the train split (2 tasks) keeps 2 each
    assert metrics["attempts"] + metrics.get("infra_errors", 0) == 3
    assert metrics["train.attempts"] + metrics.get("train.infra_errors", 0) == 4


def test_plain_strips_escapes_and_carriage_returns():
    from lego_cli.run_output import plain

    assert plain("\x1b[1;32mok\x1b[0m\n") == "ok\n"
    assert plain("Loading: 10%\rLoading: 100%\r\n") == "Loading: 10%\nLoading: 100%\n"
    assert plain("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\ \x08done") == "link done"
