"""Append records to the work dir's Parquet files, atomically.

Each append writes new files (never rewrites one): data/<run_id>/<stage>/iter=<n>/<table>-<time_ns>-<random>.parquet.
A file is written under a hidden temp name in the same directory (`.<table>-<id>.parquet.tmp`), fsynced,
renamed into place and the directory fsynced, so a crash never leaves a half-written file visible: the
catalog's globs and the readers only see `<table>-*.parquet`. A trajectory batch writes its segments and
calls first and its rollouts file last: a rollout row is visible only once its token arrays are.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from lego.data import codec
from lego.data.schema import SCHEMA_DIR_PARTS, SCHEMAS, TEMP_SUFFIX, check_name, check_table, parquet_options
from lego.records import Outcome, Trajectory
from lego.tasksets.task import Task
from lego.workdir import WorkDir

# A row group is the unit a reader holds in memory: keep it to tens of MB even for long segments.
ROW_GROUP_BYTES = 64 * 1024 * 1024


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_parquet_atomic(table: pa.Table, path: Path, row_group_bytes: int = ROW_GROUP_BYTES) -> Path:
    """Write `table` to `path` so that `path` either does not exist or holds the complete file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}{TEMP_SUFFIX}")
    rows_per_group = table.num_rows
    if table.num_rows and table.nbytes > row_group_bytes:
        rows_per_group = max(1, table.num_rows * row_group_bytes // table.nbytes)
    try:
        with open(temp, "wb") as sink:
            with pq.ParquetWriter(sink, table.schema, **parquet_options(table.schema)) as writer:
                for start in range(0, max(table.num_rows, 1), max(rows_per_group, 1)):
                    writer.write_table(table.slice(start, rows_per_group))
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def ensure_schema_files(data_root: Path) -> None:
    """One zero-row file per table, so each view's glob always matches (see lego.data.schema)."""
    directory = data_root.joinpath(*SCHEMA_DIR_PARTS)
    for table, schema in SCHEMAS.items():
        path = directory / f"{table}-schema.parquet"
        if path.exists():
            try:
                if pq.read_schema(path).equals(schema):
                    continue
            except (pa.ArrowInvalid, OSError):
                pass
        write_parquet_atomic(schema.empty_table(), path)


def new_batch_id() -> str:
    """Sorts in write order (nanosecond clock first), unique across processes (random suffix)."""
    return f"{time.time_ns():020d}-{uuid.uuid4().hex[:12]}"


def remove_stale_temp_files(data_root: Path, older_than_s: float = 3600.0) -> list[Path]:
    """Delete temp files that a crashed writer left behind (they are invisible to readers, but take space)."""
    cutoff = time.time() - older_than_s
    stale = [path for path in Path(data_root).glob(f"*/*/iter=*/.*.parquet{TEMP_SUFFIX}")
             if path.stat().st_mtime < cutoff]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


class DatasetWriter:
    """Appends one run's records; `stage` names the pipeline stage that produced them."""

    def __init__(self, work: WorkDir | Path, run_id: str, row_group_bytes: int = ROW_GROUP_BYTES):
        """`work`: a WorkDir, or the data root itself (<work>/data)."""
        self.data_root = work.data if isinstance(work, WorkDir) else Path(work)
        self.run_id = check_name("run id", run_id)
        self.row_group_bytes = row_group_bytes
        ensure_schema_files(self.data_root)

    def directory(self, stage: str, iteration: int) -> Path:
        if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
            raise codec.DataValidationError(f"iteration {iteration!r} must be an integer >= 0")
        return self.data_root / self.run_id / check_name("stage", stage) / f"iter={iteration}"

    def _write(self, table_name: str, table: pa.Table, stage: str, iteration: int, batch_id: str) -> Path:
        check_table(table_name)
        path = self.directory(stage, iteration) / f"{table_name}-{batch_id}.parquet"
        return write_parquet_atomic(table, path, self.row_group_bytes)

    @staticmethod
    def _now() -> datetime:
        return datetime.now(UTC)

    def append_trajectories(self, trajectories: Iterable[Trajectory], stage: str = "rollout") -> list[Path]:
        """Write rollouts, llm_calls and segments (one file set per iteration present in the batch)."""
        trajectories = list(trajectories)
        for trajectory in trajectories:
            codec.validate_trajectory(trajectory)
        seen: set[str] = set()
        for trajectory in trajectories:
            if trajectory.rollout_id in seen:
                raise codec.DataValidationError(
                    f"trajectory {trajectory.rollout_id!r} appears twice in one append; rollout ids must be unique")
            seen.add(trajectory.rollout_id)
        by_iteration: dict[int, list[Trajectory]] = defaultdict(list)
        for trajectory in trajectories:
            by_iteration[int(trajectory.iteration)].append(trajectory)
        paths = []
        now = self._now()
        for iteration, batch in sorted(by_iteration.items()):
            batch_id = new_batch_id()
            # rollouts last: its file is the commit marker of the batch
            paths.append(self._write("segments", codec.segments_table(batch, self.run_id, stage, now),
                                     stage, iteration, batch_id))
            paths.append(self._write("llm_calls", codec.llm_calls_table(batch, self.run_id, stage, now),
                                     stage, iteration, batch_id))
            paths.append(self._write("rollouts", codec.rollouts_table(batch, self.run_id, stage, now),
                                     stage, iteration, batch_id))
        return paths

    def append_outcomes(self, outcomes: Sequence[Outcome], iteration: int, stage: str = "verify") -> Path | None:
        if not outcomes:
            return None
        table = codec.outcomes_table(list(outcomes), self.run_id, stage, iteration, self._now())
        return self._write("outcomes", table, stage, iteration, new_batch_id())

    def append_tasks(self, tasks: Sequence[Task], iteration: int = 0, stage: str = "tasks") -> Path | None:
        if not tasks:
            return None
        table = codec.tasks_table(list(tasks), self.run_id, stage, iteration, self._now())
        return self._write("tasks", table, stage, iteration, new_batch_id())

    def append_train_steps(self, steps: Sequence[codec.TrainStep], iteration: int,
                           stage: str = "train") -> Path | None:
        if not steps:
            return None
        table = codec.train_steps_table(list(steps), self.run_id, stage, iteration, self._now())
        return self._write("train_steps", table, stage, iteration, new_batch_id())

    def append_eval_results(self, results: Sequence[codec.EvalResult], iteration: int,
                            stage: str = "evaluate") -> Path | None:
        if not results:
            return None
        table = codec.eval_results_table(list(results), self.run_id, stage, iteration, self._now())
        return self._write("eval_results", table, stage, iteration, new_batch_id())
