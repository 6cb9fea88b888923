"""R3 (Rollout Routing Replay) for transformers MoE models.

During a training forward pass each MoE router is made to use the experts recorded at inference instead of its
own top-k. The router still computes its logits and the softmax over all experts; the weights of the forced
experts are gathered from that softmax (and renormalised when the model sets `norm_topk_prob`), so the router
keeps its gradients. This is the router contract shared by Qwen3-MoE, Qwen2-MoE, Mixtral and OLMoE in
transformers 5: `router(hidden[tokens, hidden]) -> (logits, scores[tokens, top_k], indices[tokens, top_k])`.

A routing record that is missing, of the wrong shape, or names an expert the model lacks raises
`RoutingReplayError`: training never falls back silently to the router's own choice.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from lego.engine.checkpoint import moe_routers
from lego.errors import LegoError


class RoutingReplayError(LegoError):
    """The recorded routing does not fit the model or the batch being trained."""


def _replayed_forward(forced: torch.Tensor, layer: int):
    """A router forward that routes to `forced` [tokens, top_k] experts (bound to one router instance)."""

    def forward(self, hidden_states: torch.Tensor):
        hidden_states = hidden_states.reshape(-1, self.weight.shape[1])
        if hidden_states.shape[0] != forced.shape[0]:
            raise RoutingReplayError(
                f"router of MoE layer {layer} got {hidden_states.shape[0]} tokens but the routing record has "
                f"{forced.shape[0]}; the record must cover every token of the batch, aligned by position"
            )
        router_logits = F.linear(hidden_states, self.weight)
        router_probs = torch.softmax(router_logits, dtype=torch.float, dim=-1)
        indices = forced.to(router_logits.device)
        top_value = router_probs.gather(-1, indices)
        if getattr(self, "norm_topk_prob", False):
            top_value = top_value / top_value.sum(dim=-1, keepdim=True)
        return router_logits, top_value.to(router_logits.dtype), indices

    return forward


def check_routing(model, routed_experts: torch.Tensor, batch: int, seq: int) -> None:
    routers = moe_routers(model)
    if not routers:
        raise RoutingReplayError("routing replay was asked for, but the model has no MoE routers")
    expected = (batch, seq, len(routers), routers[0].top_k)
    if tuple(routed_experts.shape) != expected:
        raise RoutingReplayError(
            f"routing record has shape {tuple(routed_experts.shape)}, expected {expected} "
            "[batch, seq, layers, top_k]; was it recorded by another model or cut to other lengths?"
        )
    num_experts = routers[0].weight.shape[0]
    if int(routed_experts.max()) >= num_experts:
        raise RoutingReplayError(
            f"routing record names expert {int(routed_experts.max())} but the model has {num_experts} per layer"
        )


@contextmanager
def replay_routing(model, routed_experts: torch.Tensor) -> Iterator[None]:
    """Within the block, every forward of `model` routes by `routed_experts` [batch, seq, layers, top_k].

    The forward inside must take input of exactly [batch, seq] tokens.
    """
    if routed_experts.dim() != 4:
        raise RoutingReplayError(
            f"routing record must be [batch, seq, layers, top_k], got shape {tuple(routed_experts.shape)}"
        )
    batch, seq = routed_experts.shape[:2]
    check_routing(model, routed_experts, batch, seq)
    routers = moe_routers(model)
    indices = routed_experts.long()
    try:
        for layer, router in enumerate(routers):
            forced = indices[:, :, layer, :].reshape(batch * seq, -1).contiguous()
            router.forward = types.MethodType(_replayed_forward(forced, layer), router)
        yield
    finally:
        for router in routers:
            router.__dict__.pop("forward", None)


@contextmanager
def record_routing(model) -> Iterator[list[torch.Tensor]]:
    """Collects each router's chosen indices [tokens, top_k] of the forward passes inside the block."""
    chosen: list[torch.Tensor] = []
    handles = []

    def hook(_module, _inputs, output) -> None:
        chosen.append(output[2].detach())

    for router in moe_routers(model):
        handles.append(router.register_forward_hook(hook))
    try:
        yield chosen
    finally:
        for handle in handles:
            handle.remove()


def routing_mismatch(own: torch.Tensor, recorded: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per token: True where any layer's expert *set* differs. own/recorded [batch, seq, layers, top_k]."""
    differs = (own.long().sort(dim=-1).values != recorded.long().sort(dim=-1).values).any(dim=-1).any(dim=-1)
    if mask is not None:
        differs = differs & mask.bool()
    return differs


@torch.no_grad()
def routing_difference_share(model, input_ids: torch.Tensor, routed_experts: torch.Tensor,
                             mask: torch.Tensor | None = None) -> float:
    """Share of (masked) tokens whose routing without replay would differ from the record in any layer."""
    batch, seq = input_ids.shape
    check_routing(model, routed_experts, batch, seq)
    with record_routing(model) as chosen:
        model(input_ids=input_ids, logits_to_keep=1)
    own = torch.stack([c.reshape(batch, seq, -1) for c in chosen], dim=2)
    differs = routing_mismatch(own, routed_experts.to(own.device), mask)
    total = int(mask.sum()) if mask is not None else batch * seq
    return float(differs.sum()) / max(total, 1)
