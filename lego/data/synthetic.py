"""Synthetic trajectories with realistic shapes, for tests and `lego bench dataset`.

A trajectory alternates rendered prompt/tool-output spans (mask 0) with sampled spans (mask 1, negative
log-probs); token ids follow a Zipf-like law over the Qwen3 vocabulary; routing draws each of the top_k slots
from a skewed per-layer expert popularity (a trained router's load imbalance) through a lookup table, which is
fast enough for millions of tokens x 48 layers. Slots of one token are not forced distinct: that changes the
entropy, hence the stored size, very little.
"""

from __future__ import annotations

import numpy as np

from lego.records import LLMCall, Segment, Trajectory

QWEN3_VOCAB = 151_669


def synthetic_routing(rng: np.random.Generator, num_tokens: int, layers: int, top_k: int,
                      num_experts: int) -> np.ndarray:
    """uint8 [num_tokens, layers, top_k] expert ids with a skewed popularity per layer."""
    resolution = 1 << 16
    routed = np.empty((num_tokens, layers, top_k), dtype=np.uint8)
    for layer in range(layers):
        popularity = rng.dirichlet(np.full(num_experts, 0.5))
        table = np.minimum(np.searchsorted(np.cumsum(popularity), (np.arange(resolution) + 0.5) / resolution),
                           num_experts - 1).astype(np.uint8)  # inverse CDF, quantized
        routed[:, layer, :] = table[rng.integers(0, resolution, (num_tokens, top_k), dtype=np.uint16)]
    return routed


def synthetic_segment(rng: np.random.Generator, num_tokens: int, layers: int | None, top_k: int,
                      num_experts: int, mean_prompt_span: int = 800, mean_response_span: int = 200) -> Segment:
    token_ids = (rng.zipf(1.3, num_tokens) % QWEN3_VOCAB).astype(np.int32)
    response_mask = np.zeros(num_tokens, dtype=np.uint8)
    position = int(rng.integers(1, mean_prompt_span * 2))  # the first call's prompt
    while position < num_tokens:
        length = int(rng.integers(1, mean_response_span * 2))
        response_mask[position:position + length] = 1
        position += length + int(rng.integers(1, mean_prompt_span))
    logprobs = np.where(response_mask == 1, -rng.exponential(0.4, num_tokens), 0.0).astype(np.float32)
    routed = synthetic_routing(rng, num_tokens, layers, top_k, num_experts) if layers else None
    return Segment(token_ids=token_ids, response_mask=response_mask, logprobs=logprobs, routed_experts=routed)


def synthetic_trajectory(rng: np.random.Generator, rollout_id: str, task_id: str, *, iteration: int = 0,
                         sample_index: int = 0, segments: int = 1, tokens_per_segment: int = 2000,
                         layers: int | None = 2, top_k: int = 2, num_experts: int = 4) -> Trajectory:
    segs = [synthetic_segment(rng, tokens_per_segment, layers, top_k, num_experts) for _ in range(segments)]
    calls = [
        LLMCall(call_index=i, protocol="openai_chat", started_at=1_700_000_000.0 + i, latency_s=0.5,
                prompt_tokens=tokens_per_segment // 2, completion_tokens=100, finish_reason="stop",
                segment_index=min(i, segments - 1), kind="extend" if i else "start", new_prompt_tokens=50)
        for i in range(max(segments, 2))
    ]
    return Trajectory(rollout_id=rollout_id, task_id=task_id, harness="mini-swe-agent", policy_version=iteration,
                      iteration=iteration, sample_index=sample_index, segments=segs, calls=calls,
                      final_diff="diff --git a/x.py b/x.py\n", timings={"total_s": 12.5, "harness_s": 11.0},
                      metadata={"temperature": 1.0, "note": "synthetic"})
