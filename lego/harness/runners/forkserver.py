"""A forkserver for a Python harness that runs beside the sandbox: its heavy imports are paid once per rollout worker,
not once per rollout. Runs in the harness's own venv Python and imports only the standard library itself.

    python forkserver.py serve SOCKET MODULE...   import MODULEs, print "ready", then serve forever
    python -I -S forkserver.py run SOCKET SCRIPT ARG...   run `python SCRIPT ARG...` through the server

`serve` imports the named third-party modules (mini-swe-agent's LiteLLM costs about 3 s of CPU per import) and, for
each `run`, forks: the child takes the client's stdin, stdout and stderr (passed over the socket), its environment and
working directory, runs SCRIPT as `__main__` in its own session and exits; the server then sends the exit status and
the client exits with it. The harness's own modules are imported in the child, after its environment is set, so
what they read at import time is the rollout's. The preloaded modules must read at import only what every rollout
shares (the host starts the server with that environment).

The client is what the rollout runs and kills: when it dies (a time limit, the turn guard), the server sees its
connection close and kills the child's process group. A child whose server dies is killed by the kernel. A client
that cannot reach the server runs SCRIPT itself (a cold start), so a lost server costs time, never a rollout.
"""

import array
import json
import os
import select
import signal
import socket
import sys

READY = "ready"
EXIT_PREFIX = b"EXIT "
PR_SET_PDEATHSIG = 1
REQUEST_LIMIT = 1 << 20


def _die_with_server() -> None:
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _read_request(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds = b"", []
    while not data.endswith(b"\n"):
        chunk, ancillary, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(3 * array.array("i").itemsize))
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                received = array.array("i")
                received.frombytes(payload[: len(payload) - len(payload) % received.itemsize])
                fds.extend(received)
        if not chunk or len(data) + len(chunk) > REQUEST_LIMIT:
            raise ValueError("incomplete request")
        data += chunk
    return json.loads(data), fds


def _child(request: dict, fds: list[int], server_sockets: list[socket.socket]) -> None:
    """In the forked child: become the harness process the client would have started, and never return."""
    code = 1
    try:
        for held in server_sockets:  # another client's connection held here would keep that client waiting
            held.close()
        os.setsid()
        _die_with_server()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        script = request["argv"][0]
        sys.argv = list(request["argv"])
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        import runpy

        code = 0
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, int | None):
            print(stop.code, file=sys.stderr)
    except BaseException:  # the harness crashed: report it as a plain run would
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def serve(path: str, modules: list[str]) -> None:
    import importlib

    for module in modules:
        importlib.import_module(module)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print(READY, flush=True)
    children: dict[int, socket.socket] = {}  # child pid -> its client's connection
    while True:
        readable, _, _ = select.select([listener, *children.values()], [], [], 0.1)
        for ready in readable:
            if ready is listener:
                conn, _ = listener.accept()
                try:
                    conn.settimeout(10)
                    request, fds = _read_request(conn)
                    conn.settimeout(None)
                except (OSError, ValueError):
                    conn.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _child(request, fds, [listener, conn, *children.values()])
                for fd in fds:
                    os.close(fd)
                children[pid] = conn
                continue
            try:
                gone = ready.recv(1) == b""
            except OSError:
                gone = True
            if gone:  # the client was killed: so is its harness
                pid = next(child for child, conn in children.items() if conn is ready)
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is None:
                continue
            try:
                conn.sendall(EXIT_PREFIX + str(os.waitstatus_to_exitcode(status)).encode() + b"\n")
            except OSError:
                pass
            conn.close()


def run(path: str, argv: list[str]) -> int:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError as exc:
        print(f"lego forkserver: the server at {path} is unreachable ({exc}); starting cold", file=sys.stderr,
              flush=True)
        os.execv(sys.executable, [sys.executable, *argv])
    request = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode() + b"\n"
    conn.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
    reply = b""
    while not reply.endswith(b"\n") and (chunk := conn.recv(64)):
        reply += chunk
    if not reply.startswith(EXIT_PREFIX) or not reply.endswith(b"\n"):
        print("lego forkserver: the server ended before the harness did", file=sys.stderr, flush=True)
        return 1
    code = int(reply[len(EXIT_PREFIX):].strip())
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    mode, socket_path, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    if mode == "serve":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        serve(socket_path, rest)
    else:
        sys.exit(run(socket_path, rest))
