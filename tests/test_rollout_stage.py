"""The rollout stage: deterministic ids, persistence as rollouts end, SIGKILL mid-stage then rerun (no duplicate, no
loss, containers reaped); the sandbox harness reaches only its own proxy session and nothing else."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from rollout_helpers import bundled_task, installed, tool_call, with_overrides, worker

from lego.records import TerminationReason

pytestmark = pytest.mark.docker

STAGE_SCRIPT = textwrap.dedent("""
    import json, sys
    from lego.config import load_config
    from lego.pipeline.artifacts import StageContext
    from lego.pipeline.attempts import run_attempts
    from lego.pipeline.stored import stored_rollout_ids
    from lego.pipeline.policy import Policy
    from lego.pipeline.runners import RealRunner
    from lego.tasksets.load import load_tasks
    from lego.workdir import WorkDir

    args = json.loads(sys.argv[1])
    config = load_config("test", args["overrides"])
    tasks = [t for t in load_tasks("bundled").tasks if t.instance_id in args["tasks"]]
    ctx = StageContext(config=config, work=WorkDir.create(args["work"]), run_id="stage-test", runner=RealRunner())
    before = stored_rollout_ids(ctx, "stage-test", "rollout", 0)
    ids = run_attempts(ctx, tasks, Policy.from_path(args["model"]), samples=2, data_run_id="stage-test",
                       stage="rollout", iteration=0)
    after = stored_rollout_ids(ctx, "stage-test", "rollout", 0)
    print("STAGE", json.dumps({"new": sorted(after - before), "skipped": sorted(before & set(ids))}))
""")


def test_rollout_ids_are_deterministic_and_distinct():
    from lego.rollout.requests import rollout_id

    assert rollout_id("run.i0", "task", 1) == rollout_id("run.i0", "task", 1)
    ids = {rollout_id(f"{run}.i{it}", task, s) for run in ("a", "b") for it in (0, 1) for task in ("t1", "t2")
           for s in (0, 1)}
    assert len(ids) == 16


def stored_ids(data_dir: Path) -> list[str]:
    return [row for path in data_dir.glob("rollouts-*.parquet")
            for row in pq.read_table(path, columns=["rollout_id"]).column("rollout_id").to_pylist()]


def test_sigkill_mid_stage_then_rerun_loses_and_duplicates_nothing(tmp_path, docker_engine, base_image,
                                                                   tiny_model_path):
    from lego.config import SandboxConfig
    from lego.rollout.requests import rollout_id
    from lego.sandbox.docker_sandbox import LABEL, DockerSandboxFactory

    installed("mini-swe-agent")
    # One task x two samples, one at a time: the first is stored, the second is mid-rollout when the stage dies.
    tasks = ["lego-bundled__unitconv-1"]
    args = {"overrides": ["harness.name=mini-swe-agent", "harness.max_turns=1", "sampling.max_tokens=8",
                          "rollout.samples_per_task=2", "rollout.concurrency=1", "engine.dtype=bfloat16",
                          f"docker.host={docker_engine.base_url}"],
            "tasks": tasks, "model": str(tiny_model_path), "work": str(tmp_path / "work"),
            "docker": docker_engine.base_url, "base_image": base_image}
    script = tmp_path / "stage.py"
    script.write_text(STAGE_SCRIPT)
    data_dir = tmp_path / "work" / "data" / "stage-test" / "rollout" / "iter=0"
    command = [sys.executable, str(script), json.dumps(args)]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)

    def next_rollout_sandbox() -> bool:
        """A rollout is stored and the next one's sandbox is up (it is alive when the process dies)."""
        stored = set(stored_ids(data_dir))
        owned = docker_engine.client.api.containers(all=True, filters={"label": [LABEL, f"lego.owner_pid={first.pid}"]})
        return bool(stored) and any(c["Labels"].get("lego.rollout") not in stored for c in owned)

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not next_rollout_sandbox():
        assert first.poll() is None, first.stdout.read().decode()[-3000:]
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    survivors = set(stored_ids(data_dir))
    expected = {rollout_id("stage-test", task, sample) for task in tasks for sample in range(2)}
    assert 1 <= len(survivors) < len(expected)
    second = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    report = json.loads(second.stdout.split("STAGE ", 1)[1])
    assert set(report["skipped"]) == survivors
    assert not set(report["new"]) & survivors
    assert sorted(stored_ids(data_dir)) == sorted(expected)  # every rollout once: none lost, none twice
    # The killed process's sandbox is reaped when a factory starts.
    DockerSandboxFactory(docker_engine.client, SandboxConfig())
    dead_owner = docker_engine.client.api.containers(all=True, filters={"label": [LABEL, f"lego.owner_pid={first.pid}"]})
    assert dead_owner == []


def test_sandbox_reaches_only_its_own_session_and_no_network(lego_config, work_dir, docker_engine, base_image,
                                                            tiny_model_path):
    """A harness's commands in the sandbox: no route out; its relay serves its own session and 404s any other."""
    from lego.engine.scripted import ScriptedEngine
    from lego.engine.tokenizer import load_tokenizer
    from lego.engine.transformers_engine import TransformersEngine
    from lego.rollout.attempt import RELAY_PORT, run_rollout
    from lego.sandbox.docker_sandbox import KEEPER_UID

    installed("mini-swe-agent")
    task = bundled_task()
    probe = ("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 443), 3)\" "
             "|| echo NETWORK-BLOCKED; curl -sS -m 3 https://pypi.org 2>&1 || echo CURL-BLOCKED")
    script = [tool_call("bash", {"command": probe}),
              tool_call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})]
    config = with_overrides(lego_config, harness={"name": "mini-swe-agent", "max_turns": 4, "timeout_s": 180},
                            sampling={"max_tokens": 256})
    scorer = TransformersEngine(tiny_model_path, dtype="bfloat16", max_context=32768)
    engine = ScriptedEngine(scorer, load_tokenizer(), script)

    async def go():
        async with worker(config, work_dir, docker_engine, base_image, engine, "mini-swe-agent") as (ad, res):
            trajectory = await run_rollout(task, ad, resources=res, config=config, rollout_id="net-probe")
            # A sandbox with the relay, as sandbox harnesses get it: its own session answers, others do not.
            mine = res.proxy.open_session(own_socket=True, socket_uid=KEEPER_UID)
            other = res.proxy.open_session()
            res.proxy.close_session(other.id)
            statuses, outside = await asyncio.to_thread(probe_relay, res, mine.id, other.id)
            return trajectory, statuses, outside

    def probe_relay(res, mine_id, other_id):
        socket = res.proxy.session_socket(mine_id)
        with res.factory.open_task(task, purpose="relay-probe", proxy_socket_dir=socket.parent) as sandbox:
            relay = sandbox.start_proxy_relay(socket.name, RELAY_PORT, mine_id)
            statuses = {}
            for name, sid in (("mine", mine_id), ("closed", other_id), ("guess", "x" * 32)):
                url = f"{relay}/s/{sid}/v1/models"
                statuses[name] = sandbox.exec(
                    f"python3 -c \"import urllib.request as u, urllib.error as e\ntry: print(u.urlopen('{url}')"
                    f".status)\nexcept e.HTTPError as x: print(x.code)\"", timeout=30).output.strip()
            outside = sandbox.exec("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), 3)\"")
        return statuses, outside

    try:
        trajectory, statuses, outside = asyncio.run(go())
    finally:
        scorer.close()
    assert trajectory.termination == TerminationReason.completed, trajectory.harness_log[-2000:]
    transcript = Path(trajectory.metadata["transcripts"][0]).read_text()
    assert "NETWORK-BLOCKED" in transcript and "CURL-BLOCKED" in transcript
    assert statuses == {"mine": "200", "closed": "404", "guess": "404"}
    assert outside.exit_code != 0
