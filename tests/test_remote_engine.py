"""Issue 14: sandboxes on a Docker engine that shares no file system with the rollout worker.

A second dockerd runs inside a container of the dev engine (an image built offline: the sandbox base image plus this
machine's dockerd, containerd and runc with their libraries), on its own data root, reached over TCP on
127.0.0.1 only. Nothing of the worker's file system is mounted into it, so a bind mount of the session socket could
not work there; `docker.proxy_channel: auto` picks the tunnel for it (a TCP engine is never assumed local). A sandbox
on it reaches its own proxy session and no other, with network mode none, and what it is served is recorded by the
proxy; a rollout of a harness beside the sandbox (mini-swe-agent) runs on it with its tokens recorded.
"""
# ruff: noqa: F811  (the `proxy` fixture imported from proxy_doubles is a parameter here)

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from proxy_doubles import BackgroundProxy, ScriptedEngine, proxy  # noqa: F401  (the fixture)
from test_proxy_tunnel import CHAT, chat_in
from test_sandbox_isolation import status_in

from lego.sandbox.docker_sandbox import KEEPER_UID, DockerSandboxFactory

pytestmark = pytest.mark.docker

BINARIES = ["/usr/sbin/dockerd", "/usr/bin/containerd", "/usr/sbin/runc", "/usr/bin/docker-init",
            "/usr/bin/containerd-shim-runc-v2"]
# Every capability this machine's bounding set allows: --privileged asks for all of them and fails where the
# machine itself runs without some (here CAP_SYS_RESOURCE).
CAPS = ["CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
        "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER", "SYS_MODULE",
        "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_ADMIN", "SYS_NICE", "MKNOD", "AUDIT_WRITE", "SETFCAP"]
RELAY_PORT = 18080


def _free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _libraries(binary: str) -> list[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    return [part for line in out.splitlines() for part in line.split() if part.startswith("/")]


@pytest.fixture(scope="module")
def remote_engine(docker_engine, base_image, calc_image, tmp_path_factory):
    """A docker client for a dockerd in a container, on tcp://127.0.0.1:PORT, holding the base and calc images."""
    import docker
    from docker.errors import APIError, DockerException

    missing = [binary for binary in BINARIES if not Path(binary).exists()]
    if missing or shutil.which("ldd") is None:
        pytest.skip(f"no Docker engine binaries to put in the inner engine's image here: {missing or 'ldd'}")
    # A client of its own: building the image and removing a container with an engine inside take more than the
    # session client's few seconds of timeout.
    outer = docker.DockerClient(base_url=docker_engine.base_url, timeout=300)
    context = tmp_path_factory.mktemp("dind")
    for binary in BINARIES:
        for path in [binary, *_libraries(binary)]:
            target = context / "rootfs" / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(path).resolve(), target)
    (context / "Dockerfile").write_text(f"FROM {base_image}\nCOPY rootfs/ /\n")
    image, _ = outer.images.build(path=str(context), tag="lego-test-dind:latest", network_mode="none", rm=True)
    port = _free_loopback_port()
    try:
        container = outer.containers.run(
            image.id, ["dockerd", "--host", f"tcp://127.0.0.1:{port}", "--bridge=none", "--iptables=false",
                       "--ip6tables=false", "--ip-forward=false", "--ip-masq=false", "--data-root", "/var/lib/docker",
                       "--exec-root", "/run/docker-exec", "--pidfile", "/run/dockerd.pid",
                       "--cgroup-parent", f"lego-test-dind-{port}"],
            detach=True, name=f"lego-test-dind-{port}", network_mode="host", cap_add=CAPS,
            security_opt=["seccomp=unconfined", "apparmor=unconfined"],
            device_cgroup_rules=["a *:* rwm"], cgroupns="host", tmpfs={"/run": ""},
            # The inner engine's images and containers live in a volume of its own; /sys/fs/cgroup is the kernel's
            # cgroup tree it creates its containers' cgroups in, not a file system the worker shares data through.
            volumes={"/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"},
                     f"lego-test-dind-{port}": {"bind": "/var/lib/docker", "mode": "rw"}})
    except (APIError, DockerException) as exc:
        pytest.skip(f"the dev engine cannot run a Docker engine in a container here: {exc}")
    inner = None
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                inner = docker.DockerClient(base_url=f"tcp://127.0.0.1:{port}", timeout=120)
                inner.ping()
                break
            except DockerException:
                container.reload()
                if container.status != "running" or time.monotonic() > deadline:
                    logs = container.logs(tail=20).decode(errors="replace")
                    pytest.skip(f"the inner dockerd did not start: {logs}")
                time.sleep(0.5)
        # No registry: images travel as `docker save | docker load`, over the API, as they would to another host.
        for tag in (base_image, calc_image):
            inner.images.load(b"".join(outer.images.get(tag).save(named=True)))
        yield inner
    finally:
        if inner is not None:
            inner.close()
        container.remove(force=True, v=True)
        try:
            outer.volumes.get(f"lego-test-dind-{port}").remove(force=True)
        except (APIError, DockerException):
            pass
        outer.close()



def test_a_sandbox_on_a_remote_engine_reaches_its_own_session_through_the_tunnel(remote_engine, lego_config,
                                                                                  base_image, calc_image, proxy):
    factory = DockerSandboxFactory(remote_engine, lego_config.sandbox, base_image=base_image, reap=False)
    assert factory.proxy_channel == "tunnel"  # auto: a TCP engine is never assumed to share our file system
    mine = proxy.server.open_session(own_socket=True, socket_uid=KEEPER_UID)
    other = proxy.server.open_session(own_socket=True, socket_uid=KEEPER_UID)
    path = proxy.server.session_socket(mine.id)
    with factory.open(calc_image, proxy_socket_dir=path.parent) as sandbox:
        # The container is the inner engine's: the dev engine does not know it.
        assert remote_engine.containers.get(sandbox.sandbox_id).attrs["HostConfig"]["NetworkMode"] == "none"
        relay = sandbox.start_proxy_relay(path.name, RELAY_PORT, mine.id)
        assert status_in(sandbox, f"{relay}/s/{mine.id}/v1/models") == "200"
        assert status_in(sandbox, f"{relay}/s/{other.id}/v1/models") == "404"
        proxy.engine.script("served across engines")
        answer = chat_in(sandbox, f"{relay}/s/{mine.id}/v1/chat/completions")
        assert answer["choices"][0]["message"]["content"] == "served across engines"
        segments, calls = mine.trajectory_parts()
        assert len(calls) == 1
        sampled = [int(t) for t, m in zip(segments[0].token_ids, segments[0].response_mask, strict=True) if m]
        assert sampled == list(proxy.engine.results[-1].token_ids)
        assert other.trajectory_parts()[1] == []
        assert sandbox.exec("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), 3)\"").exit_code
    assert json.loads(CHAT)["messages"]


def test_a_rollout_on_a_remote_engine_records_its_tokens(remote_engine, lego_config, work_dir, base_image,
                                                          calc_task, tiny_model_path):
    from rollout_helpers import installed, tool_call, with_overrides

    from lego.engine.scripted import ScriptedEngine as PolicyScript
    from lego.engine.tokenizer import load_tokenizer
    from lego.engine.transformers_engine import TransformersEngine
    from lego.records import TerminationReason
    from lego.rollout.attempt import run_rollout
    from lego.rollout.resources import rollout_resources

    installed("mini-swe-agent")
    config = with_overrides(lego_config, harness={"name": "mini-swe-agent", "max_turns": 4, "timeout_s": 180},
                            sampling={"max_tokens": 256})
    script = [tool_call("bash", {"command": "hostname; ls /proc/1/root >/dev/null 2>&1; echo ON-REMOTE"}),
              tool_call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})]
    scorer = TransformersEngine(tiny_model_path, dtype="bfloat16", max_context=32768)
    engine = PolicyScript(scorer, load_tokenizer(), script)
    host = remote_engine.api.base_url.replace("http://", "tcp://")

    async def go():
        async with rollout_resources(config, work_dir, engine, harness="mini-swe-agent", docker_client=remote_engine,
                                     docker_host=host, base_image=base_image) as (adapter, resources):
            return await run_rollout(calc_task, adapter, resources=resources, config=config, rollout_id="remote")

    try:
        trajectory = asyncio.run(go())
    finally:
        scorer.close()
    assert trajectory.termination == TerminationReason.completed, trajectory.harness_log[-2000:]
    assert len(trajectory.calls) == 2 and trajectory.segments
    sampled = sum(int(segment.response_mask.sum()) for segment in trajectory.segments)
    assert sampled > 0 and all(segment.routed_experts is not None for segment in trajectory.segments)
    transcript = Path(trajectory.metadata["transcripts"][0]).read_text()
    assert "ON-REMOTE" in transcript


def _content_volumes(engine) -> dict[str, str]:
    """The content volumes on `engine`: the directory each holds -> its name."""
    from lego.sandbox.content_volume import CONTENT_LABEL

    return {volume.attrs["Labels"][CONTENT_LABEL]: volume.name
            for volume in engine.volumes.list(filters={"label": CONTENT_LABEL}) if not volume.name.endswith("-ready")}


def test_grading_runs_on_the_remote_engine_with_its_runner_copied_there(remote_engine, lego_config, base_image,
                                                                        calc_task):
    """The verifier on an engine that shares no file system with the worker: its runner (a read-only bind mount on
    a local engine) travels as a content volume, and the gold patch is graded resolved and the empty one not,
    with every grading sandbox on that engine."""
    from lego.verify.grader import Verifier
    from lego.verify.pytest_grading import RUNNER_DIR

    verifier = Verifier(remote_engine, base_image, lego_config.sandbox, lego_config.verify)
    assert verifier.factory.files_channel == "volume"
    assert verifier.verify(calc_task, diff=calc_task.patch).kind.value == "resolved"
    assert verifier.verify(calc_task, diff="").kind.value == "unresolved"
    assert str(RUNNER_DIR.resolve()) in _content_volumes(remote_engine)


def test_a_sandbox_harness_solves_a_task_on_the_remote_engine_and_is_graded_there(remote_engine, lego_config,
                                                                                  work_dir, base_image,
                                                                                  tiny_model_path):
    """Claude Code runs inside the sandbox: its install, a bind mount on a local engine, reaches the remote engine
    as a content volume, and the scripted gold replies (through the tunnel to the proxy) solve the bundled task,
    graded resolved on the same engine."""
    from rollout_helpers import bundled_task, gold_script, installed, with_overrides

    from lego.engine.scripted import ScriptedEngine as PolicyScript
    from lego.engine.tokenizer import load_tokenizer
    from lego.engine.transformers_engine import TransformersEngine
    from lego.records import TerminationReason
    from lego.rollout.attempt import run_rollout
    from lego.rollout.resources import rollout_resources
    from lego.verify.grader import Verifier

    _, install = installed("claude-code")
    task = bundled_task()
    config = with_overrides(lego_config, harness={"name": "claude-code", "max_turns": 6, "timeout_s": 240},
                            sampling={"max_tokens": 2048})
    scorer = TransformersEngine(tiny_model_path, dtype="bfloat16", max_context=32768)
    engine = PolicyScript(scorer, load_tokenizer(), gold_script("claude-code", task))
    host = remote_engine.api.base_url.replace("http://", "tcp://")

    async def go():
        async with rollout_resources(config, work_dir, engine, harness="claude-code", docker_client=remote_engine,
                                     docker_host=host, base_image=base_image) as (adapter, resources):
            assert resources.factory.files_channel == "volume"
            return await run_rollout(task, adapter, resources=resources, config=config, rollout_id="remote-cc")

    try:
        trajectory = asyncio.run(go())
    finally:
        scorer.close()
    assert trajectory.termination == TerminationReason.completed, trajectory.harness_log[-3000:]
    assert "+" in trajectory.final_diff and {call.protocol for call in trajectory.calls} == {"anthropic_messages"}
    assert str((install / "install").resolve()) in _content_volumes(remote_engine)
    outcome = Verifier(remote_engine, base_image, lego_config.sandbox, lego_config.verify).verify(task, trajectory)
    assert outcome.kind.value == "resolved", outcome
