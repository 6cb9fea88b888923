"""What the trainer consumes: one `TrainingSample` per token sequence (a stored segment) of a rollout that is
in the loss, with its GRPO advantage from the `advantages` view.

    for sample in iter_training_samples(catalog, run_id, iteration):
        sample.token_ids        int32 [T]           prompt/tool tokens and sampled tokens, in order
        sample.response_mask    uint8 [T]           1 exactly on sampled tokens (they get the loss)
        sample.logprobs         float32 [T]         the inference engine's log-probs (0 where mask is 0)
        sample.advantage        float               the rollout's GRPO advantage, for every sampled token
        sample.routed_experts   uint8 [T, L, K]     the inference routing, for R3 replay (None: dense model)

`training_batch_fields(samples)` turns a list of samples into the keyword arguments of
`lego.train.trainer.TrainBatch` (input_ids, response_mask, inference_logprobs, advantages, routed_experts, and
group_ids: each sample's task id, its GRPO group within the iteration, so the trainer can count groups with signal).
Rollouts outside the loss (infra errors, ungraded, groups below data.min_valid_per_group) never appear;
segments without sampled tokens are skipped. Memory is bounded by `batch_size` segments.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.compute as pc

from lego.data import codec
from lego.data.catalog import Catalog
from lego.data.reader import DEFAULT_BATCH_SIZE, iter_segment_batches


@dataclass
class TrainingSample:
    rollout_id: str
    task_id: str
    iteration: int
    segment_index: int
    thread: str
    token_ids: np.ndarray  # int32 [T]
    response_mask: np.ndarray  # uint8 [T]
    logprobs: np.ndarray  # float32 [T], inference log-probs
    advantage: float
    routed_experts: np.ndarray | None  # uint8 [T, layers, top_k]
    reward: float
    is_cheat: bool
    policy_version: int

    @property
    def num_tokens(self) -> int:
        return int(len(self.token_ids))


def advantages_in_loss(catalog: Catalog, run_id: str, iteration: int) -> dict[str, dict[str, Any]]:
    rows = catalog.rows(
        "SELECT rollout_id, advantage, reward, is_cheat, policy_version FROM advantages "
        "WHERE run_id = ? AND iteration = ? AND in_loss",
        [run_id, iteration],
    )
    return {row["rollout_id"]: row for row in rows}


def iter_training_samples(catalog: Catalog, run_id: str, iteration: int, *, stage: str = "rollout",
                          main_only: bool = False, batch_size: int = DEFAULT_BATCH_SIZE,
                          advantages: dict[str, dict[str, Any]] | None = None) -> Iterator[TrainingSample]:
    """The training sequences of one iteration, streamed in storage order. `advantages` (rollout id -> row with
    advantage, reward, is_cheat, policy_version, for the rollouts in the loss) defaults to the `advantages` view;
    the train stage passes the rows its dataset artifact froze."""
    if advantages is None:
        advantages = advantages_in_loss(catalog, run_id, iteration)
    if not advantages:
        return
    where = pc.field("rollout_id").isin(list(advantages)) & (pc.field("num_response_tokens") > 0)
    if main_only:
        where = where & (pc.field("thread") == "main")
    for batch in iter_segment_batches(catalog, run_id, stage, iteration, batch_size=batch_size, where=where):
        task_ids = batch.column("task_id").to_pylist()
        for task_id, (rollout_id, index, segment) in zip(task_ids, codec.segments_from_batch(batch), strict=True):
            row = advantages[rollout_id]
            yield TrainingSample(
                rollout_id=rollout_id,
                task_id=task_id,
                iteration=iteration,
                segment_index=index,
                thread=segment.thread,
                token_ids=segment.token_ids,
                response_mask=segment.response_mask,
                logprobs=segment.logprobs,
                advantage=float(row["advantage"]),
                routed_experts=segment.routed_experts,
                reward=float(row["reward"]),
                is_cheat=bool(row["is_cheat"]),
                policy_version=int(row["policy_version"]),
            )


def training_batch_fields(samples: Sequence[TrainingSample]) -> dict[str, list]:
    """Keyword arguments for lego.train.trainer.TrainBatch."""
    routing = [sample.routed_experts for sample in samples]
    return {
        "input_ids": [sample.token_ids for sample in samples],
        "response_mask": [sample.response_mask for sample in samples],
        "inference_logprobs": [sample.logprobs for sample in samples],
        "advantages": [sample.advantage for sample in samples],
        "routed_experts": None if all(r is None for r in routing) else routing,
        # a GRPO group is (run, iteration, task) and a batch holds one run's iteration: the task id names it
        "group_ids": [sample.task_id for sample in samples],
    }
