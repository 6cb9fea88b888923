"""Issue 14: the proxy tunnel. A sandbox reaches its own proxy session over the engine's exec stream, with no bind
mount (so the engine may be on another machine) and no network: its own session answers, no other session does,
the agent can neither stop nor replace the relay, and what the harness is served is recorded by the proxy."""
# ruff: noqa: F811  (the `proxy` fixture imported from proxy_doubles is a parameter here)

from __future__ import annotations

import json

import pytest
from proxy_doubles import BackgroundProxy, ScriptedEngine, proxy  # noqa: F401  (the fixture)
from test_sandbox_isolation import PROBE, status_in

from lego.sandbox.docker_sandbox import KEEPER_UID, PROXY_MOUNT, DockerSandboxFactory

pytestmark = pytest.mark.docker

RELAY_PORT = 18080
CHAT = json.dumps({"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hello"}]})



@pytest.fixture(scope="module")
def tunnel_factory(docker_engine, lego_config, base_image):
    return DockerSandboxFactory(docker_engine.client, lego_config.sandbox, base_image=base_image, reap=False,
                                proxy_channel="tunnel")


def open_tunnelled(factory, image, proxy):
    session = proxy.server.open_session(own_socket=True, socket_uid=KEEPER_UID)
    path = proxy.server.session_socket(session.id)
    sandbox = factory.open(image, proxy_socket_dir=path.parent)
    try:
        relay = sandbox.start_proxy_relay(path.name, RELAY_PORT, session.id)
    except BaseException:
        sandbox.close()
        raise
    return sandbox, session, relay


def chat_in(sandbox, url: str) -> dict:
    """POST a chat completion from inside the sandbox, as a harness would; the answer's JSON."""
    import shlex

    script = PROBE.replace("print(u.urlopen(request, timeout=10).status)",
                           "print(u.urlopen(request, timeout=10).read().decode())")
    sandbox.put_file("/tmp/chat.py", script.encode())
    output = sandbox.exec(f"python3 /tmp/chat.py {shlex.quote(url)} {shlex.quote(CHAT)}", timeout=60).output
    return json.loads(output)


def test_the_tunnel_needs_no_mount_and_reaches_its_own_session_only(tunnel_factory, calc_image, proxy):
    first, first_session, relay = open_tunnelled(tunnel_factory, calc_image, proxy)
    second, second_session, _ = open_tunnelled(tunnel_factory, calc_image, proxy)
    with first, second:
        # Nothing of the worker's file system is in the container: the socket directory is not mounted.
        assert first.exec(f"test -e {PROXY_MOUNT} || echo ABSENT").output.strip() == "ABSENT"
        assert not [m for m in first.container.attrs["Mounts"] if m.get("Type") == "bind"]
        assert first.container.attrs["HostConfig"]["NetworkMode"] == "none"
        assert status_in(first, f"{relay}/s/{first_session.id}/v1/models") == "200"
        # Another live session, a closed one, a guessed id: unknown through this sandbox's tunnel.
        closed = proxy.server.open_session()
        proxy.server.close_session(closed.id)
        for other in (second_session.id, closed.id, "x" * 32):
            assert status_in(first, f"{relay}/s/{other}/v1/models") == "404", other
            assert status_in(first, f"{relay}/s/{other}/v1/chat/completions", CHAT) == "404", other
        # A completion through the tunnel is served and recorded in this session, token for token.
        proxy.engine.script("tunnelled answer")
        answer = chat_in(first, f"{relay}/s/{first_session.id}/v1/chat/completions")
        assert answer["choices"][0]["message"]["content"] == "tunnelled answer"
        segments, calls = first_session.trajectory_parts()
        assert len(calls) == 1 and segments
        sampled = [int(t) for t, m in zip(segments[0].token_ids, segments[0].response_mask, strict=True) if m]
        assert sampled == list(proxy.engine.results[-1].token_ids)
        assert (segments[0].logprobs[segments[0].response_mask == 1] != 0).all()
        assert second_session.trajectory_parts()[1] == []
        # Still no route out of the sandbox.
        outside = first.exec("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), 3)\"")
        assert outside.exit_code != 0
    proxy.server.close_session(first_session.id)
    proxy.server.close_session(second_session.id)


def test_the_agent_cannot_stop_or_replace_the_tunnel_relay(tunnel_factory, calc_image, proxy):
    sandbox, session, relay = open_tunnelled(tunnel_factory, calc_image, proxy)
    with sandbox:
        for attack in ("pkill -9 python3", "pkill -9 -u 1001", "kill -9 -1",
                       "python3 -c \"import socket; s=socket.socket(); s.bind(('127.0.0.1', 18080))\""):
            sandbox.exec(f"{attack}; true", timeout=10)
            assert sandbox.is_running(), attack
        assert status_in(sandbox, f"{relay}/s/{session.id}/v1/models") == "200"
        # Why: the relay is the keeper's process, with the exec stream as its stdio; the agent reaches neither.
        owners = sandbox.exec("ps -eo uid=,args= | grep 'lego relay\\|struct.Struct' | grep -v grep").output
        assert owners and all(line.split()[0] == str(KEEPER_UID) for line in owners.splitlines()), owners
        assert sandbox.exec("ls /proc/$(pgrep -u 1001 python3 | head -1)/fd 2>&1 || true").output.count(
            "Permission denied") == 1
        # Its stray processes are reclaimed; the relay is spared and still serves.
        assert sandbox.reclaim_processes()
        assert status_in(sandbox, f"{relay}/s/{session.id}/v1/models") == "200"
    # The session closed: the tunnel has nothing to connect to; the sandbox sees its connection end.
    proxy.server.close_session(session.id)


def test_a_closed_session_fails_the_tunnel_health_check(tunnel_factory, calc_image, proxy):
    from lego.sandbox import SandboxError

    session = proxy.server.open_session(own_socket=True, socket_uid=KEEPER_UID)
    path = proxy.server.session_socket(session.id)
    with tunnel_factory.open(calc_image, proxy_socket_dir=path.parent) as sandbox:
        proxy.server.close_session(session.id)
        with pytest.raises(SandboxError, match="does not reach the proxy session"):
            sandbox.start_proxy_relay(path.name, RELAY_PORT, session.id, wait_s=2)
