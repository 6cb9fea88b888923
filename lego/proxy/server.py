"""The in-process proxy: one aiohttp server per rollout worker, on loopback and on a unix socket.

Each rollout attempt opens a `Session`; its id (secrets.token_urlsafe) is part of every URL, so a session's data is
reachable only through its own id:
    OpenAI base URL     http://127.0.0.1:PORT/s/<id>/v1    (chat/completions, responses, models)
    Anthropic base URL  http://127.0.0.1:PORT/s/<id>        (v1/messages, v1/messages?beta=true)
The unix socket serves the same paths (a relay inside a sandbox forwards to it). Unknown or closed sessions get
404 in the protocol's error shape; bad requests get the protocol's 400; nothing a client sends crashes the server.
"""

from __future__ import annotations

import json
import logging
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from lego.config import SamplingConfig
from lego.engine.base import Engine
from lego.proxy import anthropic, openai_chat, responses
from lego.proxy.messages import RequestError
from lego.proxy.render import ChatRenderer
from lego.proxy.session import Session

log = logging.getLogger(__name__)

POST_ROUTES = {
    "/v1/chat/completions": openai_chat,
    "/v1/messages": anthropic,
    "/v1/responses": responses,
}


class ProxyServer:
    def __init__(self, engine: Engine, tokenizer, sampling: SamplingConfig | None = None, *,
                 host: str = "127.0.0.1", port: int = 0, unix_path: str | Path | None = None,
                 unix_socket: bool = True, model_name: str = "lego-policy") -> None:
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

    # ------------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> ProxyServer:
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
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None

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

    def open_session(self, label: str = "") -> Session:
        session_id = secrets.token_urlsafe(24)
        session = Session(session_id, self.renderer, self.engine, self.sampling,
                          base_url=f"{self.url}/s/{session_id}", label=label)
        self._sessions[session_id] = session
        return session

    def close_session(self, session_id: str) -> Session | None:
        """Stop serving a session; its records stay readable on the returned object."""
        session = self._sessions.pop(session_id, None)
        if session is not None:
            session.closed = True
            session.cancel_inflight()
        return session

    def session(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

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
        session = self._sessions.get(parts[2])
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
            return self._error(shape, exc)
        except Exception as exc:  # a bug must not take the rollout's server down
            log.exception("proxy request failed")
            return self._error(shape, RequestError(f"internal proxy error: {type(exc).__name__}: {exc}",
                                                   status=500, kind="api_error"))

    @staticmethod
    async def _json_body(request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise RequestError(f"the request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        return body

    async def _complete(self, request: web.Request, session: Session, module) -> web.StreamResponse:
        body = await self._json_body(request)
        conversation, options = module.parse_request(body)
        completion = await session.complete(conversation, protocol=module.PROTOCOL, stream=options["stream"],
                                            max_tokens=options["max_tokens"], parse_tools=options["parse_tools"],
                                            stop=options.get("stop", ()))
        if not options["stream"]:
            return web.json_response(module.response_body(completion, options, self.model_name))
        render: Callable = getattr(module, "stream_events", None) or module.stream_chunks
        response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                           "Cache-Control": "no-cache"})
        await response.prepare(request)
        for line in render(completion, options, self.model_name):
            await response.write(line)
        await response.write_eof()
        return response

    async def _count_tokens(self, request: web.Request) -> web.Response:
        conversation, _ = anthropic.parse_request(await self._json_body(request))
        text = self.renderer.render(conversation.template_messages(), conversation.tools, add_generation_prompt=True)
        return web.json_response({"input_tokens": len(self.renderer.encode(text))})

    @staticmethod
    def _error(shape, exc: RequestError) -> web.Response:
        if shape is anthropic:
            body = anthropic.error_body(exc.message, exc.status)
        else:
            body = openai_chat.error_body(exc.message, exc.kind, exc.param, exc.code)
        return web.json_response(body, status=exc.status)

