"""Read stored records back, streaming: memory is bounded by a batch (and a Parquet row group, which the
writer keeps to tens of MB), never by the dataset.

`iter_segment_batches` yields Arrow record batches of exactly `batch_size` rows (the last may be shorter);
`iter_trajectories` rebuilds Trajectories exactly (same arrays, dtypes and shapes) one at a time.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from lego.data import codec
from lego.data.catalog import Catalog
from lego.data.schema import SCHEMAS
from lego.records import LLMCall, Outcome, Segment, Trajectory
from lego.tasksets.task import Task

DEFAULT_BATCH_SIZE = 64


def _rebatch(batches: Iterable[pa.RecordBatch], size: int) -> Iterator[pa.RecordBatch]:
    pending: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        while batch.num_rows:
            take = min(size - count, batch.num_rows)
            pending.append(batch.slice(0, take))
            count += take
            batch = batch.slice(take)
            if count == size:
                yield pa.concat_batches(pending)
                pending, count = [], 0
    if count:
        yield pa.concat_batches(pending)


def scan_batches(files: Sequence[Path], table: str, batch_size: int = DEFAULT_BATCH_SIZE,
                 columns: list[str] | None = None, where: pc.Expression | None = None) -> Iterator[pa.RecordBatch]:
    """Stream one table's files in order, `batch_size` rows at a time, reading one file and batch ahead at most."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not files:
        return
    dataset = ds.dataset([str(path) for path in files], format="parquet", schema=SCHEMAS[table])
    scanner = dataset.scanner(columns=columns, filter=where, batch_size=batch_size,
                              batch_readahead=1, fragment_readahead=1)
    yield from _rebatch(scanner.to_batches(), batch_size)


def iter_segment_batches(catalog: Catalog, run_id: str | None = None, stage: str | None = None,
                         iteration: int | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
                         columns: list[str] | None = None,
                         where: pc.Expression | None = None) -> Iterator[pa.RecordBatch]:
    files = catalog.files("segments", run_id, stage, iteration)
    yield from scan_batches(files, "segments", batch_size, columns, where)


def _calls_by_rollout(path: Path) -> dict[str, list[LLMCall]]:
    calls: dict[str, list[LLMCall]] = defaultdict(list)
    if path.exists():
        for row in pq.read_table(path, schema=SCHEMAS["llm_calls"]).to_pylist():
            calls[row["rollout_id"]].append(codec.call_from_row(row))
    return calls


def _trajectories_of_file(rollouts_file: Path, batch_size: int) -> Iterator[Trajectory]:
    """The trajectories of one append: its rollouts file is small; its segments file is streamed."""
    batch_id = rollouts_file.name.removeprefix("rollouts-")
    rollouts = pq.read_table(rollouts_file, schema=SCHEMAS["rollouts"]).to_pylist()
    calls = _calls_by_rollout(rollouts_file.with_name(f"llm_calls-{batch_id}"))
    segments_file = rollouts_file.with_name(f"segments-{batch_id}")
    files = [segments_file] if segments_file.exists() else []
    stream = (item for batch in scan_batches(files, "segments", batch_size)
              for item in codec.segments_from_batch(batch))
    pending = next(stream, None)
    for row in rollouts:
        segments: list[Segment] = []
        while pending is not None and pending[0] == row["rollout_id"]:
            segments.append(pending[2])
            pending = next(stream, None)
        if len(segments) != row["num_segments"]:
            raise codec.DataValidationError(
                f"{segments_file}: trajectory {row['rollout_id']!r} has {len(segments)} segments stored but its "
                f"rollout row says {row['num_segments']}; the file set of this append is damaged, rewrite it"
            )
        yield codec.trajectory_from_row(row, segments, calls.get(row["rollout_id"], []))


def iter_trajectories(catalog: Catalog, run_id: str | None = None, stage: str | None = None,
                      iteration: int | None = None, batch_size: int = DEFAULT_BATCH_SIZE) -> Iterator[Trajectory]:
    """Every stored trajectory, in write order, one at a time."""
    for rollouts_file in catalog.files("rollouts", run_id, stage, iteration):
        yield from _trajectories_of_file(rollouts_file, batch_size)


def iter_trajectory_headers(catalog: Catalog, run_id: str | None = None, stage: str | None = None,
                            iteration: int | None = None) -> Iterator[Trajectory]:
    """Every stored trajectory without its token data (no segments, no calls, no harness log): the final diff,
    termination, error and metadata, which is all grading reads. Only the rollouts files are opened."""
    columns = [name for name in SCHEMAS["rollouts"].names if name != "harness_log"]
    for rollouts_file in catalog.files("rollouts", run_id, stage, iteration):
        for row in pq.read_table(rollouts_file, columns=columns, schema=SCHEMAS["rollouts"]).to_pylist():
            yield codec.trajectory_from_row({**row, "harness_log": ""}, [], [])


def read_trajectories(catalog: Catalog, rollout_ids: Sequence[str], run_id: str | None = None) -> list[Trajectory]:
    """Chosen trajectories (all in memory), in the order of `rollout_ids`."""
    wanted = pc.field("rollout_id").isin(list(rollout_ids))
    rows = {row["rollout_id"]: row
            for batch in scan_batches(catalog.files("rollouts", run_id), "rollouts", where=wanted)
            for row in batch.to_pylist()}
    missing = [rollout_id for rollout_id in rollout_ids if rollout_id not in rows]
    if missing:
        raise codec.DataValidationError(f"no stored trajectory with rollout id(s) {missing[:5]}")
    segments: dict[str, list[tuple[int, Segment]]] = defaultdict(list)
    for batch in scan_batches(catalog.files("segments", run_id), "segments", where=wanted):
        for rollout_id, index, segment in codec.segments_from_batch(batch):
            segments[rollout_id].append((index, segment))
    calls: dict[str, list[LLMCall]] = defaultdict(list)
    for batch in scan_batches(catalog.files("llm_calls", run_id), "llm_calls", where=wanted):
        for row in batch.to_pylist():
            calls[row["rollout_id"]].append(codec.call_from_row(row))
    return [
        codec.trajectory_from_row(
            rows[rollout_id],
            [segment for _, segment in sorted(segments[rollout_id], key=lambda item: item[0])],
            sorted(calls[rollout_id], key=lambda call: call.call_index),
        )
        for rollout_id in rollout_ids
    ]


def read_outcomes(catalog: Catalog, run_id: str, iteration: int | None = None) -> list[Outcome]:
    """The newest outcome of each graded rollout of a run."""
    query = "SELECT * FROM latest_outcomes WHERE run_id = ?"
    params: list = [run_id]
    if iteration is not None:
        query += " AND iteration = ?"
        params.append(iteration)
    return [codec.outcome_from_row(row) for row in catalog.rows(query + " ORDER BY written_at, rollout_id", params)]


def read_tasks(catalog: Catalog, run_id: str) -> list[Task]:
    """The tasks a run stored, newest copy of each instance, in instance order."""
    rows = catalog.rows(
        "SELECT task_json FROM tasks WHERE run_id = ? "
        "QUALIFY row_number() OVER (PARTITION BY instance_id ORDER BY written_at DESC) = 1 ORDER BY instance_id",
        [run_id],
    )
    return [codec.task_from_row(row) for row in rows]
