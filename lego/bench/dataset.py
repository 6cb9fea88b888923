"""`lego bench dataset`: ingest and read throughput of the token dataset, and bytes per token on disk.

For each routing shape (a 48-layer top-8 MoE over 128 experts, and the tiny model's 2 layers top-2 of 4), at
least 1M tokens of synthetic trajectories (lego.data.synthetic) are
  - ingested with DatasetWriter (validation, Arrow conversion, zstd Parquet, atomic rename + fsync),
  - read back with iter_trajectories (exact Trajectory rebuild, streamed) and checked byte for byte,
  - scanned by DuckDB through the catalog (sum of token-array lengths),
  - read as grading reads it: trajectory headers only (iter_trajectory_headers: diff, termination, metadata),
    against the whole trajectories the verify stage used to decode,
and, for comparison, the same arrays are written and read with plain pyarrow (list columns, default
write_table settings, routing as list<uint8>). Data generation is not timed.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lego.bench import register
from lego.config import LegoConfig
from lego.data.catalog import Catalog
from lego.data.reader import iter_trajectories, iter_trajectory_headers
from lego.data.synthetic import synthetic_trajectory
from lego.data.writer import DatasetWriter
from lego.records import Trajectory
from lego.workdir import WorkDir

SHAPES = {"moe-48x8": (48, 8, 128), "tiny-2x2": (2, 2, 4)}
TOKENS = 1_048_576
SEGMENT_TOKENS = 16_384  # a long agent trajectory's segment
SEGMENTS_PER_TRAJECTORY = 2
TRAJECTORIES_PER_APPEND = 8


def _trajectories(layers: int, top_k: int, experts: int, tokens: int, seed: int) -> list[Trajectory]:
    rng = np.random.default_rng(seed)
    count = -(-tokens // (SEGMENT_TOKENS * SEGMENTS_PER_TRAJECTORY))
    return [synthetic_trajectory(rng, f"bench-{i}", f"task-{i % 8}", sample_index=i // 8,
                                 segments=SEGMENTS_PER_TRAJECTORY, tokens_per_segment=SEGMENT_TOKENS,
                                 layers=layers, top_k=top_k, num_experts=experts) for i in range(count)]


def _size(paths: list[Path]) -> int:
    return sum(path.stat().st_size for path in paths)


def _plain_pyarrow(trajectories: list[Trajectory], directory: Path, tokens: int) -> dict[str, Any]:
    segments = [segment for trajectory in trajectories for segment in trajectory.segments]

    def list_column(arrays: list[np.ndarray], value_type: pa.DataType) -> pa.Array:
        offsets = np.concatenate([[0], np.cumsum([a.size for a in arrays])]).astype(np.int64)
        return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(arrays), value_type))

    start = time.perf_counter()
    table = pa.table({
        "rollout_id": [t.rollout_id for t in trajectories for _ in t.segments],
        "token_ids": list_column([s.token_ids for s in segments], pa.int32()),
        "response_mask": list_column([s.response_mask for s in segments], pa.uint8()),
        "logprobs": list_column([s.logprobs for s in segments], pa.float32()),
        "routed_experts": list_column([s.routed_experts.reshape(-1) for s in segments], pa.uint8()),
        "layers": [s.routed_experts.shape[1] for s in segments],
        "top_k": [s.routed_experts.shape[2] for s in segments],
    })
    path = directory / "plain.parquet"
    pq.write_table(table, path)
    write_s = time.perf_counter() - start
    del table
    start = time.perf_counter()
    back = pq.read_table(path)
    routed = back.column("routed_experts").combine_chunks().values.to_numpy()
    read_s = time.perf_counter() - start
    assert routed.size == sum(s.routed_experts.size for s in segments)
    return {"write_tokens_per_s": round(tokens / write_s), "read_tokens_per_s": round(tokens / read_s),
            "bytes_per_token": round(path.stat().st_size / tokens, 3), "write_s": round(write_s, 3),
            "read_s": round(read_s, 3)}


def _lego(trajectories: list[Trajectory], work: WorkDir, tokens: int) -> dict[str, Any]:
    writer = DatasetWriter(work, "bench")
    start = time.perf_counter()
    for first in range(0, len(trajectories), TRAJECTORIES_PER_APPEND):
        writer.append_trajectories(trajectories[first:first + TRAJECTORIES_PER_APPEND])
    write_s = time.perf_counter() - start
    with Catalog.open(work, in_memory=True) as catalog:
        segment_files = catalog.files("segments", "bench")
        all_files = segment_files + catalog.files("rollouts", "bench") + catalog.files("llm_calls", "bench")
        start = time.perf_counter()
        exact = True
        read_tokens = 0
        for original, back in zip(trajectories, iter_trajectories(catalog, "bench", batch_size=8), strict=True):
            for a, b in zip(original.segments, back.segments, strict=True):
                read_tokens += b.num_tokens
                exact &= all(getattr(a, name).tobytes() == getattr(b, name).tobytes()
                             and getattr(a, name).dtype == getattr(b, name).dtype
                             and getattr(a, name).shape == getattr(b, name).shape
                             for name in ("token_ids", "response_mask", "logprobs", "routed_experts"))
        read_s = time.perf_counter() - start
        start = time.perf_counter()
        headers = sum(1 for _ in iter_trajectory_headers(catalog, "bench"))
        headers_s = time.perf_counter() - start
        start = time.perf_counter()
        sql_tokens = catalog.one("SELECT sum(len(token_ids)) FROM segments WHERE run_id = 'bench'")[0]
        sql_s = time.perf_counter() - start
    return {
        "write_tokens_per_s": round(tokens / write_s), "read_tokens_per_s": round(read_tokens / read_s),
        "bytes_per_token": round(_size(all_files) / tokens, 3),
        "segments_bytes_per_token": round(_size(segment_files) / tokens, 3),
        "write_s": round(write_s, 3), "read_s": round(read_s, 3), "files": len(all_files),
        "exact_round_trip": bool(exact and read_tokens == tokens),
        "duckdb_token_scan_tokens_per_s": round(int(sql_tokens) / sql_s),
        # what the verify stage reads: before, every trajectory whole (read_s); now, the headers
        "grading_read_s": {"whole_trajectories": round(read_s, 3), "headers_only": round(headers_s, 4),
                           "trajectories": headers},
    }


@register("dataset")
def bench_dataset(config: LegoConfig, work: WorkDir, tokens: int = TOKENS) -> dict[str, Any]:
    results: dict[str, Any] = {
        "tokens_per_shape": None, "segment_tokens": SEGMENT_TOKENS,
        "encoding": {"token_ids": "list<int32>", "response_mask": "list<uint8>",
                     "logprobs": "list<float32> byte-stream-split", "routed_experts": "uint8 blob [T, L, K]",
                     "compression": "zstd"},
        "shapes": {},
    }
    scratch = Path(tempfile.mkdtemp(prefix="bench-dataset-", dir=work.root))
    try:
        for seed, (name, (layers, top_k, experts)) in enumerate(SHAPES.items()):
            trajectories = _trajectories(layers, top_k, experts, tokens, seed)
            total = sum(s.num_tokens for t in trajectories for s in t.segments)
            results["tokens_per_shape"] = total
            raw = total * (4 + 1 + 4 + layers * top_k)
            lego = _lego(trajectories, WorkDir(scratch / name), total)
            plain = _plain_pyarrow(trajectories, scratch, total)
            results["shapes"][name] = {"routing": [layers, top_k, experts], "raw_bytes_per_token": raw / total,
                                       "lego": lego, "plain_pyarrow": plain}
            shutil.rmtree(scratch / name, ignore_errors=True)
            del trajectories
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return results
