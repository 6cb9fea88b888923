"""Issue 34: the pipeline's stages across a cluster on this machine (tests/local_cluster.py).

A head and two worker nodes, each in its own network, mount and host-name namespaces on a private bridge; each
worker with its own Docker engine that shares no file system with the others; the work dir on the head's disk,
which the workers reach only over sshfs. `lego stage` runs on the head with `pipeline.task_runner: ray` and the
head's Ray address: the rollout shards and the grading shards run in the workers' Ray processes, each with its own
proxy and its own sandboxes on its own node's engine. Training and evaluation run where `pipeline.placement` puts
them, as Ray tasks on the nodes that offer the resources they ask for.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from unittest import mock

import pytest
from local_cluster import VENV_BIN, LocalCluster, reap_stale_clusters

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, base_image):
    """The cluster, and after the module: nothing of it left."""
    reap_stale_clusters()
    cluster = LocalCluster(tmp_path_factory.mktemp("cluster"))
    try:
        # Ray's head declares a silent node dead after about 3 s instead of about 15, and a connection to a lost
        # peer is given up after seconds, not minutes (a test waits for both). The nodes share this machine's CPUs
        # with the suite's other workers: Ray's workers keep their priority instead of Ray's niceness 15, under
        # which a rollout shard beside them got about 2% of a core (tests/test_ray_rollouts.py, start_local_ray).
        cluster.up(ray_env={"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
                            "RAY_health_check_failure_threshold": "3", "RAY_grpc_client_keepalive_time_ms": "2000",
                            "RAY_grpc_client_keepalive_timeout_ms": "2000", "RAY_worker_niceness": "0"})
        yield cluster
    finally:
        problems = cluster.down()
    assert not problems, problems


class EngineEvents:
    """Every container created on each worker's engine, as `docker events` on that node reports it."""

    def __init__(self, cluster: LocalCluster, name: str):
        self.cluster = cluster
        self.name = name
        for worker in cluster.workers:
            worker.start(f"events-{name}", ["docker", "-H", worker.docker_host, "events", "--filter",
                                            "type=container", "--filter", "event=create", "--format", "{{json .}}"])

    def stop(self) -> dict[str, list[dict]]:
        created = {}
        for worker in self.cluster.workers:
            process = worker.services.pop(f"events-{self.name}")
            process.terminate()
            process.wait(timeout=10)
            created[worker.name] = [json.loads(line)["Actor"]["Attributes"]
                                    for line in worker.log(f"events-{self.name}", tail=10**7).splitlines()
                                    if line.startswith("{")]
        return created


def lego_stage(cluster: LocalCluster, config: Path, stage: str, *overrides: str) -> dict:
    result = cluster.head.run([VENV_BIN / "lego", "stage", stage, "-c", config, *overrides],
                              env=cluster.node_env(cluster.head), timeout=600, check=False)
    assert result.returncode == 0, f"lego stage {stage} on the head failed:\n{result.stdout[-4000:]}\n" \
                                   f"{result.stderr[-4000:]}"
    return stage_summary(result.stdout)


def stage_summary(output: str) -> dict:
    """The JSON summary `lego stage` prints after its one-line report."""
    output = "\n" + output
    return json.JSONDecoder().raw_decode(output[output.index("\n{\n") + 1:])[0]


def cluster_config(cluster: LocalCluster) -> Path:
    """Written on the head's disk (the host sees nothing at the shared path); the nodes read it at the shared path."""
    (cluster.disk / "cluster.yaml").write_text(f"""base: test.yaml
project:
  work_dir: {cluster.shared / "work"}
tasks:
  limit: 2
eval:
  limit: 1
pipeline:
  task_runner: ray
  ray_address: "{cluster.head.address}:6379"
  rollout_shards: 2
docker:
  start_private_daemon: false
""")
    return cluster.shared / "cluster.yaml"


def stored_rows(cluster: LocalCluster, sql: str, params: list) -> list[dict]:
    """Read from the head's disk, as an operator on the head would."""
    from lego.config import load_config
    from lego.data.catalog import Catalog
    from lego.workdir import WorkDir

    with mock.patch.dict(os.environ):
        os.environ.pop("LEGO_WORK_DIR", None)  # a test worker's own work dir (tests/conftest.py)
        config = load_config(str(cluster.disk / "cluster.yaml"), [f"project.work_dir={cluster.disk / 'work'}"])
    assert Path(config.project.work_dir) == cluster.disk / "work"
    with Catalog.open(WorkDir(cluster.disk / "work"), config, in_memory=True) as catalog:
        return catalog.rows(sql, params)


@pytest.mark.parametrize("harness", ["mini-swe-agent", "claude-code"])
def test_rollouts_and_their_grading_run_on_the_workers_engines(cluster, harness):
    """mini-swe-agent runs beside its sandbox (in the worker's Ray process); Claude Code runs inside it, its
    install copied to the worker's engine as a content volume. Either way: every rollout stored once on the shared
    storage, each worker's engine holding the sandboxes of its own shard, and the grading on those engines."""
    from rollout_helpers import installed

    # Installed before, as on machines started from one image: the nodes have no route to a package registry.
    installed(harness)
    config = cluster_config(cluster)
    samples = 2 if harness == "mini-swe-agent" else 1  # the slower harness: one attempt per task, one per node
    overrides = [f"harness.name={harness}", f"rollout.samples_per_task={samples}"]
    lego_stage(cluster, config, "taskset", *overrides)
    events = EngineEvents(cluster, harness)
    try:
        rollout = lego_stage(cluster, config, "rollout", *overrides)
        verify = lego_stage(cluster, config, "verify", *overrides)
    finally:
        created = events.stop()

    assert rollout["stage"]["cached"] is False and verify["stage"]["cached"] is False
    result = stage_result(cluster, rollout)
    data_run_id = result["data"]["data_run_id"]
    rows = stored_rows(cluster, "SELECT rollout_id, task_id FROM rollouts WHERE run_id = ? AND stage = 'rollout'",
                       [data_run_id])
    ids = [row["rollout_id"] for row in rows]
    assert len(ids) == 2 * samples and len(set(ids)) == len(ids), rows  # 2 tasks x samples, each stored once

    by_node = {node: [labels for labels in containers if labels.get("lego.purpose") == "rollout"]
               for node, containers in created.items()}
    graded_by_node = {node: [labels for labels in containers if labels.get("lego.purpose", "").startswith("verify")]
                      for node, containers in created.items()}
    for worker in cluster.workers:
        # The sandboxes on a worker's engine were opened by that worker's processes (its host name) and no other.
        assert by_node[worker.name], f"no rollout sandbox on {worker.name}'s engine: {created}"
        if harness == "mini-swe-agent":  # the random policy's Claude Code sessions leave no diff: nothing to run
            assert graded_by_node[worker.name], f"no grading on {worker.name}'s engine: {created}"
        assert {labels["lego.host"] for labels in created[worker.name]} == {worker.name}
    # One shard per node, whole tasks: a task's image (named by the task) is sampled on one node only.
    rollout_images = {node: {labels["image"] for labels in sandboxes} for node, sandboxes in by_node.items()}
    assert not set.intersection(*rollout_images.values()), rollout_images

    outcomes = stored_rows(cluster, "SELECT rollout_id, kind FROM outcomes WHERE run_id = ? AND stage = ?",
                           [data_run_id, _outcome_stage(cluster, verify)])
    assert sorted(row["rollout_id"] for row in outcomes) == sorted(ids)
    assert all(row["kind"] != "infra_error" for row in outcomes), outcomes

    if harness == "claude-code":  # its install reached each worker's engine as a content volume
        for worker in cluster.workers:
            volumes = worker.run(["docker", "-H", worker.docker_host, "volume", "ls", "-q"]).stdout
            assert "lego-content-" in volumes, volumes
    else:  # training and evaluation run where pipeline.placement puts them: each pinned to a node by its resource
        placed = ["pipeline.placement.train.resources.worker1=1", "pipeline.placement.evaluate.resources.worker2=1"]
        lego_stage(cluster, config, "dataset", *overrides)
        # a placement no node can meet is refused at once (Ray itself would wait for ever)
        refused = cluster.head.run([VENV_BIN / "lego", "stage", "train", "-c", config, *overrides,
                                    "pipeline.placement.train.num_gpus=1"], env=cluster.node_env(cluster.head),
                                   timeout=300, check=False)
        assert refused.returncode != 0 and "no live node of the Ray cluster has it (short of {'GPU': 1.0})" in \
            refused.stdout + refused.stderr, refused.stdout[-3000:] + refused.stderr[-3000:]
        events = EngineEvents(cluster, "placed")
        try:
            train = lego_stage(cluster, config, "train", *overrides, *placed)
            evaluate = lego_stage(cluster, config, "evaluate", *overrides, *placed)
        finally:
            created = events.stop()
        assert stage_result(cluster, train)["host"] == "worker1"
        assert stage_result(cluster, evaluate)["host"] == "worker2"
        # the evaluation's attempt and its grading on worker2's engine, opened there; nothing on worker1's
        assert created["worker2"] and {labels["lego.host"] for labels in created["worker2"]} == {"worker2"}
        assert not created["worker1"], created["worker1"]


def stage_result(cluster: LocalCluster, summary: dict) -> dict:
    """The stage's result file, read from the head's disk."""
    path = Path(summary["stage"]["path"].replace(str(cluster.shared), str(cluster.disk))) / "result.json"
    return json.loads(path.read_text())


def _outcome_stage(cluster: LocalCluster, verify: dict) -> str:
    return stage_result(cluster, verify)["data"]["outcome_stage"]


def test_the_workers_reach_the_storage_only_over_the_network(cluster):
    """The head's disk is hidden on the workers; what they see at the shared path is the sshfs mount."""
    for worker in cluster.workers:
        mounts = worker.run(["cat", "/proc/self/mounts"]).stdout
        shared = [line for line in mounts.splitlines() if f" {cluster.shared} " in line]
        assert shared and shared[-1].split()[2] == "fuse.sshfs", shared
        assert worker.run(["ls", "-A", cluster.disk]).stdout.strip() == ""
        assert worker.run(["ip", "-4", "-o", "addr"]).stdout.count("inet ") == 2  # loopback and its bridge address
    marker = cluster.shared / "written-on-worker1"
    cluster.workers[0].run(["sh", "-c", f"echo hello > {marker}"])
    assert (cluster.disk / marker.name).read_text() == "hello\n"
    assert cluster.workers[1].run(["cat", marker]).stdout == "hello\n"
    for node in cluster.nodes:  # no route but the bridge's subnet: traffic only between the nodes (and loopback)
        routes = node.run(["ip", "-4", "route"]).stdout.strip().splitlines()
        assert len(routes) == 1 and routes[0].startswith(f"{cluster.subnet}.0/24 dev eth0"), routes


def test_prefect_and_mlflow_keep_their_records_in_the_head_s_database_server(cluster):
    """After the stage tests: Prefect's server and MLflow's tracking server, both services on the head, hold the
    runs in PostgreSQL, and MLflow's artifacts went through its server to the shared storage; no SQLite store of
    either was made in the work dir."""
    flow_runs = cluster.psql("prefect", "SELECT name FROM flow WHERE id IN (SELECT flow_id FROM flow_run)").split()
    assert "lego-stage" in flow_runs and "lego-stage-placed" in flow_runs, flow_runs
    assert "lego-stage-verify" in flow_runs, flow_runs  # the grading shards' subflow, run from the head
    assert int(cluster.psql("prefect", "SELECT count(*) FROM task_run WHERE name LIKE 'rollout-shard%'")) >= 2
    stage_runs = cluster.psql("mlflow", "SELECT name FROM runs").split()
    assert {"rollout/0", "verify/0", "train/0", "evaluate/0"} <= set(stage_runs), stage_runs
    artifacts = [path for path in (cluster.disk / "mlflow-artifacts").rglob("*") if path.is_file()]
    assert artifacts, "no MLflow artifact reached the shared storage"
    assert not list((cluster.disk / "work").rglob("*.db")), list((cluster.disk / "work").rglob("*.db"))


def test_losing_a_worker_mid_stage_loses_and_duplicates_nothing(cluster):
    """Last in the module: it kills worker2 (every process of the node, its engine and its containers, its link) once
    its shard has a sandbox running. Ray reruns that shard on worker1, which runs only the rollouts not stored yet."""
    from rollout_helpers import installed

    installed("mini-swe-agent")
    config = cluster_config(cluster)
    # A rollout key of its own; one attempt per task, so one per node: what is lost is all worker2 had.
    overrides = ["project.seed=34", "harness.name=mini-swe-agent", "rollout.samples_per_task=1"]
    lego_stage(cluster, config, "taskset", *overrides)
    lost, survivor = cluster.workers[1], cluster.workers[0]
    EngineEvents(cluster, "loss")
    stage = cluster.head.start("rollout-loss", [VENV_BIN / "lego", "stage", "rollout", "-c", config, *overrides],
                               env=cluster.node_env(cluster.head))
    try:
        deadline = time.monotonic() + 300
        while '"lego.purpose":"rollout"' not in lost.log("events-loss", tail=10**6).replace(" ", ""):
            assert stage.poll() is None, cluster.head.log("rollout-loss")
            assert time.monotonic() < deadline, "worker2's shard never started a sandbox"
            time.sleep(0.5)
        cluster.kill_node(lost)
        assert stage.wait(timeout=480) == 0, cluster.head.log("rollout-loss", tail=6000)
    finally:
        if stage.poll() is None:
            stage.kill()
        survivor.services.pop("events-loss").terminate()
        lost.services.pop("events-loss", None)
    summary = stage_summary(cluster.head.log("rollout-loss", tail=10**6))
    result = stage_result(cluster, summary)
    rows = stored_rows(cluster, "SELECT rollout_id, termination FROM rollouts WHERE run_id = ? AND stage = 'rollout'",
                       [result["data"]["data_run_id"]])
    ids = [row["rollout_id"] for row in rows]
    assert len(ids) == 2 and len(set(ids)) == 2, rows  # 2 tasks x 1 sample: nothing lost, nothing stored twice
    # The killed node's unfinished attempts were rerun, not stored as the policy's failures.
    survivor_sandboxes = [json.loads(line)["Actor"]["Attributes"]
                          for line in survivor.log("events-loss", tail=10**7).splitlines() if line.startswith("{")]
    assert {labels.get("lego.task") for labels in survivor_sandboxes if labels.get("lego.purpose") == "rollout"} \
        == {row["rollout_id"].split(".", 1)[1].rsplit(".", 1)[0] for row in rows}
