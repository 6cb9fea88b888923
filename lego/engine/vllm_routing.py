"""Routing for R3 from vLLM where its own capture does not run (CPU): the experts each token was routed to.

vLLM's `enable_return_routed_experts` needs its newer model runner, which needs a Triton backend that CPU builds
lack. This module gets the same rows from the V1 model runner, and is the one place that knows vLLM's internals
for it (runs in lego.engine.vllm_worker's process, with the model in that process):

- `bind_routed_experts_capturer(model, capturer)` (vLLM's own binding for its GPU capture) makes every MoE router
  call `capturer.capture(layer_id, topk_ids)` with the logical expert ids it chose, `[tokens, top_k]`, each forward.
- The model runner's `execute_model(scheduler_output)` runs one forward over the scheduled tokens, laid out request
  by request in `input_batch.req_ids` order, `scheduler_output.num_scheduled_tokens[req_id]` tokens each; the
  model's forward gets their `positions`.

Rows are kept per request by position, so a prompt prefilled in chunks, or recomputed after a preemption, lands
where it belongs. Prefix caching must be off (a cached prefix is never recomputed, so its rows would be missing) and
the model must run eagerly (a compiled forward calls no Python hooks); the worker sets both.
Anything that does not add up raises `RoutingCaptureError`, naming what moved: a vLLM upgrade that changes
these internals fails at start-up or on the first request, never with silently shifted rows.
"""

from __future__ import annotations

import numpy as np


class RoutingCaptureError(RuntimeError):
    """vLLM's internals no longer match what the routing capture relies on (see the module docstring)."""


class RoutingCapture:
    """The capturer vLLM's routers call, and the rows it kept for each request still running."""

    def __init__(self, num_layers: int, top_k: int) -> None:
        self.num_layers, self.top_k = num_layers, top_k
        self.step: list[np.ndarray | None] = [None] * num_layers
        self.positions: np.ndarray | None = None
        self.rows: dict[str, dict[int, np.ndarray]] = {}  # request id -> position -> [layers, top_k]
        self.error: str | None = None

    # ---- called by vLLM ----

    def capture(self, layer_id: int, topk_ids) -> None:
        if not 0 <= layer_id < self.num_layers:
            self.error = f"a router reported layer {layer_id}, outside the model's {self.num_layers} MoE layers"
            return
        self.step[layer_id] = topk_ids.detach().to("cpu").numpy().astype(np.uint8, copy=True)

    def forward_positions(self, positions) -> None:
        self.positions = positions.detach().to("cpu").numpy().copy()

    def end_step(self, req_ids: list[str], counts: dict[str, int]) -> None:
        """File the step's rows under the requests they belong to."""
        step, positions = self.step, self.positions
        self.step, self.positions = [None] * self.num_layers, None
        total = sum(counts.get(req_id, 0) for req_id in req_ids)
        if total == 0 or self.error:
            return
        if positions is None or any(layer is None for layer in step):
            missing = [i for i, layer in enumerate(step) if layer is None]
            self.error = (f"a forward of {total} tokens ran without the routing of layers {missing} or without "
                          "positions: vLLM's MoE router capture or model forward changed (or the model runs "
                          "compiled: the capture needs enforce_eager)")
            return
        if len(positions) < total or any(layer.shape[0] < total for layer in step):
            self.error = (f"the step scheduled {total} tokens but the routers saw {[s.shape[0] for s in step]} and "
                          f"the model {len(positions)}: vLLM's token layout changed")
            return
        rows = np.stack([layer[:total] for layer in step], axis=1)  # [tokens, layers, top_k]
        start = 0
        for req_id in req_ids:
            count = counts.get(req_id, 0)
            kept = self.rows.setdefault(req_id, {})
            for offset in range(count):
                kept[int(positions[start + offset])] = rows[start + offset]
            start += count

    # ---- called by the worker ----

    def take(self, request_id: str, length: int) -> np.ndarray:
        """The rows of positions 0..length-1 of a finished request, `[length, layers, top_k]` uint8."""
        kept = self.rows.pop(request_id, {})
        if self.error:
            raise RoutingCaptureError(self.error)
        missing = [position for position in range(length) if position not in kept]
        if missing:
            raise RoutingCaptureError(f"no routing was captured for positions {missing[:8]} of request "
                                      f"{request_id} ({length} tokens fed): is prefix caching on?")
        return np.stack([kept[position] for position in range(length)]) if length else np.zeros(
            (0, self.num_layers, self.top_k), np.uint8)

    def forget(self, request_id: str) -> None:
        self.rows.pop(request_id, None)


def install(engine, num_layers: int, top_k: int) -> RoutingCapture:
    """Bind a RoutingCapture to the routers of `engine`'s model (an in-process vLLM LLMEngine, one worker)."""
    try:
        from vllm.model_executor.layers.fused_moe.routed_experts_capturer import bind_routed_experts_capturer
    except ImportError as exc:
        raise RoutingCaptureError(f"vLLM no longer has bind_routed_experts_capturer ({exc})") from exc
    capture = RoutingCapture(num_layers, top_k)

    def attach(worker) -> None:
        runner = worker.model_runner
        bind_routed_experts_capturer(runner.model, capture)
        runner.model.register_forward_pre_hook(
            lambda _module, args, kwargs: capture.forward_positions(kwargs["positions"] if "positions" in kwargs
                                                                    else args[1]), with_kwargs=True)
        execute_model = runner.execute_model

        def execute_and_file(scheduler_output, *args, **kwargs):
            try:
                return execute_model(scheduler_output, *args, **kwargs)
            finally:
                capture.end_step(list(runner.input_batch.req_ids), dict(scheduler_output.num_scheduled_tokens))

        runner.execute_model = execute_and_file

    try:
        engine.collective_rpc(attach)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise RoutingCaptureError(f"vLLM's model runner no longer looks as the routing capture expects: "
                                  f"{type(exc).__name__}: {exc}") from exc
    return capture
