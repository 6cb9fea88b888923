"""Issue 17, classes 8 and 9, as attacks: a rollout's sandbox reaches its own proxy session and nothing else, and the
agent in it has no privileges (no root, no capabilities, none to regain) and cannot stop the container or its relay.

Each sandbox gets a unix socket of its own session, in a directory of its own, mounted read-only; only the keeper
uid (the relay's) may connect to it. The agent runs as AGENT_UID and owns the repository; the container's main
process and the relay run as KEEPER_UID.
"""
# ruff: noqa: F811  (the `proxy` fixture imported from proxy_doubles is a parameter here)

from __future__ import annotations

import os
import stat
import time

import httpx
import pytest
from proxy_doubles import BackgroundProxy, ScriptedEngine, proxy  # noqa: F401  (the fixture)

from lego.sandbox.docker_sandbox import AGENT_HOME, AGENT_UID, KEEPER_UID, PROXY_MOUNT, SandboxError

RELAY_PORT = 18080



def own_session(proxy: BackgroundProxy):
    """A session with a socket of its own, as a rollout opens it (opened from another thread than the proxy's)."""
    session = proxy.server.open_session(own_socket=True, socket_uid=KEEPER_UID)
    return session, proxy.server.session_socket(session.id)


PROBE = """import sys, urllib.request as u, urllib.error as e
data = sys.argv[2].encode() if len(sys.argv) > 2 else None
request = u.Request(sys.argv[1], data=data, headers={"Content-Type": "application/json"})
try:
    print(u.urlopen(request, timeout=10).status)
except e.HTTPError as x:
    print(x.code)
except Exception as x:
    print("failed", x)
"""


def status_in(sandbox, url: str, body: str | None = None) -> str:
    """The HTTP status of GET `url` (POST `body`), as the agent sees it from inside the sandbox."""
    import shlex

    sandbox.put_file("/tmp/probe.py", PROBE.encode())
    args = " ".join(shlex.quote(arg) for arg in [url] + ([body] if body is not None else []))
    return sandbox.exec(f"python3 /tmp/probe.py {args}", timeout=30).output.strip()


def open_with_relay(factory, image, proxy):
    session, path = own_session(proxy)
    sandbox = factory.open(image, proxy_socket_dir=path.parent)
    try:
        relay = sandbox.start_proxy_relay(path.name, RELAY_PORT, session.id)
    except BaseException:
        sandbox.close()
        raise
    return sandbox, session, path, relay


# ------------------------------------------------------------------------------------------ the proxy's side


def test_a_session_socket_serves_its_own_session_only(proxy):
    mine, mine_path = own_session(proxy)
    other, other_path = own_session(proxy)
    assert mine_path.parent != other_path.parent  # a directory per session: a mount shows one socket
    assert sorted(os.listdir(mine_path.parent)) == [mine_path.name]
    if os.geteuid() == 0:  # only the relay's uid may connect (and root on the host)
        for item, mode in ((mine_path.parent, 0o700), (mine_path, 0o600)):
            info = item.stat()
            assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (KEEPER_UID, mode)
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(mine_path)), base_url="http://proxy") as client:
        assert client.get(f"/s/{mine.id}/v1/models").status_code == 200
        assert client.post(f"/s/{mine.id}/v1/chat/completions", json=chat).status_code == 200
        # The attack of issue 17: another rollout's session id through this socket. It does not exist here.
        stolen = client.post(f"/s/{other.id}/v1/chat/completions", json=chat)
        assert stolen.status_code == 404 and stolen.json()["error"]["code"] == "session_not_found"
        stolen = client.post(f"/s/{other.id}/v1/messages", json={"model": "m", "max_tokens": 8,
                                                                  "messages": [{"role": "user", "content": "hi"}]})
        assert stolen.status_code == 404 and stolen.json()["type"] == "error"
        assert client.get(f"/s/{other.id}/v1/models").status_code == 404
        assert len(proxy.engine.prompts) == 1 and not other.trajectory_parts()[1]  # nothing served for the other
        # Closing the session removes its socket and directory; a connection still open reaches nothing.
        proxy.server.close_session(mine.id)
        assert not mine_path.parent.exists() and proxy.server.session_socket(mine.id) is None
        assert client.get(f"/s/{mine.id}/v1/models").status_code == 404
        assert client.get(f"/s/{other.id}/v1/models").status_code == 404
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(other_path)), base_url="http://proxy") as client:
        assert client.get(f"/s/{other.id}/v1/models").status_code == 200
    # The loopback listener (beside harnesses) still serves any session by its id.
    assert httpx.get(f"{other.base_url}/v1/models").status_code == 200
    proxy.server.close_session(other.id)
    assert not other_path.parent.exists()


def test_stopping_the_proxy_removes_every_session_socket(tokenizer):
    background = BackgroundProxy(ScriptedEngine(tokenizer), tokenizer)
    try:
        _, path = own_session(background)
    finally:
        background.close()
    assert not path.parent.exists()


# ------------------------------------------------------------------------------------------ the sandbox's side


@pytest.mark.docker
def test_the_agent_sandbox_has_no_privileges(docker_engine, factory, calc_image):
    with factory.open(calc_image) as sandbox:
        info = docker_engine.client.api.inspect_container(sandbox.container.id)
        host = info["HostConfig"]
        assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
        assert "no-new-privileges:true" in host["SecurityOpt"]
        user = info["Config"]["User"]
        assert user and user.split(":")[0] not in ("0", "root")
        assert host["ReadonlyRootfs"] and host["NetworkMode"] == "none" and not host["Privileged"]
        assert not any("docker.sock" in str(mount.get("Source")) for mount in info["Mounts"])
        # Every exec is the agent's unless told otherwise; nothing in the container has a capability.
        assert sandbox.exec("id -u; id -g").output.split() == [str(AGENT_UID), str(AGENT_UID)]
        status = sandbox.exec("grep -h -e CapEff -e CapBnd -e NoNewPrivs /proc/self/status /proc/1/status").output
        assert status.count("0000000000000000") == 4 and status.count("NoNewPrivs:\t1") == 2
        assert sandbox.exec("stat -c %u /proc/1").output.strip() == str(KEEPER_UID)
        # setuid binaries give nothing back (no-new-privileges), and root-owned places stay closed.
        assert sandbox.exec("su -c id root </dev/null").exit_code != 0
        assert sandbox.exec("touch /root/x || touch /etc/x || touch /opt/lego/repo/x").exit_code != 0
        # The repository and the home are the agent's; git, python and the copy work as that numeric uid.
        assert sandbox.exec("find . ! -user 1000 | head -3").output.strip() == ""
        assert sandbox.exec("stat -c '%u %a' $HOME").output.split() == [str(AGENT_UID), "700"]
        assert sandbox.exec("echo $HOME").output.strip() == AGENT_HOME
        work = sandbox.exec("echo ok > new.txt && git add -A && git commit -qm mine && git log --oneline | wc -l "
                            "&& touch $HOME/.x /tmp/.x && python3 -c 'import os; print(os.getuid())'")
        assert work.exit_code == 0 and work.output.split() == ["2", str(AGENT_UID)], work.output


@pytest.mark.docker
def test_the_agent_cannot_stop_the_container_or_kill_the_relay(factory, calc_image, proxy):
    sandbox, session, _, relay = open_with_relay(factory, calc_image, proxy)
    with sandbox:
        for attack in ("kill -9 1", "kill -TERM 1", "kill -KILL -1", "pkill -9 socat", "pkill -9 sleep",
                       "pkill -9 -u 1001", "kill -9 $(pgrep -d ' ' socat)"):
            sandbox.exec(f"{attack}; true", timeout=10)
            assert sandbox.is_running(), attack
        assert status_in(sandbox, f"{relay}/s/{session.id}/v1/models") == "200"
        # Why: the container's main process and the relay are the keeper's, not the agent's.
        owners = sandbox.exec("ps -eo uid=,args= | grep -e socat -e 'sleep infinity' | grep -v grep").output
        assert owners and all(line.split()[0] == str(KEEPER_UID) for line in owners.splitlines()), owners
        # The agent's own stray processes are still reclaimed, and the keeper's spared.
        sandbox.exec("nohup sleep 1000 >/dev/null 2>&1 &", timeout=10)
        assert sandbox.reclaim_processes()
        left = sandbox.exec("ps -eo args= | grep -c '^sleep 1000' || true").output.strip()
        assert left == "0" and status_in(sandbox, f"{relay}/s/{session.id}/v1/models") == "200"
    proxy.server.close_session(session.id)


@pytest.mark.docker
def test_the_agent_cannot_replace_or_write_to_the_socket_mount(factory, calc_image, proxy):
    sandbox, session, path, relay = open_with_relay(factory, calc_image, proxy)
    sock = f"{PROXY_MOUNT}/{path.name}"
    with sandbox:
        mounts = sandbox.exec(f"grep ' {PROXY_MOUNT} ' /proc/self/mounts").output.split()
        assert "ro" in mounts[3].split(","), mounts
        attacks = [
            f"rm -f {sock}", f"mv {sock} {sock}.old", f"ln -sf /tmp/evil.sock {sock}", f"touch {PROXY_MOUNT}/x",
            f"dd if=/dev/zero of={PROXY_MOUNT}/big bs=1M count=4",
            # a listener of its own in place of the proxy's (the man in the middle of issue 17)
            f"python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); s.bind('{PROXY_MOUNT}/evil.sock')\"",
        ]
        for attack in attacks:
            assert sandbox.exec(attack, timeout=10).exit_code != 0, attack
        if os.geteuid() == 0:  # the socket is the keeper's: the agent cannot even look into its directory
            assert sandbox.exec(f"ls {PROXY_MOUNT}").exit_code != 0
            assert sandbox.exec(f"python3 -c \"import socket; socket.socket(socket.AF_UNIX).connect('{sock}')\""
                                ).exit_code != 0
        assert sorted(os.listdir(path.parent)) == [path.name] and stat.S_ISSOCK(path.stat().st_mode)
        assert status_in(sandbox, f"{relay}/s/{session.id}/v1/models") == "200"
    proxy.server.close_session(session.id)


@pytest.mark.docker
def test_a_sandbox_reaches_no_other_rollouts_session(factory, calc_image, proxy):
    first, first_session, _, first_relay = open_with_relay(factory, calc_image, proxy)
    second, second_session, second_path, _ = open_with_relay(factory, calc_image, proxy)
    with first, second:
        # Both relays sit on the same port of their own loopback; each reaches its own session and no other.
        assert status_in(first, f"{first_relay}/s/{first_session.id}/v1/models") == "200"
        assert status_in(first, f"{first_relay}/s/{second_session.id}/v1/models") == "404"
        chat = '{"messages": [{"role": "user", "content": "hi"}]}'
        assert status_in(first, f"{first_relay}/s/{second_session.id}/v1/chat/completions", chat) == "404"
        assert not second_session.trajectory_parts()[1]  # nothing was served to, or recorded for, the other
        assert status_in(first, f"{first_relay}/s/{first_session.id}/v1/chat/completions", chat) == "200"
        # The other rollout's socket is nowhere in this sandbox.
        assert str(second_path.parent) not in first.exec("cat /proc/self/mountinfo").output
    for session in (first_session, second_session):
        proxy.server.close_session(session.id)


@pytest.mark.docker
def test_the_relay_health_check_fails_cleanly_without_the_session(factory, calc_image, proxy):
    # The session closed (its socket went with it): nothing answers behind the relay.
    gone, gone_path = own_session(proxy)
    with factory.open(calc_image, proxy_socket_dir=gone_path.parent) as sandbox:
        proxy.server.close_session(gone.id)
        started = time.monotonic()
        with pytest.raises(SandboxError, match="does not reach the proxy session"):
            sandbox.start_proxy_relay(gone_path.name, RELAY_PORT, gone.id, wait_s=2)
        assert time.monotonic() - started < 30
    # The proxy answers, but not for that session (404): the relay is not healthy, and it says so at once.
    live, live_path = own_session(proxy)
    with factory.open(calc_image, proxy_socket_dir=live_path.parent) as sandbox:
        with pytest.raises(SandboxError, match="404"):
            sandbox.start_proxy_relay(live_path.name, RELAY_PORT, gone.id)
    proxy.server.close_session(live.id)


@pytest.mark.docker
def test_a_proxy_not_run_as_root_still_binds_each_socket_to_its_session(factory, calc_image, proxy, monkeypatch):
    # Without root the socket cannot be given to the keeper: it is open to everyone (0666 in a 0711 directory),
    # and still serves its own session only, so it offers no more than the loopback listener already does.
    with monkeypatch.context() as patched:
        patched.setattr(os, "geteuid", lambda: 4242)
        mine, path = own_session(proxy)
    other, _ = own_session(proxy)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o711 and stat.S_IMODE(path.stat().st_mode) == 0o666
    with factory.open(calc_image, proxy_socket_dir=path.parent) as sandbox:
        relay = sandbox.start_proxy_relay(path.name, RELAY_PORT, mine.id)
        assert status_in(sandbox, f"{relay}/s/{other.id}/v1/models") == "404"
        assert sandbox.exec(f"rm -f {PROXY_MOUNT}/{path.name}").exit_code != 0
    for session in (mine, other):
        proxy.server.close_session(session.id)
