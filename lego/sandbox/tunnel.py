"""The proxy tunnel: a sandbox reaches its own proxy session over the engine's exec stream, not a shared file system.

Why this channel: a bind-mounted session socket only works when the Docker engine runs on the rollout worker's
machine (the daemon mounts paths from its own file system). Every backend can exec a process with its stdio
attached, and that stream already crosses whatever separates the worker from the engine (a unix socket, TCP, SSH).
So the sandbox keeps network mode none and no route to anything is opened: a relay inside the container (run as
the keeper, out of the agent's reach) listens on the container's own loopback and carries each connection, as
framed bytes, over the attached stdin/stdout of its `docker exec`; on the worker, this module connects every
connection to one path only, the session's own unix socket, on which the proxy serves that session and no other.
Nothing the container sends names a destination, so the sandbox can reach exactly its own session; the session
id in the URL stays the only key to the session's data.

Frames, both directions: `>IBI` header (connection id, kind, payload length) then the payload.
OPEN (container -> worker): a client connected; DATA: bytes; EOF: that side will send no more (half close);
CLOSE: the connection is gone.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
from pathlib import Path

from docker.errors import APIError, DockerException

from lego.sandbox import SandboxError
from lego.sandbox.exec_stream import ExecStream

log = logging.getLogger(__name__)

HEADER = struct.Struct(">IBI")
OPEN, DATA, EOF, CLOSE = 0, 1, 2, 3
MAX_FRAME = 1 << 20  # a relay never sends more per frame (it reads 64 KiB at a time); bigger is a broken stream
MAX_CONNECTIONS = 256  # open at once per sandbox; the relay refuses more (an agent cannot exhaust the worker)
CHUNK = 64 << 10

# The in-container end: Python's standard library only (every sandbox image has python3), threads and blocking
# sockets. It listens on the container's loopback; stdin carries frames from the worker, stdout frames to it.
RELAY_SCRIPT = r'''
import os, socket, struct, sys, threading
H = struct.Struct(">IBI")
OPEN, DATA, EOF, CLOSE = 0, 1, 2, 3
port, most = int(sys.argv[1]), int(sys.argv[2])
out = sys.stdout.buffer
inp = sys.stdin.buffer
lock = threading.Lock()
conns = {}
def send(cid, kind, data=b""):
    with lock:
        out.write(H.pack(cid, kind, len(data)) + data)
        out.flush()
ends = {}
def ended(cid):
    # both directions done (EOF each way): the connection is over
    with lock:
        ends[cid] = ends.get(cid, 0) + 1
        if ends[cid] < 2:
            return
        ends.pop(cid, None)
        conn = conns.pop(cid, None)
    if conn is not None:
        conn.close()
def drop(cid):
    with lock:
        ends.pop(cid, None)
        conn = conns.pop(cid, None)
    if conn is not None:
        conn.close()
def pump(cid, conn):
    try:
        while True:
            data = conn.recv(65536)
            if not data:
                send(cid, EOF)
                ended(cid)
                return
            send(cid, DATA, data)
    except OSError:
        send(cid, CLOSE)
        drop(cid)
def accept(server):
    cid = 0
    while True:
        conn, _ = server.accept()
        with lock:
            full = len(conns) >= most
        if full:
            conn.close()
            continue
        cid = (cid + 1) % (1 << 32)
        with lock:
            conns[cid] = conn
        send(cid, OPEN)
        threading.Thread(target=pump, args=(cid, conn), daemon=True).start()
def read(n):
    buf = b""
    while len(buf) < n:
        part = inp.read(n - len(buf))
        if not part:
            raise EOFError
        buf += part
    return buf
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", port))
server.listen(128)
print("lego relay listening on 127.0.0.1:%d" % port, file=sys.stderr, flush=True)
threading.Thread(target=accept, args=(server,), daemon=True).start()
try:
    while True:
        cid, kind, size = H.unpack(read(H.size))
        data = read(size) if size else b""
        with lock:
            conn = conns.get(cid)
        if conn is None:
            continue
        try:
            if kind == DATA:
                conn.sendall(data)
            elif kind == EOF:
                conn.shutdown(socket.SHUT_WR)
                ended(cid)
            elif kind == CLOSE:
                drop(cid)
        except OSError:
            drop(cid)
            send(cid, CLOSE)
except EOFError:
    pass
os._exit(0)
'''


class TunnelError(SandboxError):
    """The exec stream carrying a sandbox's proxy tunnel broke or could not be opened: infra, never the agent's."""


class ProxyTunnel:
    """The worker's end of one sandbox's tunnel: every connection the relay opens goes to `target` (the session's own
    unix socket) and nowhere else. Runs on threads of its own; `close()` ends it (closing the sandbox does too)."""

    def __init__(self, api, container_id: str, target: Path, port: int, *, user: str, environment: dict[str, str],
                 name: str = "") -> None:
        self.target = Path(target)
        self.name = name or container_id[:12]
        self.closed = False
        self._conns: dict[int, socket.socket] = {}
        self._ends: dict[int, int] = {}
        self._send_lock = threading.Lock()
        self._state_lock = threading.Lock()
        try:
            exec_id = api.exec_create(container_id, ["python3", "-u", "-c", RELAY_SCRIPT, str(port),
                                                     str(MAX_CONNECTIONS)],
                                      stdin=True, stdout=True, stderr=False, tty=False, user=user,
                                      environment=environment, workdir="/")["Id"]
            self._stream = ExecStream(api, exec_id)
        except (APIError, DockerException) as exc:
            raise TunnelError(f"starting the proxy tunnel in {self.name} failed: {exc}; check that the sandbox "
                              "image has python3 and the engine allows exec") from exc
        self.exec_id = exec_id
        self._api = api
        self._reader = threading.Thread(target=self._read_frames, name=f"lego-tunnel-{self.name}", daemon=True)
        self._reader.start()

    # ---------------------------------------------------------------------------------------------- to the relay

    def _send(self, cid: int, kind: int, data: bytes = b"") -> None:
        frame = HEADER.pack(cid, kind, len(data)) + data
        with self._send_lock:
            if self.closed:
                return
            try:
                self._stream.sendall(frame)
            except OSError as exc:
                log.debug("proxy tunnel %s: the exec stream is gone: %r", self.name, exc)
                self._shutdown()

    # ---------------------------------------------------------------------------------------------- from the relay

    def _read_frames(self) -> None:
        buffer = bytearray()
        try:
            for stream, chunk in self._stream.chunks():
                if stream != 1 or not chunk:  # stdout only: the relay's stderr is not attached
                    continue
                buffer += chunk
                while len(buffer) >= HEADER.size:
                    cid, kind, size = HEADER.unpack_from(buffer)
                    if size > MAX_FRAME or kind not in (OPEN, DATA, EOF, CLOSE):
                        log.warning("proxy tunnel %s: a malformed frame (kind %d, %d bytes); closing it",
                                    self.name, kind, size)
                        return
                    if len(buffer) < HEADER.size + size:
                        break
                    payload = bytes(buffer[HEADER.size:HEADER.size + size])
                    del buffer[:HEADER.size + size]
                    self._handle(cid, kind, payload)
        except (OSError, ValueError) as exc:
            if not self.closed:
                log.debug("proxy tunnel %s ended: %r", self.name, exc)
        finally:
            self._shutdown()

    def _handle(self, cid: int, kind: int, payload: bytes) -> None:
        if kind == OPEN:
            if cid in self._conns or len(self._conns) >= MAX_CONNECTIONS:
                self._send(cid, CLOSE)
                return
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(str(self.target))  # the session's own socket: its session and no other
            except OSError:
                conn.close()
                self._send(cid, CLOSE)  # the session closed: the client sees its connection end
                return
            self._conns[cid] = conn
            threading.Thread(target=self._pump, args=(cid, conn), daemon=True).start()
            return
        conn = self._conns.get(cid)
        if conn is None:
            return
        try:
            if kind == DATA:
                conn.sendall(payload)
            elif kind == EOF:
                conn.shutdown(socket.SHUT_WR)
                self._ended(cid)
            else:
                self._drop(cid)
        except OSError:
            self._drop(cid)
            self._send(cid, CLOSE)

    def _pump(self, cid: int, conn: socket.socket) -> None:
        """The proxy's answers on one connection, back to the relay."""
        try:
            while True:
                data = conn.recv(CHUNK)
                if not data:
                    self._send(cid, EOF)
                    self._ended(cid)
                    return
                self._send(cid, DATA, data)
        except OSError:
            if self._conns.get(cid) is conn:
                self._drop(cid)
                self._send(cid, CLOSE)

    def _ended(self, cid: int) -> None:
        """One direction is done; after both, the connection is over."""
        with self._state_lock:
            self._ends[cid] = self._ends.get(cid, 0) + 1
            if self._ends[cid] < 2:
                return
        self._drop(cid)

    def _drop(self, cid: int) -> None:
        with self._state_lock:
            self._ends.pop(cid, None)
        conn = self._conns.pop(cid, None)
        if conn is not None:
            conn.close()

    # ---------------------------------------------------------------------------------------------- lifecycle

    def is_alive(self) -> bool:
        return not self.closed and self._reader.is_alive()

    def _shutdown(self) -> None:
        self.closed = True
        for cid in list(self._conns):
            self._drop(cid)
        try:
            self._stream.close()
        except OSError:
            pass

    def close(self) -> None:
        with self._send_lock:
            self._shutdown()
