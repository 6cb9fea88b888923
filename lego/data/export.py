"""Export to verl: the RL parquet dataset of tasks, and the padded tensors verl's actor consumes.

RL parquet (verl.utils.dataset.rl_dataset): data_source, prompt (list of {role, content}), ability,
reward_model {style, ground_truth}, extra_info {index, split, ...}, agent_name (the agent loop to run).

Actor tensors, as verl's agent loop pads them: the prompt of a sequence is its tokens before the first sampled
token, left-padded to the batch's longest prompt; the response is the rest (sampled tokens and the tool/user
tokens between them, response_mask 0 on the latter), right-padded. Keys: input_ids, attention_mask,
position_ids [B, P+R]; prompts [B, P]; responses, response_mask, old_log_probs (the inference log-probs),
advantages [B, R] (the sequence's advantage on its sampled tokens, as verl's compute_grpo_outcome_advantage
writes it); routed_experts [B, P+R, L, K] aligned with input_ids, zero on padding.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lego.data.batches import TrainingSample, iter_training_samples
from lego.data.catalog import Catalog
from lego.data.reader import read_tasks
from lego.data.writer import write_parquet_atomic
from lego.errors import LegoError
from lego.tasksets.task import Task

QWEN3_PAD_TOKEN_ID = 151643  # <|endoftext|>

# The verl agent loop that runs these rows (lego/train/verl_agent_loop.py registers itself under this name).
AGENT_LOOP_NAME = "lego_harness"

RL_SCHEMA = pa.schema([
    pa.field("data_source", pa.string()),
    pa.field("prompt", pa.list_(pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string())]))),
    pa.field("ability", pa.string()),
    pa.field("reward_model", pa.struct([pa.field("style", pa.string()), pa.field("ground_truth", pa.string())])),
    pa.field("extra_info", pa.struct([
        pa.field("index", pa.int64()),
        pa.field("split", pa.string()),
        pa.field("instance_id", pa.string()),
        pa.field("repo", pa.string()),
        pa.field("base_commit", pa.string()),
        pa.field("task_json", pa.string()),
    ])),
    pa.field("agent_name", pa.string()),
])


class ExportError(LegoError):
    """There is nothing to export, or the records do not fit verl's layout."""


def verl_rl_rows(tasks: Sequence[Task], agent_name: str = AGENT_LOOP_NAME, data_source: str = "lego",
                 ability: str = "coding") -> list[dict[str, Any]]:
    """One verl RL row per task; ground_truth carries the hidden tests as JSON (verl wants a string)."""
    rows = []
    for index, task in enumerate(tasks):
        ground_truth = {"FAIL_TO_PASS": task.FAIL_TO_PASS, "PASS_TO_PASS": task.PASS_TO_PASS,
                        "test_patch": task.test_patch}
        rows.append({
            "data_source": data_source,
            "prompt": [{"role": "user", "content": task.problem_statement}],
            "ability": ability,
            "reward_model": {"style": "rule", "ground_truth": json.dumps(ground_truth)},
            "extra_info": {"index": index, "split": task.split, "instance_id": task.instance_id, "repo": task.repo,
                           "base_commit": task.base_commit, "task_json": task.model_dump_json()},
            "agent_name": agent_name,
        })
    return rows


def write_verl_rl_dataset(tasks: Sequence[Task], out_path: Path, agent_name: str = AGENT_LOOP_NAME,
                          data_source: str = "lego") -> Path:
    table = pa.Table.from_pylist(verl_rl_rows(tasks, agent_name, data_source), schema=RL_SCHEMA)
    return write_parquet_atomic(table, Path(out_path))


def build_verl_batch(samples: Sequence[TrainingSample], pad_token_id: int = QWEN3_PAD_TOKEN_ID,
                     routing_dtype: np.dtype = np.dtype(np.uint8)) -> dict[str, np.ndarray]:
    """Pad samples into verl's actor tensors (numpy; `torch.from_numpy` each, or use `to_torch`)."""
    if not samples:
        raise ExportError("no training samples to pad into a batch")
    splits = []
    for sample in samples:
        sampled = np.flatnonzero(sample.response_mask)
        if len(sampled) == 0:
            raise ExportError(f"rollout {sample.rollout_id!r} segment {sample.segment_index} has no sampled token")
        splits.append(int(sampled[0]))
    prompt_len = max(splits)
    response_len = max(sample.num_tokens - split for sample, split in zip(samples, splits, strict=True))
    batch, total = len(samples), prompt_len + response_len
    input_ids = np.full((batch, total), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros((batch, total), dtype=np.int64)
    response_mask = np.zeros((batch, response_len), dtype=np.int64)
    old_log_probs = np.zeros((batch, response_len), dtype=np.float32)
    advantages = np.zeros((batch, response_len), dtype=np.float32)
    layouts = {s.routed_experts.shape[1:] for s in samples if s.routed_experts is not None}
    if len(layouts) > 1:
        raise ExportError(f"samples disagree on the routing layout (layers, top_k): {sorted(layouts)}")
    routed = np.zeros((batch, total, *layouts.pop()), dtype=routing_dtype) if layouts else None
    for row, (sample, split) in enumerate(zip(samples, splits, strict=True)):
        start = prompt_len - split  # left padding of the prompt
        end = start + sample.num_tokens
        input_ids[row, start:end] = sample.token_ids
        attention_mask[row, start:end] = 1
        response = slice(0, sample.num_tokens - split)
        response_mask[row, response] = sample.response_mask[split:]
        old_log_probs[row, response] = sample.logprobs[split:]
        advantages[row, response] = np.float32(sample.advantage) * sample.response_mask[split:]
        if routed is not None:
            if sample.routed_experts is None:
                raise ExportError(f"rollout {sample.rollout_id!r} has no routing while others do")
            routed[row, start:end] = sample.routed_experts
    position_ids = np.clip(np.cumsum(attention_mask, axis=1) - 1, 0, None)
    out = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "prompts": input_ids[:, :prompt_len].copy(),
        "responses": input_ids[:, prompt_len:].copy(),
        "response_mask": response_mask,
        "old_log_probs": old_log_probs,
        "advantages": advantages,
    }
    if routed is not None:
        out["routed_experts"] = routed
    return out


def to_torch(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    import torch

    return {key: torch.from_numpy(value) for key, value in batch.items()}


def export_iteration(catalog: Catalog, run_id: str, iteration: int, out_dir: Path,
                     pad_token_id: int = QWEN3_PAD_TOKEN_ID, agent_name: str = AGENT_LOOP_NAME) -> dict[str, Any]:
    """Write <out>/rl_dataset.parquet (the run's tasks) and <out>/batch.npz (iteration's padded tensors)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"run_id": run_id, "iteration": iteration}
    tasks = read_tasks(catalog, run_id)
    if tasks:
        summary["rl_dataset"] = str(write_verl_rl_dataset(tasks, out_dir / "rl_dataset.parquet", agent_name))
        summary["tasks"] = len(tasks)
    samples = list(iter_training_samples(catalog, run_id, iteration))
    if samples:
        batch = build_verl_batch(samples, pad_token_id)
        path = out_dir / "batch.npz"
        temp = out_dir / ".batch.npz.tmp"
        with open(temp, "wb") as sink:
            np.savez(sink, **batch)
        temp.replace(path)
        summary.update(batch=str(path), sequences=len(samples),
                       shapes={key: list(value.shape) for key, value in batch.items()})
    if not tasks and not samples:
        raise ExportError(f"run {run_id!r} has no stored tasks and iteration {iteration} has no training samples; "
                          "check `lego data show` for the runs and iterations present")
    (out_dir / "export.json").write_text(json.dumps(summary, indent=2))
    return summary


def read_verl_rl_dataset(path: Path) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist()
