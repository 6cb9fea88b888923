"""The pipeline's wiring on real Prefect (test harness), real MLflow, real DuckDB/Parquet and the real dataset and
train stages; rollouts and grades come from tests/pipeline_doubles.py (the real ones run in test_pipeline_e2e.py).

Covers: a full run; a second run served from cache in every stage; a train-config change recomputing only train
and what follows; `stage train --from RUN`; a run killed mid-rollout resuming with nothing lost; a served
deployment firing on its schedule; MLflow's runs, params, metrics and artifacts.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from lego import CONFIGS_DIR, REPO_ROOT

TESTS_DIR = Path(__file__).resolve().parent
ALL = ["taskset", "rollout/0", "verify/0", "dataset/0", "train/0", "evaluate/0"]
PREFECT_SERVER_ERROR = re.compile(r"PrefectHTTPStatusError: Server error '5\d\d ")


@pytest.fixture(scope="module")
def prefect_api():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        from prefect.settings import PREFECT_API_URL

        yield PREFECT_API_URL.value()


@pytest.fixture(scope="module")
def overrides(tmp_path_factory, tiny_model_path):
    work = tmp_path_factory.mktemp("pipeline") / "work"
    return [f"project.work_dir={work}", "pipeline.runner=pipeline_doubles:DoubleRunner", "tasks.limit=2",
            "eval.limit=1", "rollout.samples_per_task=2", f"model.path={tiny_model_path}"]


def work_of(overrides):
    from lego.workdir import WorkDir

    return WorkDir(Path(overrides[0].split("=", 1)[1]))


def run(overrides, extra=(), **kwargs):
    from flows.pipeline import pipeline_flow

    return pipeline_flow(config=str(CONFIGS_DIR / "test.yaml"), overrides=[*overrides, *extra], **kwargs)


@pytest.fixture(scope="module")
def first_run(prefect_api, overrides):
    return run(overrides)


def test_full_run_then_cached_rerun(first_run, overrides):
    from lego.pipeline.manifest import load_manifest

    assert first_run["computed"] == sorted(ALL) and first_run["served_from_cache"] == []
    manifest = load_manifest(work_of(overrides), first_run["run_id"])
    assert manifest.status == "completed"
    train = manifest.get("train", 0)
    assert train.data["trained"] and train.data["policy_version"] == 1
    assert (Path(train.outputs["checkpoint"]) / "model.safetensors").is_file()
    assert manifest.get("dataset", 0).metrics["in_loss"] == 4

    second = run(overrides)
    assert second["served_from_cache"] == sorted(ALL) and second["computed"] == []
    assert {label: info["key"] for label, info in second["stages"].items()} == \
        {label: info["key"] for label, info in first_run["stages"].items()}


def test_train_change_reruns_train_and_what_follows(first_run, overrides):
    changed = run(overrides, ["train.lr=3e-4"])
    assert changed["served_from_cache"] == sorted(["taskset", "rollout/0", "verify/0", "dataset/0"])
    assert changed["computed"] == ["evaluate/0", "train/0"]


def test_stage_from_earlier_run(first_run, overrides):
    from flows.pipeline import stage_flow

    config = str(CONFIGS_DIR / "test.yaml")
    same = stage_flow(stage="train", config=config, overrides=overrides, from_run=first_run["run_id"])
    assert same["stage"]["cached"] and same["stage"]["key"] == first_run["stages"]["train/0"]["key"]
    other = stage_flow(stage="train", config=config, overrides=[*overrides, "train.lr=5e-4"],
                       from_run=first_run["run_id"])
    assert not other["stage"]["cached"] and other["stage"]["key"] != first_run["stages"]["train/0"]["key"]
    forced = stage_flow(stage="dataset", config=config, overrides=overrides, from_run=first_run["run_id"], force=True)
    assert not forced["stage"]["cached"] and forced["stage"]["key"] == first_run["stages"]["dataset/0"]["key"]


def test_mlflow_holds_runs_params_metrics_artifacts(first_run, overrides):
    from lego.config import load_config
    from lego.track.tracker import Tracker

    config = load_config("test", overrides)
    tracker = Tracker(config, work_of(overrides))
    runs = tracker.client.search_runs([tracker.experiment_id], f"tags.`lego.run_id` = '{first_run['run_id']}'")
    parent = next(r for r in runs if r.data.tags["lego.kind"] == "pipeline")
    stages = {r.info.run_name: r for r in runs if r.data.tags["lego.kind"] == "stage"}
    assert sorted(stages) == sorted(ALL)
    assert parent.data.params["train.lr"] == str(config.train.lr)
    assert parent.data.tags["lego.harness"] == "mini-swe-agent" and parent.data.tags["lego.task_set"] == "bundled"
    assert "train.loss" in parent.data.metrics and "evaluate.resolved_rate" in parent.data.metrics
    for run_ in stages.values():
        assert run_.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run_.data.tags["lego.cached"] == "false" and run_.data.tags["lego.artifact_key"]
    evaluate = stages["evaluate/0"]
    assert {"resolved_rate", "resolved_low", "resolved_high", "infra_error_rate"} <= set(evaluate.data.metrics)
    assert evaluate.data.tags["lego.policy_version"] == "1"
    assert [a.path for a in tracker.client.list_artifacts(evaluate.info.run_id)] == ["eval_outcomes", "eval_report"]
    assert Path(stages["train/0"].data.tags["lego.ref.checkpoint"]).is_dir()  # referenced, not copied
    assert "input.train.lr" in stages["train/0"].data.params
    # every rollout is a trace (lego/track/traces.py), graded by the verify stage, linked to its stage run
    traces = tracker.client.search_traces(locations=[tracker.experiment_id], include_spans=False,
                                          filter_string=f"tags.`lego.run_id` = '{first_run['run_id']}'")
    rollouts = [t for t in traces if t.info.tags["lego.stage"] == "rollout"]
    assert len(rollouts) == 4 == stages["rollout/0"].data.metrics["traces_logged"]
    assert stages["rollout/0"].data.metrics["traces_failed"] == stages["verify/0"].data.metrics["traces_failed"] == 0
    assert {t.info.trace_metadata["mlflow.sourceRun"] for t in rollouts} == {stages["rollout/0"].info.run_id}
    assert {t.info.tags["lego.stage"] for t in traces} == {"rollout", "evaluate"}
    assert all(t.info.tags["lego.outcome"] in ("resolved", "unresolved") for t in traces)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


TWO_ITERATIONS = ["pipeline.iterations=2", "train.epochs=2", "rollout.samples_per_task=6"]


@pytest.fixture(scope="module")
def two_iterations(prefect_api, overrides):
    """Two iterations of two optimizer steps each over 12 rollouts an iteration, with the run's log lines (the
    pipeline logs through its flow run's logger; pytest's stdout is no terminal, so progress comes as lines)."""
    import flows.pipeline  # noqa: F401  (its first import configures Prefect's logging: handlers added before go)

    handler = _Lines()
    logger = logging.getLogger("prefect.flow_runs")
    logger.addHandler(handler)
    try:
        summary = run(overrides, TWO_ITERATIONS)
    finally:
        logger.removeHandler(handler)
    return summary, handler.lines


def test_mlflow_draws_per_step_curves_across_iterations(two_iterations, overrides):
    import json

    from lego.config import load_config
    from lego.pipeline.manifest import load_manifest
    from lego.track.tracker import Tracker

    summary, _ = two_iterations
    config = load_config("test", [*overrides, *TWO_ITERATIONS])
    tracker = Tracker(config, work_of(overrides))
    parent = tracker.find_run({"lego.run_id": summary["run_id"], "lego.kind": "pipeline"})
    manifest = load_manifest(work_of(overrides), summary["run_id"])
    # every optimizer step on one axis: the second iteration's trainer counts on from the first one's checkpoint
    recorded = [step for iteration in (0, 1) for step in
                json.loads(Path(manifest.get("train", iteration).outputs["train_metrics"]).read_text())["steps"]]
    assert [step["step"] for step in recorded] == [1, 2, 3, 4]
    loss = tracker.client.get_metric_history(parent, "train.loss")
    assert sorted((m.step, m.value) for m in loss) == [(step["step"], step["loss"]) for step in recorded]
    for name in ("entropy", "kl_to_inference", "logprob_pearson", "grad_norm", "learning_rate", "clip_fraction"):
        assert sorted(m.step for m in tracker.client.get_metric_history(parent, f"train.{name}")) == [1, 2, 3, 4]
    # a train stage's own run has its steps too; its summary stays one value per iteration
    train_run = tracker.find_run({"lego.run_id": summary["run_id"], "lego.kind": "stage", "lego.stage": "train",
                                  "lego.iteration": "1"})
    assert sorted(m.step for m in tracker.client.get_metric_history(train_run, "step.loss")) == [3, 4]
    assert [m.step for m in tracker.client.get_metric_history(train_run, "loss")] == [1]
    # the stages' other metrics are per iteration (step = iteration)
    for name in ("train.groups_with_signal", "rollout.rollouts_per_hour", "rollout.mean_turns",
                 "verify.outcome.resolved"):
        assert sorted(m.step for m in tracker.client.get_metric_history(parent, name)) == [0, 1], name
    rollout = manifest.get("rollout", 1).metrics
    # the doubles: 2 tasks x 6 samples of 2 calls; the second is a rewrite for samples 1, 3, 5 and a sub-agent's
    # for samples 0 and 4
    assert rollout["rollouts"] == 12 == rollout["rollouts_run"] and rollout["llm_calls"] == 24
    assert (rollout["rewrite_calls"], rollout["subagent_calls"]) == (6, 4)
    assert rollout["rewrite_share"] == pytest.approx(6 / 24) and rollout["subagent_share"] == pytest.approx(4 / 24)
    assert rollout["rollouts_per_hour"] > 0
    verify = manifest.get("verify", 1).metrics
    assert verify["cheat_rules_fired"] == 0 and verify["outcome.resolved"] == verify["outcome.unresolved"] == 6


def test_progress_comes_as_periodic_lines_per_stage(two_iterations):
    _, lines = two_iterations
    for iteration in (0, 1):
        rollout = [line for line in lines if re.match(rf"rollout/{iteration}: \d+/\d+ done", line)]
        verify = [line for line in lines if re.match(rf"verify/{iteration}: \d+/\d+ graded", line)]
        assert rollout[-1] == f"rollout/{iteration}: 12/12 done (completed 12)"
        assert verify[-1] == f"verify/{iteration}: 12/12 graded (resolved 6, unresolved 6)"
        # a line each tenth at most (12 rollouts: every 2), never one per rollout
        assert 1 <= len(rollout) <= 6 and 1 <= len(verify) <= 6, (rollout, verify)
        # the update's micro-batch passes, counted to the last one
        train = [line for line in lines if re.match(rf"train/{iteration}: \d+/\d+ micro-batch passes", line)]
        assert train, lines
        done, total = map(int, re.match(r"train/\d+: (\d+)/(\d+)", train[-1]).groups())
        assert done == total > 0
    assert not [line for line in lines if "-> completed" in line]  # the old line per rollout


def _subprocess_env(prefect_api: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "PREFECT_API_URL": prefect_api, "PYTHONPATH": f"{TESTS_DIR}:{REPO_ROOT}", **extra}


def test_killed_run_resumes_with_nothing_lost(prefect_api, overrides, tmp_path):
    from lego.pipeline.manifest import latest_run_id, load_manifest

    fresh = [f"project.work_dir={tmp_path / 'work'}", *overrides[1:]]
    command = [sys.executable, "-m", "lego_cli", "run", "-c", "test", *fresh]
    killed = subprocess.run(command, env=_subprocess_env(prefect_api, LEGO_DOUBLE_KILL_AFTER="2"),
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    work = work_of(fresh)
    run_id = latest_run_id(work)
    before = load_manifest(work, run_id)
    assert before.status == "running" and "taskset" in before.stages and "rollout/0" not in before.stages
    kept = sorted(work.data.glob("rollout-*/rollout/iter=0/rollouts-*.parquet"))
    assert len(kept) == 2

    resumed = run(fresh, run_id=run_id, resume=True)
    assert resumed["run_id"] == run_id and "taskset" in resumed["served_from_cache"]
    files = sorted(work.data.glob("rollout-*/rollout/iter=0/rollouts-*.parquet"))
    assert files[:2] == kept and len(files) == 4  # the two stored before the crash were not rerun
    ids = [i for f in files for i in pq.read_table(f).column("rollout_id").to_pylist()]
    assert len(ids) == len(set(ids)) == 4
    assert load_manifest(work, run_id).status == "completed"


def test_served_deployment_fires_on_schedule(first_run, overrides, tmp_path):
    """`lego deploy` starts a Prefect server (the ephemeral API has no scheduler) and serves; a 5 s interval
    schedule must fire and complete a pipeline run (served from cache: same config as the first run)."""
    import socket

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = _subprocess_env("", PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="3", PREFECT_RUNNER_POLL_FREQUENCY="3",
                          PREFECT_HOME=str(tmp_path / "prefect"))
    env.pop("PREFECT_API_URL")
    command = [sys.executable, "-m", "lego_cli", "deploy", "-c", "test", *overrides, "schedule.interval_s=5",
               "--prefect-port", str(port)]
    server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        states: list[str] = []
        with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{port}/api"}):
            while time.monotonic() < deadline and "COMPLETED" not in states:
                time.sleep(3)
                assert server.poll() is None, server.stdout.read()[-3000:]
                try:
                    with get_client(sync_client=True) as client:
                        runs = client.read_flow_runs(
                            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=["lego-test-pipeline"])))
                except Exception:  # the server is still starting
                    continue
                states = [r.state.type.value for r in runs if r.state is not None]
                # A run the Prefect server itself failed (it answers 5xx when the machine is overloaded) says
                # nothing about the pipeline; the next scheduled run is what counts. Any other failure is a bug.
                broken = [f"{r.name}: {r.state.type.value}: {r.state.message}" for r in runs
                          if r.state is not None and r.state.type.value in ("FAILED", "CRASHED")
                          and not PREFECT_SERVER_ERROR.search(r.state.message or "")]
                assert not broken, broken
        assert "COMPLETED" in states, f"no scheduled run completed in time: {states}"
    finally:
        server.send_signal(signal.SIGINT)  # lego deploy stops serving, then its server
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_warm_start_is_the_policy_rl_starts_from(prefect_api, overrides):
    """With the warm start on: its demonstrations are the gold-script rollouts, only the resolved ones are trained
    on, and iteration 0's rollouts sample from the fine-tuned policy (version 1); a rerun serves it from cache."""
    from lego.data.catalog import Catalog
    from lego.pipeline.manifest import load_manifest

    extra = ["warmstart.enabled=true", "warmstart.steps=3", "eval.at_start=true", "eval.splits=[eval, train]"]
    first = run(overrides, extra)
    assert "warmstart" in first["computed"] and "baseline" in first["computed"]
    work = work_of(overrides)
    manifest = load_manifest(work, first["run_id"])
    warm = manifest.get("warmstart")
    assert warm.data["policy_version"] == 1 and warm.metrics["steps"] == 3
    assert 0 < warm.metrics["resolved_demonstrations"] <= warm.metrics["demonstrations"] == 2
    assert (Path(warm.outputs["checkpoint"]) / "model.safetensors").is_file()
    rollout = manifest.get("rollout", 0)
    assert rollout.data["policy_version"] == 1 and rollout.data["policy_path"] == warm.data["policy_path"]
    from lego.config import load_config

    config = load_config(str(CONFIGS_DIR / "test.yaml"), [*overrides, *extra])
    with Catalog.open(work, config, in_memory=True) as catalog:
        versions = {row["policy_version"] for row in catalog.rows(
            "SELECT policy_version FROM rollouts WHERE run_id = ? AND stage = 'rollout'", [rollout.data["data_run_id"]])}
    assert versions == {1}
    # The learning curve: policy 0 (the warm start's) measured on both splits before RL, policy 1 after it.
    from lego.pipeline.learning import learning_curve, plot_learning_curve

    curve = learning_curve(manifest)
    start, after = curve["curve"]
    assert start["policy"] == 0 and after["policy"] == 1
    assert start["warmstart"]["steps"] == 3
    assert start["eval_split"]["attempts"] == 1 and start["train_split_eval"]["attempts"] == 2
    assert start["train_split"]["attempts"] == 4  # rollout/0's graded samples at policy 0
    assert 0 <= start["train_split"]["low"] <= start["train_split"]["rate"] <= start["train_split"]["high"] <= 1
    assert after["eval_split"]["attempts"] == 1 and after["train_split_eval"]["attempts"] == 2
    assert start["groups"]["in_loss"] == 2 and "loss" in start["train_step"]
    assert curve["stage_seconds"]["warmstart"] > 0
    verdict = curve["verdict"]  # the last evaluation of the train split against the one before RL
    assert verdict["start"] == start["train_split_eval"] and verdict["end"] == after["train_split_eval"]
    assert verdict["rise"] == after["train_split_eval"]["rate"] - start["train_split_eval"]["rate"]
    assert verdict["intervals_apart"] == (after["train_split_eval"]["low"] > start["train_split_eval"]["high"])
    assert plot_learning_curve(curve, work.root / "curve.png").stat().st_size > 0
    # MLflow: the warm start's loss per SFT step, then RL's optimizer steps counting on from them
    from lego.track.tracker import Tracker

    tracker = Tracker(config, work)
    parent = tracker.find_run({"lego.run_id": first["run_id"], "lego.kind": "pipeline"})
    assert sorted(m.step for m in tracker.client.get_metric_history(parent, "warmstart.loss")) == [1, 2, 3]
    assert [m.step for m in tracker.client.get_metric_history(parent, "train.loss")] == [4]
    again = run(overrides, extra)
    assert "warmstart" in again["served_from_cache"]
    # The sft arm trains on the demonstrations, not on rollouts: its iterations sample and grade nothing.
    sft = run(overrides, [*extra, "train.adv_estimator=sft", "train.epochs=1"])
    assert sorted(sft["stages"]) == ["baseline", "evaluate/0", "taskset", "train/0", "warmstart"]
    assert sft["computed"] == ["evaluate/0", "train/0"]
    sft_manifest = load_manifest(work, sft["run_id"])
    assert sft_manifest.get("train", 0).metrics["sequences"] == warm.metrics["resolved_demonstrations"]
    before, after_sft = learning_curve(sft_manifest)["curve"]
    assert "train_split" not in before and after_sft["policy"] == 1 and after_sft["eval_split"]["attempts"] == 1
