"""The Docker sandbox backend and task images, against the real engine."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from repo_fixtures import CALC_BUGGY

pytestmark = pytest.mark.docker


def test_task_image_is_cached_by_content(docker_engine, base_image, calc_task, calc_image):
    from lego.sandbox.task_image import ensure_task_image

    assert ensure_task_image(docker_engine.client, calc_task, base_image) == calc_image


def test_a_task_with_a_relative_bundle_path_is_refused_not_graded(docker_engine, base_image, calc_task, verifier):
    """Only a task-set loader knows what a relative bundle path is relative to: building the image, or grading,
    a task that did not come through one stops with why (never an infra_error retried, never a guess)."""
    from lego.sandbox.task_image import UnresolvedTaskPath, ensure_task_image

    relative = calc_task.model_copy(update={"environment": calc_task.environment.model_copy(
        update={"bundle": "calc.bundle"})})
    with pytest.raises(UnresolvedTaskPath, match="relative path 'calc.bundle'"):
        ensure_task_image(docker_engine.client, relative, base_image)
    with pytest.raises(UnresolvedTaskPath):
        verifier.verify(relative, diff=relative.patch, actions=[])


def test_repo_is_a_single_commit_with_no_later_history(factory, calc_image, calc_task):
    with factory.open(calc_image) as sandbox:
        assert sandbox.exec("cat calc.py").output == CALC_BUGGY
        log = sandbox.exec("git log --all --oneline | wc -l; git for-each-ref | wc -l; git reflog | wc -l; "
                           "git stash list | wc -l").output.split()
        assert log == ["1", "1", "0", "0"]
        # No object of any later commit: neither the fix nor its message is findable.
        hunt = sandbox.exec("git fsck --lost-found --unreachable 2>&1; git cat-file --batch-all-objects "
                            "--batch | grep -a -c -e SECRET-FIX -e 'a + b$' || true").output
        assert hunt.strip().endswith("0")
        # The hidden test (from test_patch) is not there.
        assert "test_add" not in sandbox.exec("cat tests/test_calc.py").output
        assert calc_task.base_commit in sandbox.exec("cat /opt/lego/base_commit").output


def test_exec_timeout_output_cap_and_exit_codes(factory, calc_image, lego_config):
    with factory.open(calc_image) as sandbox:
        assert sandbox.exec("exit 3").exit_code == 3
        slow = sandbox.exec("sleep 30", timeout=1)
        assert slow.timed_out and slow.exit_code != 0
        # Children die with the command: nothing keeps sleeping.
        assert "sleep 30" not in sandbox.exec("ps -eo args").output
        noisy = sandbox.exec("yes lego | head -c 50000000")
        assert noisy.truncated and len(noisy.output) <= lego_config.sandbox.output_limit_bytes


def test_an_exec_whose_output_the_engine_cut_short_is_an_error_not_an_empty_output(factory, calc_image, monkeypatch):
    from lego.sandbox import ExecOutputLost, docker_sandbox
    from lego.sandbox.exec_stream import ExecStream

    with factory.open(calc_image) as sandbox:
        # Exact output, whatever it ends with, a background writer's late output included.
        assert sandbox.exec("printf 'no newline'").output == "no newline"
        assert sandbox.exec("printf 'a\\0b'; exit 4").output == "a\0b"
        late = sandbox.exec("(sleep 0.5; echo late) & echo now")
        assert late.output == "now\nlate\n" and late.exit_code == 0
        # An engine's stream cut short (its first byte kept): the real command runs, the rest of what it printed
        # is dropped on the way.

        class CutShort(ExecStream):
            def output(self):
                everything = b"".join(super().output())
                return iter([everything[:1]])

        monkeypatch.setattr(docker_sandbox, "ExecStream", CutShort)
        with pytest.raises(ExecOutputLost, match="cut short"):
            sandbox.exec("git branch -a")
        monkeypatch.undo()
        assert len(sandbox.exec("git branch -a").output.strip().splitlines()) == 1


def test_output_that_arrives_with_the_engines_reply_is_kept(factory, calc_image, monkeypatch):
    """The engine's reply to an exec start and the command's first output, read together (a loaded machine): read
    from the raw socket as docker-py does, the output is gone; read through the buffered reader, it is all there."""
    import http.client
    import time

    from lego.sandbox.exec_stream import ExecStream, run_exec

    with factory.open(calc_image) as sandbox:
        api = sandbox.client.api
        begin = http.client.HTTPResponse.begin
        held = []  # the exec whose start reply is read only once its command has exited

        def late_begin(response):
            if held:
                exec_id = held.pop()  # popped first: the inspect calls below read their replies unheld
                deadline = time.monotonic() + 60
                while api.exec_inspect(exec_id)["ExitCode"] is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                time.sleep(0.2)  # the engine writes the output before it records the exit; let it reach the socket
            return begin(response)

        def create(command, **options):
            exec_id = api.exec_create(sandbox.container.id, command, **options)["Id"]
            held.append(exec_id)
            return exec_id

        monkeypatch.setattr(http.client.HTTPResponse, "begin", late_begin)
        quick = create(["sh", "-c", "echo out; echo err >&2"])
        assert b"".join(api.exec_start(quick, stream=True)) == b""  # docker-py's own reading loses it
        again = create(["sh", "-c", "echo out; echo err >&2"])
        assert sorted(run_exec(api, again).split()) == [b"err", b"out"]
        assert sandbox.exec("git branch -a").output.strip().startswith("*")
        shell = ExecStream(api, create(["sh", "-c", "echo ready"], tty=True), tty=True)
        try:
            assert shell.pending() == b"ready\r\n"
        finally:
            shell.close()


def test_put_get_and_diff_against_the_pristine_snapshot(factory, calc_image):
    with factory.open(calc_image) as sandbox:
        payload = bytes(range(256)) * 1000
        sandbox.put_file("/repo/data/blob.bin", payload)
        assert sandbox.get_file("/repo/data/blob.bin") == payload
        sandbox.exec("sed -i 's/a - b/a + b/' calc.py && rm -rf .git")  # even a deleted .git does not hide changes
        diff = sandbox.diff()
        assert "-    return a - b" in diff and "+    return a + b" in diff
        assert "data/blob.bin" in diff and "GIT binary patch" in diff


def test_no_network_read_only_root_and_capped_disk(factory, calc_image, lego_config):
    with factory.open(calc_image) as sandbox:
        assert sandbox.exec("ls /sys/class/net").output.split() == ["lo"]
        assert sandbox.exec("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), 3)\"").exit_code != 0
        assert sandbox.exec("touch /usr/lib/python3/dist-packages/sitecustomize.py").exit_code != 0
        fill = sandbox.exec(f"dd if=/dev/zero of=/repo/big bs=1M count={lego_config.sandbox.disk_limit_mb + 200}")
        assert fill.exit_code != 0 and "No space left" in fill.output


def test_fork_bomb_is_contained(factory, calc_image, lego_config):
    with factory.open(calc_image) as sandbox:
        result = sandbox.exec(":(){ :|:& };:", timeout=5)
        assert "Resource temporarily unavailable" in result.output or result.timed_out
        stats = sandbox.container.stats(stream=False)
        assert stats["pids_stats"].get("current", 0) <= lego_config.sandbox.pids_limit
    with factory.open(calc_image) as sandbox:
        assert sandbox.exec("echo alive").output.strip() == "alive"


def test_sandboxes_are_removed_on_close_exception_and_reaped_when_stale(docker_engine, factory, calc_image):
    from lego.sandbox.docker_sandbox import LABEL, reap_stale_containers

    with pytest.raises(RuntimeError):
        with factory.open(calc_image) as sandbox:
            name = sandbox.name
            raise RuntimeError("boom")
    assert not docker_engine.client.containers.list(all=True, filters={"name": name})
    # A container whose owner process is gone (as after SIGKILL) is reaped at the next start.
    orphan = docker_engine.client.containers.run(calc_image, ["sleep", "infinity"], detach=True, network_mode="none",
                                                 labels={LABEL: "1", "lego.owner_pid": "999999999"})
    # Two reapers at once (as two processes starting together): each returns once the orphan is gone, neither
    # fails on the engine's "removal already in progress".
    with ThreadPoolExecutor(2) as pool:
        reaps = list(pool.map(lambda _: reap_stale_containers(docker_engine.client), range(2)))
    assert all(orphan.name in reaped for reaped in reaps)
    assert not docker_engine.client.containers.list(all=True, filters={"name": orphan.name})


def test_proxy_channel_through_unix_socket_and_loopback_relay(factory, calc_image, tmp_path):
    import os
    import socket
    import threading

    socket_dir = tmp_path / "proxy"
    socket_dir.mkdir()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(socket_dir / "proxy.sock"))
    os.chmod(socket_dir / "proxy.sock", 0o666)  # the relay runs as the sandbox's keeper uid, not as this user
    server.listen(4)
    requests: list[bytes] = []

    def answer():  # the relay's readiness probe is a request too: serve every connection
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            request = connection.recv(4096)
            if request:
                requests.append(request)
                connection.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello")
            connection.close()

    threading.Thread(target=answer, daemon=True).start()
    with factory.open(calc_image, proxy_socket_dir=socket_dir) as sandbox:
        url = sandbox.start_proxy_relay("proxy.sock", 8765, "session-1")
        result = sandbox.exec(f"python3 -c \"import urllib.request; print(urllib.request.urlopen('{url}/x').read())\"",
                              timeout=30)
        assert "hello" in result.output
    server.close()
    # The health check asked the proxy for the session, through the relay.
    assert requests[0].startswith(b"GET /s/session-1/v1/models HTTP/1.0\r\n")


# Left behind by a last command: one child that polls for the command's exit, one detached into its own session
# (double fork, setsid) that polls for pid 1, and one that ignores every catchable signal. Each writes LATE to the
# shared volume the moment it sees the command gone. A kill sent after the command's exit loses to them.
LEAVES_WATCHERS = """echo "pid $$"
( while [ -d /proc/$$ ]; do :; done; echo LATE-child >> /shared/late ) &
( setsid bash -c 'while [ -d /proc/1 ]; do :; done; echo LATE-session >> /shared/late' & ) &
( trap '' TERM INT HUP QUIT; while [ -d /proc/$$ ]; do :; done; echo LATE-deaf >> /shared/late ) &
sleep 0.3
echo done > /shared/result
exit 7
"""


def test_a_last_command_ends_its_sandbox_and_nothing_it_left_acts_after_it(factory, calc_image):
    from lego.sandbox import SandboxError
    from lego.sandbox.docker_sandbox import KEEPER_USER, LastCommand, LastCommandError

    volume = factory.scratch_volume("test-last-command", 16)
    try:
        with factory.open(calc_image, purpose="holder", volumes={volume: "/shared"}, repository=False) as holder:
            assert holder.exec("ls /repo | wc -l").output.strip() == "0"  # no repository copied in
            holder.exec("chmod 1777 /shared", user=KEEPER_USER)
            last = LastCommand(argv=("bash", "-c", LEAVES_WATCHERS), workdir="/repo", env={"LEGO_PROBE": "x"})
            for round_ in range(3):
                holder.exec("rm -f /shared/late /shared/result", workdir="/")
                with factory.open(calc_image, volumes={volume: "/shared"}, last_command=last) as sandbox:
                    assert sandbox.exec("cat calc.py").exit_code == 0  # before the go: an ordinary sandbox
                    result = sandbox.run_last_command(timeout=60)
                    assert (result.exit_code, result.timed_out) == (7, False), result
                    assert "pid 1" in result.output  # the command itself was the namespace's init
                    assert not sandbox.is_running()
                    with pytest.raises(SandboxError, match="last command"):
                        sandbox.exec("true")
                    with pytest.raises(LastCommandError, match="already"):
                        sandbox.run_last_command(timeout=5)
                assert holder.exec("cat /shared/result", workdir="/").output.strip() == "done"
                late = holder.exec("cat /shared/late 2>/dev/null", workdir="/").output
                assert "LATE" not in late, (round_, late)
    finally:
        factory.remove_volume(volume)


def test_a_last_command_past_its_time_is_killed_with_everything_in_its_sandbox(factory, calc_image):
    from lego.sandbox.docker_sandbox import KEEPER_USER, LastCommand

    volume = factory.scratch_volume("test-last-command", 16)
    try:
        with factory.open(calc_image, purpose="holder", volumes={volume: "/shared"}, repository=False) as holder:
            holder.exec("chmod 1777 /shared", user=KEEPER_USER)
            script = ("( trap '' TERM; sleep 3; echo LATE > /shared/late ) & echo started; pwd; "
                      "echo $LEGO_PROBE; sleep 120")
            last = LastCommand(argv=("bash", "-c", script), workdir="/repo", env={"LEGO_PROBE": "probe-env"})
            with factory.open(calc_image, volumes={volume: "/shared"}, last_command=last) as sandbox:
                result = sandbox.run_last_command(timeout=2)
                assert result.timed_out and result.exit_code != 0, result
                assert result.output.split() == ["started", "/repo", "probe-env"]
            holder.exec("sleep 4", workdir="/")
            assert "LATE" not in holder.exec("cat /shared/late 2>/dev/null", workdir="/").output
    finally:
        factory.remove_volume(volume)


def test_scratch_volumes_of_a_dead_owner_are_reaped(docker_engine, factory):
    from lego.sandbox.docker_sandbox import LABEL, reap_stale_containers

    mine = factory.scratch_volume("test-reap", 1)
    orphan = docker_engine.client.volumes.create(labels={LABEL: "1", "lego.owner_pid": "999999999"}).name
    try:
        reap_stale_containers(docker_engine.client)
        names = {volume.name for volume in docker_engine.client.volumes.list(filters={"label": LABEL})}
        assert orphan not in names and mine in names
    finally:
        factory.remove_volume(mine)
        factory.remove_volume(orphan)


def test_a_last_command_whose_sandbox_died_first_is_an_error_not_a_wait(factory, calc_image):
    from lego.sandbox.docker_sandbox import LastCommand, LastCommandError

    last = LastCommand(argv=("true",), workdir="/repo")
    with factory.open(calc_image, last_command=last) as sandbox:
        sandbox.container.kill()
        with pytest.raises(LastCommandError, match="gate .* never came up"):
            sandbox.run_last_command(timeout=30)
