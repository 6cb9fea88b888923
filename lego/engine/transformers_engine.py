"""A transformers engine: sampling and scoring on CPU or one GPU, with MoE routing captured for R3.

How it runs:
- One worker thread owns the model; `generate`/`score` only enqueue a job and await its future, so any number
  of concurrent callers never block the asyncio event loop.
- Static batching: when the worker is free it takes the first waiting request and, for up to `batch_wait_ms`,
  every further request (at most `max_batch_size`). Their prompts are left-padded and prefilled together, then
  decoded together with one KV cache (`past_key_values`), one token per row per step. A row that finishes is
  answered at once; the batch goes on for the others. Requests that arrive mid-batch wait for the next batch.
- Log-probs: each returned log-prob is log softmax(logits)[token] of the *unscaled* (temperature 1) policy, from
  the very logits the token was sampled from (temperature and top-p only shape the sampling distribution). This is
  what verl compares with its training log-probs (vLLM's "raw_logprobs" mode does the same).
- Constraints (`SamplingParams.constraint`: a forced tool call, a JSON schema): the constraint is compiled for the
  vocabulary before the job is queued (off the event loop; a constraint that cannot be compiled fails that request
  alone, with `ConstraintError`), and each constrained row has a grammar matcher (lego/engine/grammar_mask.py). At
  every step the logits of the tokens its grammar does not allow next are set to -inf before sampling, so the token
  is drawn from the masked distribution renormalised, and its log-prob is the log-prob under that distribution
  (log softmax of the masked temperature-1 logits), not under the unmasked policy: the trainer's ratio must
  compare against the distribution the token was actually sampled from. A forced token (the only one allowed)
  has log-prob 0.
- Routing: forward hooks on every MoE router (`model.model.layers[i].mlp.gate`, returning
  `(logits, scores, indices)`) record the experts each token used, for the prompt and every generated token
  (the last sampled token is fed once more so its routing is known), as uint8 `[prompt+gen, layers, top_k]`.
- Streaming: `stream` hands each sampled token from the model's thread to the caller's event loop as it is
  sampled (`call_soon_threadsafe`), and yields what has arrived whenever the caller asks; the final chunk carries
  the result once the row's last routing is known. A caller that stops reading ends its row at the next step.
- Seeds: a request with `seed` samples from its own `torch.Generator`, so its output does not depend on
  which other requests share the batch's random stream (numerics of a batched forward can still differ in the
  last bits from a lone forward).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from lego.engine.base import GenerateResult, SamplingParams, TokenChunk, stop_string_in
from lego.engine.checkpoint import load_model, moe_routers
from lego.engine.constraints import Constraint
from lego.errors import ModelError

SCORE_CHUNK = 512  # positions per LM-head chunk when scoring


@dataclass
class _GenerateJob:
    prompt_ids: list[int]
    sampling: SamplingParams
    future: Future
    enqueued_at: float = field(default_factory=time.perf_counter)
    on_token: Callable[[int], None] | None = None  # called on the model's thread with each sampled token
    cancelled: bool = False  # the caller stopped reading: the row ends at the next step
    grammar: object | None = None  # the constraint compiled for the vocabulary (xgrammar's CompiledGrammar)


@dataclass
class _CallJob:
    """Any other work that must run on the model's thread (scoring, loading weights)."""

    function: object
    future: Future


class RoutingRecorder:
    """Forward hooks on every MoE router that keep the expert indices of the latest forward pass."""

    def __init__(self, model) -> None:
        self.routers = moe_routers(model)
        self.indices: list[torch.Tensor | None] = [None] * len(self.routers)
        self._handles = [router.register_forward_hook(self._hook(i)) for i, router in enumerate(self.routers)]

    def _hook(self, layer: int):
        def record(_module, _inputs, output) -> None:
            self.indices[layer] = output[2].detach()

        return record

    @property
    def is_moe(self) -> bool:
        return bool(self.routers)

    def take(self, batch: int, seq: int) -> torch.Tensor | None:
        """Indices of the last forward as [batch, seq, layers, top_k] (uint8), or None for a dense model."""
        if not self.routers:
            return None
        layers = []
        for layer, indices in enumerate(self.indices):
            if indices is None:
                raise ModelError(f"MoE router {layer} did not run in the last forward pass")
            layers.append(indices.reshape(batch, seq, -1))
        self.indices = [None] * len(self.routers)
        return torch.stack(layers, dim=2).to(torch.uint8).cpu()

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def sample_token(logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None) -> int:
    """One token from fp32 logits [vocab] under temperature and top-p (temperature 0: greedy)."""
    if sampling.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the token crossing the threshold stays)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs = torch.where(before < sampling.top_p, sorted_probs, torch.zeros_like(sorted_probs))
        choice = torch.multinomial(sorted_probs, 1, generator=generator)
        return int(order[choice])
    return int(torch.multinomial(probs, 1, generator=generator))


@dataclass
class _Row:
    job: _GenerateJob
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    routing: list[torch.Tensor] = field(default_factory=list)  # per fed position: [layers, top_k]
    finish_reason: str | None = None
    stop_sequence: str | None = None
    answered: bool = False
    started_at: float = 0.0
    mask: object | None = None  # its GrammarMask, when its job is constrained


class TransformersEngine:
    """The Engine protocol over a transformers causal LM (see the module docstring for how it batches)."""

    constrained_decoding = True
    keep_warm = False  # lego.engine.pool closes it after each stage: it starts as fast as it loads new weights

    def __init__(self, model_path: str | Path, dtype: str = "bfloat16", device: str = "cpu",
                 max_batch_size: int = 8, batch_wait_ms: float = 5.0, policy_version: int | None = None,
                 max_context: int | None = None) -> None:
        from lego.engine.checkpoint import policy_version as read_policy_version

        self.model_path = Path(model_path)
        self.dtype = dtype
        self.device = device
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_ms / 1000.0
        self.model = load_model(self.model_path, dtype, device)
        self.recorder = RoutingRecorder(self.model)
        config = self.model.config
        self.max_context = int(max_context or getattr(config, "max_position_embeddings", 32768))
        eos = config.eos_token_id
        self.eos_token_ids: tuple[int, ...] = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        pad = config.pad_token_id
        self.pad_token_id = int(pad if pad is not None else (self.eos_token_ids or (0,))[0])
        self.policy_version = read_policy_version(self.model_path) if policy_version is None else policy_version
        self.stats = {"batches": 0, "max_batch": 0, "decode_steps": 0}
        self._tokenizer = None  # loaded on the first request with stop strings
        self._grammar_masks = None  # GrammarMasks, made on the first constrained request
        self._grammar_lock = threading.Lock()
        self._jobs: queue.Queue = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="lego-engine", daemon=True)
        self._thread.start()

    # ---- public API (asyncio side) ----

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerateResult:
        self._check_prompt(prompt_ids)
        grammar = await self._compiled(sampling.constraint)
        future: Future = Future()
        self._submit(_GenerateJob(list(prompt_ids), sampling, future, grammar=grammar))
        return await asyncio.wrap_future(future)

    async def stream(self, prompt_ids: list[int], sampling: SamplingParams) -> AsyncIterator[TokenChunk]:
        self._check_prompt(prompt_ids)
        grammar = await self._compiled(sampling.constraint)
        loop = asyncio.get_running_loop()
        arrived: asyncio.Queue[int | None] = asyncio.Queue()  # sampled tokens, then None once the job is answered
        future: Future = Future()
        job = _GenerateJob(list(prompt_ids), sampling, future, grammar=grammar)

        def deliver(item: int | None) -> None:
            try:
                loop.call_soon_threadsafe(arrived.put_nowait, item)
            except RuntimeError:  # the caller's loop is closed: nobody reads this row (never fail the batch)
                job.cancelled = True

        job.on_token = deliver
        # Scheduled after every token's put (the worker answers a row after sampling its last token): None comes last.
        future.add_done_callback(lambda _: deliver(None))
        self._submit(job)
        try:
            while True:
                item = await arrived.get()
                tokens: list[int] = []
                while item is not None:
                    tokens.append(item)
                    if arrived.empty():
                        break
                    item = arrived.get_nowait()
                if item is None:  # answered: these are the last tokens
                    yield TokenChunk(tokens, future.result())
                    return
                yield TokenChunk(tokens)
        finally:
            job.cancelled = not future.done()

    async def _compiled(self, constraint: Constraint | None):
        """`constraint` compiled for this model's vocabulary (None for none), on a worker thread: the first one
        reads the vocabulary (seconds), a new schema takes tens of milliseconds, a known one is cached."""
        if constraint is None:
            return None
        return await asyncio.to_thread(self._compile, constraint)

    def _compile(self, constraint: Constraint):
        with self._grammar_lock:  # one at a time: GrammarMasks keeps the compiled grammars
            if self._grammar_masks is None:
                from lego.engine.grammar_mask import GrammarMasks

                vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
                self._grammar_masks = GrammarMasks(self.tokenizer, vocab_size)
            return self._grammar_masks.compile(constraint)

    def _check_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise ModelError("generate() needs at least one prompt token")
        if len(prompt_ids) >= self.max_context:
            raise ModelError(f"prompt of {len(prompt_ids)} tokens does not fit the context of {self.max_context}")

    async def score(self, token_ids: list[int]) -> list[float]:
        logprobs, _ = await self.score_with_routing(token_ids)
        return logprobs

    async def score_with_routing(self, token_ids: list[int], first: int = 0) -> tuple[list[float], np.ndarray | None]:
        """Log-probs of `token_ids[first:]` (position 0 has no predecessor: 0.0) and the routing of every token,
        from one forward pass. Only the scored positions go through the LM head: a scripted reply after a harness's
        long prompt costs the prompt's forward, not a vocabulary projection of every prompt token."""
        if not 0 <= first <= len(token_ids):
            raise ValueError(f"first={first} is outside the {len(token_ids)} tokens to score")
        return await self.call(lambda: self._score(list(token_ids), first))

    async def call(self, function):
        """Run `function()` on the model's thread (between batches) and await its result."""
        future: Future = Future()
        self._submit(_CallJob(function, future))
        return await asyncio.wrap_future(future)

    def load_checkpoint(self, path: str | Path, policy_version: int) -> None:
        """Swap in the weights at `path` between batches; blocks until done."""
        future: Future = Future()
        self._submit(_CallJob(lambda: self._load(Path(path), policy_version), future))
        future.result()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._jobs.put(None)
            self._thread.join(timeout=30)

    # ---- worker thread ----

    def _submit(self, job) -> None:
        if self._closed:
            raise ModelError("the engine is closed")
        self._jobs.put(job)

    def _work(self) -> None:
        pending: list = []
        while True:
            job = pending.pop(0) if pending else self._jobs.get()
            if job is None:
                return
            if isinstance(job, _CallJob):
                self._run_call(job)
                continue
            batch = [job]
            deadline = time.perf_counter() + self.batch_wait_s
            while len(batch) < self.max_batch_size:
                try:
                    nxt = self._jobs.get(timeout=max(0.0, deadline - time.perf_counter()))
                except queue.Empty:
                    break
                if isinstance(nxt, _GenerateJob):
                    batch.append(nxt)
                else:
                    pending.append(nxt)
                    if nxt is None:
                        break
            try:
                self._generate_batch(batch)
            except BaseException as exc:  # answer every caller; the worker lives on
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(exc)

    def _run_call(self, job: _CallJob) -> None:
        try:
            job.future.set_result(job.function())
        except BaseException as exc:
            job.future.set_exception(exc)

    def _load(self, path: Path, policy_version: int) -> None:
        model = load_model(path, self.dtype, self.device)
        self.recorder.remove()
        self.model = model
        self.recorder = RoutingRecorder(model)
        self.model_path = path
        self.policy_version = policy_version

    @torch.no_grad()
    def _score(self, token_ids: list[int], first: int = 0) -> tuple[list[float], np.ndarray | None]:
        ids = torch.tensor([token_ids], device=self.device)
        # The LM head runs in chunks: full [tokens, vocab] float logits of a 25k-token harness prompt
        # (Claude Code) would take ~15 GB.
        hidden = self.model.model(input_ids=ids).last_hidden_state[0]
        routing = self.recorder.take(1, len(token_ids))
        start = max(first, 1)  # the first scored token; hidden state start - 1 predicts it
        targets = ids[0, start:]
        pieces = []
        for offset in range(0, len(targets), SCORE_CHUNK):
            chunk = targets[offset:offset + SCORE_CHUNK]
            logits = self.model.lm_head(hidden[start - 1 + offset:start - 1 + offset + len(chunk)]).float()
            pieces.append(torch.log_softmax(logits, dim=-1).gather(-1, chunk[:, None])[:, 0])
        logprobs = torch.cat(pieces) if pieces else torch.zeros(0)
        values = ([0.0] if first == 0 and token_ids else []) + logprobs.cpu().tolist()
        return values, (routing[0].numpy() if routing is not None else None)

    @torch.no_grad()
    def _generate_batch(self, jobs: list[_GenerateJob]) -> None:
        started = time.perf_counter()
        self.stats["batches"] += 1
        self.stats["max_batch"] = max(self.stats["max_batch"], len(jobs))
        rows = []
        for job in jobs:
            generator = None
            if job.sampling.seed is not None:
                generator = torch.Generator(device="cpu").manual_seed(job.sampling.seed)
            mask = None
            if job.grammar is not None:
                mask = self._grammar_masks.mask(job.grammar, job.sampling.stop_token_ids)
            rows.append(_Row(job, generator, started_at=started, mask=mask))
        width = max(len(job.prompt_ids) for job in jobs)
        ids = torch.full((len(jobs), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(jobs), width), dtype=torch.long)
        for b, job in enumerate(jobs):
            ids[b, width - len(job.prompt_ids):] = torch.tensor(job.prompt_ids)
            mask[b, width - len(job.prompt_ids):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         logits_to_keep=1)
        routing = self.recorder.take(len(jobs), width)
        prompt_routing = [routing[b, width - len(job.prompt_ids):] if routing is not None else None
                          for b, job in enumerate(jobs)]
        cache = out.past_key_values
        logits = out.logits[:, -1].float().cpu()
        next_positions = positions[:, -1] + 1
        prefill_s = time.perf_counter() - started
        for b, row in enumerate(rows):
            self._sample_into(row, logits[b])
        while True:
            for b, row in enumerate(rows):
                fed = len(row.routing) == len(row.tokens) or routing is None
                if row.finish_reason is not None and not row.answered and fed:
                    self._answer(row, prompt_routing[b], prefill_s)
            # every row that has a token not yet fed needs one more forward (active rows, and finished rows
            # whose last token's routing is still unknown)
            if all(row.answered for row in rows):
                return
            step_ids = torch.tensor([[row.tokens[-1]] for row in rows], device=self.device)
            mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=mask.dtype, device=self.device)], dim=1)
            out = self.model(input_ids=step_ids, attention_mask=mask, position_ids=next_positions[:, None],
                             past_key_values=cache, use_cache=True)
            self.stats["decode_steps"] += 1
            cache = out.past_key_values
            next_positions = next_positions + 1
            step_routing = self.recorder.take(len(rows), 1)
            logits = out.logits[:, -1].float().cpu()
            for b, row in enumerate(rows):
                if row.answered:
                    continue
                if step_routing is not None:
                    row.routing.append(step_routing[b, 0])
                if row.finish_reason is None:
                    if row.job.cancelled:  # nobody reads this row any more: no more tokens for it
                        row.finish_reason = "length"
                    else:
                        self._sample_into(row, logits[b])

    def _sample_into(self, row: _Row, logits: torch.Tensor) -> None:
        sampling = row.job.sampling
        if row.mask is not None:  # sampled from, and scored under, what the grammar allows (module docstring)
            logits = row.mask.apply(logits)
        token = sample_token(logits, sampling, row.generator)
        if row.mask is not None:
            row.mask.accept(token)
        row.tokens.append(token)
        row.logprobs.append(float(torch.log_softmax(logits, dim=-1)[token]))
        if row.job.on_token is not None:
            row.job.on_token(token)
        if token in sampling.stop_token_ids:
            row.finish_reason = "stop"
        elif sampling.stop and (matched := self._stop_string(row.tokens, sampling.stop)) is not None:
            row.finish_reason, row.stop_sequence = "stop", matched
        elif len(row.tokens) >= sampling.max_tokens or len(row.job.prompt_ids) + len(row.tokens) >= self.max_context:
            row.finish_reason = "length"

    def _stop_string(self, tokens: list[int], stops: tuple[str, ...]) -> str | None:
        # Only the tail can hold a stop string that the previous token did not already complete.
        window = max(len(stop) for stop in stops) + 4
        return stop_string_in(self.tokenizer.decode(tokens[-window:], skip_special_tokens=False), stops)

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from lego.engine.tokenizer import load_tokenizer

            self._tokenizer = load_tokenizer(self.model_path)
        return self._tokenizer

    def _answer(self, row: _Row, prompt_routing: torch.Tensor | None, prefill_s: float) -> None:
        routed = None
        if prompt_routing is not None:
            routed = torch.cat([prompt_routing, torch.stack(row.routing)], dim=0).numpy()
        now = time.perf_counter()
        result = GenerateResult(
            token_ids=row.tokens,
            logprobs=row.logprobs,
            routed_experts=routed,
            finish_reason=row.finish_reason or "length",
            prompt_tokens=len(row.job.prompt_ids),
            stop_sequence=row.stop_sequence,
            timings={"queue_s": row.started_at - row.job.enqueued_at, "prefill_s": prefill_s,
                     "total_s": now - row.job.enqueued_at},
        )
        row.answered = True
        row.job.future.set_result(result)
