"""The in-process proxy: one aiohttp server per rollout worker, on loopback and on a unix socket.

Each rollout attempt opens a `Session`; its id (secrets.token_urlsafe) is part of every URL, so a session's data is
reachable only through its own id:
    OpenAI base URL     http://127.0.0.1:PORT/s/<id>/v1    (chat/completions, responses, models)
    Anthropic base URL  http://127.0.0.1:PORT/s/<id>        (v1/messages, v1/messages?beta=true)
The optional shared unix socket serves the same paths. A session can also get a unix socket of its own
(`open_session(own_socket=True)`), in a fresh directory of its own, for a sandbox to mount read-only and relay to:
requests arriving on it reach that session only (any other id is unknown there), and the socket and its directory
are removed when the session closes. Unknown or closed sessions get 404 in the protocol's error shape; bad requests
get the protocol's 400; nothing a client sends crashes the server. Streamed answers are sent as the engine samples
(lego/proxy/streaming.py).
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import logging
import os
import secrets
import shutil
import socket
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from lego.config import SamplingConfig
from lego.engine.base import Engine
from lego.errors import tail
from lego.proxy import anthropic, openai_chat, responses
from lego.proxy.jsonio import to_json
from lego.proxy.messages import RequestError
from lego.proxy.render import ChatRenderer
from lego.proxy.resend import load_json
from lego.proxy.session import Session
from lego.proxy.streaming import WRITERS, ReplyStreamer

log = logging.getLogger(__name__)

SESSION_SOCKET = "proxy.sock"  # the socket's name in its session's own directory


@dataclass
class _SessionSocket:
    """A session's own listening socket; `server` is set once the proxy's loop serves it."""

    directory: Path
    path: Path
    sock: socket.socket
    server: asyncio.AbstractServer | None = None
    starting: asyncio.Task | None = None  # serving it, when opened on the loop's own thread
    closed: bool = False


_heap_frozen = False


def _freeze_heap() -> None:
    """Once per process: what the process built before its proxy starts (imported modules: the tokenizer's and an
    engine's libraries, hundreds of thousands of objects) is moved out of the garbage collector's reach. Otherwise
    every full collection, triggered by what calls leave behind every thousand calls or so, walks all of it: a
    quarter of a second of the event loop's time each, tenths of a millisecond per call. Garbage is collected first,
    so nothing unreachable is kept. At exit they are handed back to it: extension modules that count their objects
    still alive at shutdown (nanobind's, in triton, which torch imports where it is installed) would otherwise
    print every frozen one as a leak."""
    global _heap_frozen
    if not _heap_frozen:
        _heap_frozen = True
        gc.collect()
        gc.freeze()
        atexit.register(gc.unfreeze)


POST_ROUTES = {
    "/v1/chat/completions": openai_chat,
    "/v1/messages": anthropic,
    "/v1/responses": responses,
}


class ProxyServer:
    def __init__(self, engine: Engine, tokenizer, sampling: SamplingConfig | None = None, *,
                 host: str = "127.0.0.1", port: int = 0, unix_path: str | Path | None = None,
                 unix_socket: bool = True, model_name: str = "lego-policy",
                 socket_root: str | Path | None = None) -> None:
        self.engine = engine
        self.renderer = ChatRenderer(tokenizer)
        self.sampling = sampling or SamplingConfig()
        self.host = host
        self.requested_port = port
        self.port: int | None = None
        self.model_name = model_name
        self._unix_wanted = unix_socket or unix_path is not None
        self.unix_path: Path | None = Path(unix_path) if unix_path else None
        self._scratch: tempfile.TemporaryDirectory | None = None
        self._sessions: dict[str, Session] = {}
        self._runner: web.AppRunner | None = None
        self.socket_root = Path(socket_root) if socket_root else None  # where session socket dirs go (None: TMPDIR)
        self._session_sockets: dict[str, _SessionSocket] = {}  # session id -> its own socket
        self._socket_owner: dict[str, str] = {}  # socket path -> the one session id served on it
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._warned_socket_owner = False

    # ------------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> ProxyServer:
        self._loop, self._loop_thread = asyncio.get_running_loop(), threading.get_ident()
        _freeze_heap()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        # In-flight calls of a stopping worker are abandoned quickly (their sessions are over), not awaited 60 s.
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
        await self._runner.setup()
        tcp = web.TCPSite(self._runner, self.host, self.requested_port)
        await tcp.start()
        self.port = tcp._server.sockets[0].getsockname()[1]  # port 0: the one the OS picked
        if self._unix_wanted:
            if self.unix_path is None:
                self._scratch = tempfile.TemporaryDirectory(prefix="lego-proxy-")
                self.unix_path = Path(self._scratch.name) / "proxy.sock"
            await web.UnixSite(self._runner, str(self.unix_path)).start()
        return self

    async def stop(self) -> None:
        for entry in list(self._session_sockets.values()):
            self._close_socket(entry)
        self._session_sockets.clear()
        self._socket_owner.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None
        self.renderer.close()

    async def __aenter__(self) -> ProxyServer:
        return await self.start()

    async def __aexit__(self, *_exc) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the proxy is not started; await ProxyServer.start() first")
        return f"http://{self.host}:{self.port}"

    # ------------------------------------------------------------------------------------------ sessions

    def open_session(self, label: str = "", *, own_socket: bool = False, socket_uid: int | None = None,
                     seed: int | None = None) -> Session:
        """A new session. With `own_socket`, it also gets a unix socket of its own (`session_socket(id)`) on which
        only it is served. `socket_uid`: the one uid (besides root) that may connect to it, e.g. a sandbox's relay
        user; this needs the proxy to run as root (or as that uid). Otherwise the socket is open to every local
        user: no more than the loopback TCP listener already is, since the session id is still required.
        `seed`: the session's sampling seed (Session)."""
        session_id = secrets.token_urlsafe(24)
        session = Session(session_id, self.renderer, self.engine, self.sampling,
                          base_url=f"{self.url}/s/{session_id}", label=label, seed=seed)
        if own_socket:
            self._open_socket(session_id, socket_uid)
        self._sessions[session_id] = session
        return session

    def close_session(self, session_id: str) -> Session | None:
        """Stop serving a session (and remove its own socket); its records stay readable on the returned object.
        Safe from any thread."""
        session = self._sessions.pop(session_id, None)
        if session is not None:
            session.closed = True
            session.resent.clear()  # a closed session parses no more requests: its raw bytes can go
            session.cancel_inflight()
        entry = self._session_sockets.pop(session_id, None)
        if entry is not None:
            self._socket_owner.pop(str(entry.path), None)
            self._close_socket(entry)
        return session

    def session(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    def session_socket(self, session_id: str) -> Path | None:
        """The path of a session's own unix socket (None when it has none or is closed). Mount its directory."""
        entry = self._session_sockets.get(session_id)
        return entry.path if entry is not None else None

    def _open_socket(self, session_id: str, uid: int | None) -> None:
        if self._runner is None or self._loop is None:
            raise RuntimeError("the proxy is not started; await ProxyServer.start() before opening a session socket")
        if self.socket_root is not None:
            self.socket_root.mkdir(parents=True, exist_ok=True)
        # A fresh directory per session: what a sandbox mounts holds this socket and nothing else.
        directory = Path(tempfile.mkdtemp(prefix="lego-session-", dir=self.socket_root))
        path = directory / SESSION_SOCKET
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(path))
            if uid is not None and (os.geteuid() == 0 or os.geteuid() == uid):
                for item in (directory, path):
                    os.chown(item, uid, uid)
                os.chmod(directory, 0o700)
                os.chmod(path, 0o600)
            else:
                if uid is not None and not self._warned_socket_owner:
                    self._warned_socket_owner = True
                    log.warning("the proxy does not run as root: session sockets cannot be given to uid %d and are "
                                "open to every local user (the session id is still required)", uid)
                os.chmod(directory, 0o711)
                os.chmod(path, 0o666)
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            shutil.rmtree(directory, ignore_errors=True)
            raise
        entry = _SessionSocket(directory, path, sock)
        self._session_sockets[session_id] = entry
        self._socket_owner[str(path)] = session_id
        # The socket already listens (clients queue in its backlog); the loop starts serving it right after.
        serve = self._loop.create_unix_server(self._runner.server, sock=sock)
        if threading.get_ident() == self._loop_thread:
            entry.starting = self._loop.create_task(serve)
            entry.starting.add_done_callback(lambda done: self._served(entry, done))
        else:
            future = asyncio.run_coroutine_threadsafe(serve, self._loop)
            try:
                entry.server = future.result(30)
            except BaseException:
                self.close_session(session_id)
                raise
            if entry.closed:
                self._close_socket(entry)

    def _served(self, entry: _SessionSocket, task: asyncio.Task) -> None:
        if task.cancelled():
            return
        if task.exception() is not None:
            if entry.closed:  # closed before it was served: the socket is gone on purpose
                return
            log.error("serving a session socket at %s failed: %r", entry.path, task.exception())
            return
        entry.server = task.result()
        if entry.closed:  # the session closed before the loop got to serve it
            self._close_socket(entry)

    def _close_socket(self, entry: _SessionSocket) -> None:
        """Remove the socket at once (no new connection can reach it by path); stop listening on the loop."""
        entry.closed = True
        shutil.rmtree(entry.directory, ignore_errors=True)

        def stop() -> None:
            if entry.server is not None:
                entry.server.close()
            else:  # not served yet: nothing else owns the socket
                if entry.starting is not None:
                    entry.starting.cancel()
                entry.sock.close()

        if threading.get_ident() == self._loop_thread or self._loop is None or self._loop.is_closed():
            stop()
        else:
            self._loop.call_soon_threadsafe(stop)

    # ------------------------------------------------------------------------------------------ HTTP

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path == "/":
            return web.Response(status=200, text="" if request.method == "HEAD" else "lego proxy")
        parts = path.split("/", 3)  # ["", "s", id, rest]
        rest = "/" + parts[3] if len(parts) > 3 else ""
        rest = rest.rstrip("/") if rest not in ("", "/") else ""
        shape = anthropic if rest.startswith("/v1/messages") else openai_chat
        if len(parts) < 3 or parts[1] != "s":
            return self._error(shape, RequestError(f"no route {path}; use /s/<session id>/v1/...", status=404,
                                                   kind="not_found_error"))
        session = self._sessions.get(parts[2]) if self._reachable(request, parts[2]) else None
        if session is None:
            return self._error(shape, RequestError("unknown or closed session", status=404, kind="not_found_error",
                                                   code="session_not_found"))
        try:
            if rest == "" and request.method in ("HEAD", "GET"):
                return web.Response(status=200)
            if rest == "/v1/models" and request.method == "GET":
                return web.json_response({"object": "list", "data": [
                    {"id": self.model_name, "object": "model", "created": int(session.created_at),
                     "owned_by": "lego", "max_model_len": self.engine.max_context}]})
            if rest == "/v1/messages/count_tokens" and request.method == "POST":
                return await self._count_tokens(request)
            module = POST_ROUTES.get(rest)
            if module is None:
                raise RequestError(f"no route {request.method} {rest or '/'} on a session", status=404,
                                   kind="not_found_error")
            if request.method != "POST":
                raise RequestError(f"{rest} takes POST", status=405, kind="invalid_request_error")
            return await self._complete(request, session, module)
        except RequestError as exc:
            if rest in POST_ROUTES and exc.code != "context_length_exceeded":
                # A completion the proxy refused (or the engine failed): a harness crash after it is not the policy's.
                session.internal_errors.append(tail(f"{exc.status} {exc.kind}: {exc.message}"))
            return self._error(shape, exc)
        except Exception as exc:  # a bug must not take the rollout's server down
            log.exception("proxy request failed")
            session.internal_errors.append(tail(f"{type(exc).__name__}: {exc}"))  # the rollout blames infra
            return self._error(shape, RequestError(f"internal proxy error: {type(exc).__name__}: {exc}",
                                                   status=500, kind="api_error"))

    def _reachable(self, request: web.Request, session_id: str) -> bool:
        """Whether `session_id` may be served on the listener the request came in on. A session's own socket
        serves that session only; so does a connection still open on one whose session closed: none."""
        transport = request.transport
        where = transport.get_extra_info("sockname") if transport is not None else None
        if isinstance(where, tuple):  # the loopback TCP listener (harnesses beside the sandbox)
            return True
        if isinstance(where, str) and where:
            owner = self._socket_owner.get(where)
            if owner is not None:
                return owner == session_id
            return self.unix_path is not None and where == str(self.unix_path)
        return False

    async def _complete(self, request: web.Request, session: Session, module) -> web.StreamResponse:
        # Only what a resent history adds is parsed (lego/proxy/resend.py); anything else is parsed whole.
        conversation, options = session.resent.parse(module, await request.read())
        call = {"protocol": module.PROTOCOL, "stream": options["stream"], "max_tokens": options["max_tokens"],
                "parse_tools": options["parse_tools"], "stop": options.get("stop", ()),
                "tool_choice": options.get("tool_choice"), "strict_tools": options.get("strict_tools", frozenset()),
                "json_output": options.get("json_output")}
        if not options["stream"]:
            completion = await session.complete(conversation, **call)
            return web.Response(body=to_json(module.response_body(completion, options, self.model_name)),
                                content_type="application/json")
        streamer = ReplyStreamer(request, WRITERS[module.PROTOCOL](options, self.model_name), self.renderer,
                                 tuple(self.engine.eos_token_ids), options)
        try:
            completion = await session.complete(conversation, **call, on_tokens=streamer.tokens,
                                                read_reply=streamer.read_reply)
            return await streamer.finish(completion)
        except Exception as exc:
            if not streamer.started:
                raise  # nothing sent yet: answered with the protocol's error status
            return await streamer.fail(exc, session)

    async def _count_tokens(self, request: web.Request) -> web.Response:
        conversation, _ = anthropic.parse_request(load_json(await request.read()))
        text = self.renderer.render(conversation.template_messages(), conversation.tools, add_generation_prompt=True)
        return web.json_response({"input_tokens": len(self.renderer.encode(text))})

    @staticmethod
    def _error(shape, exc: RequestError) -> web.Response:
        if shape is anthropic:
            body = anthropic.error_body(exc.message, exc.status)
        else:
            body = openai_chat.error_body(exc.message, exc.kind, exc.param, exc.code)
        return web.json_response(body, status=exc.status)

