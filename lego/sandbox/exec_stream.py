"""A `docker exec` stream read from its first byte.

docker-py takes the raw socket from under a hijacked exec response and reads the command's output from it. But
http.client read the response's headers through a buffered reader, and whatever the command had written by then
(a short command's whole output, on a loaded machine) sits in that reader's buffer, never in the socket: read from
the socket, it is lost, and the command looks as if it printed nothing. Here the stream is read through the buffered
reader, which hands out what it holds first.

Standalone on purpose (it imports docker-py's objects only, never lego): the harness runners, run by a harness's own
venv Python, load this file by its path.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

_HEADER = struct.Struct(">BxxxL")  # the engine's frame header without a TTY: stream (1 stdout, 2 stderr), length


class ExecStream:
    """One started exec: its output (`chunks`), and for an exec with stdin its socket to write to."""

    def __init__(self, api, exec_id: str, tty: bool = False):
        response = api._post_json(api._url("/exec/{0}/start", exec_id), data={"Tty": tty, "Detach": False},
                                  headers={"Connection": "Upgrade", "Upgrade": "tcp"}, stream=True)
        api._raise_for_status(response)
        self.tty = tty
        self.response = response
        self.reader = response.raw._fp.fp  # the buffered reader the headers were read with
        raw = self.reader.raw
        self.socket = getattr(raw, "_sock", raw)
        self.socket.settimeout(None)  # a long command's silence is no error

    def chunks(self) -> Iterator[tuple[int, bytes]]:
        """(stream, data) until the exec's output ends: 1 stdout, 2 stderr (with a TTY, everything is 1)."""
        while True:
            if self.tty:
                data = self.reader.read1(65536)
                if not data:
                    return
                yield 1, data
                continue
            header = self.reader.read(_HEADER.size)
            if len(header) < _HEADER.size:
                return
            stream, length = _HEADER.unpack(header)
            data = self.reader.read(length) if length else b""
            if data:
                yield stream, data
            if len(data) < length:
                return

    def output(self) -> Iterator[bytes]:
        """stdout and stderr as they come, interleaved."""
        return (data for _, data in self.chunks())

    def pending(self) -> bytes:
        """What the buffered reader already holds, without waiting: a caller that then reads `socket` itself (after
        the headers, nothing more goes through the reader) loses nothing."""
        self.socket.setblocking(False)
        try:
            return self.reader.read1(65536) or b""
        except (BlockingIOError, InterruptedError):
            return b""
        finally:
            self.socket.setblocking(True)

    def sendall(self, data: bytes) -> None:
        self.socket.sendall(data)

    def close(self) -> None:
        """End the stream; a thread blocked reading it wakes up to its end."""
        try:
            self.socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.response.close()
        try:
            self.socket.close()
        except OSError:
            pass


def run_exec(api, exec_id: str) -> bytes:
    """Start the exec and return all its output (stdout and stderr), as `api.exec_start(exec_id)` would."""
    stream = ExecStream(api, exec_id)
    try:
        return b"".join(stream.output())
    finally:
        stream.close()
