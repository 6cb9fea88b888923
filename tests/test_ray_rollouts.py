"""Issue 14: the rollout stage's shards on Ray (pipeline.task_runner: ray, through prefect-ray) on a local Ray
instance with two worker processes. Each shard starts its own proxy and engine (tests/ray_doubles.py); trajectories
land in the shared work dir exactly once; a worker SIGKILLed mid-shard costs only its unfinished rollouts (Ray
reruns the shard's task, which runs only what is not stored); a shard frozen on a node Ray still sees fails the stage
after `pipeline.stall_timeout_s`, and the rerun runs only what is missing."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from lego import CONFIGS_DIR

if importlib.util.find_spec("prefect_ray") is None:  # found, not imported: collection need not import Ray
    pytest.skip("pipeline.task_runner=ray needs the ray extra: pip install -e '.[ray]'", allow_module_level=True)

TESTS_DIR = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def prefect_api():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def start_local_ray() -> None:
    """A local Ray instance with two worker CPUs (two shard tasks at once), every address on loopback.

    Its workers keep the test's CPU priority: Ray renices its workers to 15 by default (a cluster node's raylet
    comes first), and beside the suite's CPU-bound xdist workers at 0 a niceness-15 shard got about 2% of a core:
    in CI its start-up alone (imports, tokenizer) took 11 minutes and the killed shard's rerun ran out of time."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             _system_config={"worker_niceness": 0})


def rollout_stage_on_ray(overrides: list[str]) -> dict:
    """The taskset stage, then the rollout stage with its flow on the configured (Ray) task runner."""
    from prefect import flow

    from flows import stages
    from flows.rollout import rollout_flow_for
    from lego.config import load_config
    from lego.pipeline.pipeline_run import PipelineRun
    from lego.workdir import WorkDir

    @flow(name="lego-test-rollout-on-ray")
    def stage() -> dict:
        config = load_config(str(CONFIGS_DIR / "test.yaml"), overrides)
        run = PipelineRun(config, WorkDir.create(config.project.work_dir))
        stages.taskset(run.run_id)
        result = rollout_flow_for(config)(run.run_id, 0)
        run.finish("completed", {})
        return {"data_run_id": result.data["data_run_id"], "metrics": result.metrics}

    return stage()


def ray_stage_setup(monkeypatch, switch: str, mark: Path, work: Path, model: str, samples: int, *extra: str) -> list:
    """Ray's worker processes inherit this environment: the runner double (tests/) and its kill or stop switch.
    Returns the overrides of a 2-task, 2-shard rollout stage on Ray with the runner double."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv(switch, str(mark))
    return [f"project.work_dir={work}", "pipeline.runner=ray_doubles:ProxyRunner", "pipeline.task_runner=ray",
            "pipeline.rollout_shards=2", "tasks.limit=2", f"rollout.samples_per_task={samples}",
            "filter.enabled=false", "warmstart.enabled=false", "eval.at_start=false", f"model.path={model}", *extra]


def test_rollout_shards_run_on_ray_workers_and_a_killed_worker_costs_only_its_unfinished_rollouts(
        prefect_api, tmp_path, tiny_model_path, monkeypatch):
    import ray

    mark = tmp_path / "killed"
    work = tmp_path / "work"
    overrides = ray_stage_setup(monkeypatch, "LEGO_RAY_KILL_MARK", mark, work, tiny_model_path, 3)
    # The task runner finds the local Ray instance initialized and uses it, as it would a cluster at
    # pipeline.ray_address.
    start_local_ray()
    try:
        summary = rollout_stage_on_ray(overrides)
    finally:
        if ray.is_initialized():
            ray.shutdown()

    files = sorted(work.glob(f"data/{summary['data_run_id']}/rollout/iter=0/rollouts-*.parquet"))
    rows = [row for path in files for row in pq.read_table(path, columns=["rollout_id", "metadata_json"]).to_pylist()]
    ids = [row["rollout_id"] for row in rows]
    assert len(ids) == len(set(ids)) == 6, ids  # 2 tasks x 3 samples: none lost, none stored twice
    assert summary["metrics"]["rollouts"] == 6
    meta = {row["rollout_id"]: json.loads(row["metadata_json"]) for row in rows}
    pids = {m["pid"] for m in meta.values()}
    # The shards ran in Ray worker processes, not in the flow's; each process served its rollouts from its own proxy.
    assert os.getpid() not in pids and len(pids) >= 2, pids
    # Each shard served its rollouts from a proxy of its own, in one worker process (a worker may run several
    # shards one after the other: the killed shard's rerun lands on whichever worker is free).
    by_proxy: dict[str, set[int]] = {}
    for m in meta.values():
        by_proxy.setdefault(m["proxy"], set()).add(m["pid"])
    assert all(len(owners) == 1 for owners in by_proxy.values()), by_proxy
    assert len(by_proxy) == 3, by_proxy  # two shards and the rerun of the killed one
    # what each shard's proxy served (its max_tokens cuts the scripted answer): that rollout's own answer
    assert all(m["reply"] and f"answer for {rid}".startswith(m["reply"]) for rid, m in meta.items()), meta
    # One worker was SIGKILLed right after storing its first trajectory: that one is kept (stored once, by the dead
    # process), and the rest of its shard ran again elsewhere without redoing it.
    killed_pid, killed_rollout = mark.read_text().split()
    assert meta[killed_rollout]["pid"] == int(killed_pid)
    assert sum(1 for m in meta.values() if m["pid"] == int(killed_pid)) == 1


@pytest.mark.timeout(480)  # without the stall guard the stage would wait on the frozen shard for ever
def test_a_frozen_shard_fails_the_stage_after_the_stall_timeout_and_a_rerun_runs_only_what_is_missing(
        prefect_api, tmp_path, tiny_model_path, monkeypatch):
    """A shard that stops making progress while Ray still sees its node (here its worker process SIGSTOPs itself
    after storing one trajectory) would hold the stage for ever: `pipeline.stall_timeout_s` ends it with an error
    that says what to do, the stored trajectory stays, and the rerun stores the rest, each once."""
    import ray

    from lego.pipeline import pipeline_run, progress
    from lego.pipeline.progress import StageStalledError

    mark = tmp_path / "stopped"
    work = tmp_path / "work"
    overrides = ray_stage_setup(monkeypatch, "LEGO_RAY_STOP_MARK", mark, work, tiny_model_path, 2,
                                "pipeline.stall_timeout_s=20")

    def seconds_since_the_freeze() -> float:
        """The guard's clock stands still until the shard froze: a loaded machine's Ray start-up before the first
        store (over 90 s under the suite in CI) is not what this test measures, and must not fire the guard."""
        return time.time() - mark.stat().st_mtime if mark.exists() else 0.0

    start_local_ray()
    try:
        with monkeypatch.context() as patch, pytest.raises(StageStalledError, match="rerun the stage"):
            patch.setattr(pipeline_run, "follow", functools.partial(progress.follow, clock=seconds_since_the_freeze))
            rollout_stage_on_ray(overrides)
    finally:
        ray.shutdown()  # kills the frozen worker too
    stopped_pid, stopped_rollout = mark.read_text().split()

    start_local_ray()
    try:  # the rerun, on the real clock and the default stall limit
        summary = rollout_stage_on_ray(overrides[:-1])
    finally:
        ray.shutdown()
    files = sorted(work.glob(f"data/{summary['data_run_id']}/rollout/iter=0/rollouts-*.parquet"))
    rows = [row for path in files for row in pq.read_table(path, columns=["rollout_id", "metadata_json"]).to_pylist()]
    ids = [row["rollout_id"] for row in rows]
    assert len(ids) == len(set(ids)) == 4, ids  # 2 tasks x 2 samples: none lost, none stored twice
    owner = {row["rollout_id"]: json.loads(row["metadata_json"])["pid"] for row in rows}
    assert owner[stopped_rollout] == int(stopped_pid)  # stored before the freeze, kept, not run again
