"""What is stored of a stage's attempts: the termination of each trajectory and the newest outcome of each rollout,
read from the Parquet dataset (a few columns, never the tokens).

Reading records is kept apart from the code that produces them (lego.pipeline.attempts runs attempts through the
proxy and the harnesses, lego.pipeline.grading grades them in a sandbox): a stage's cache key covers the modules
it imports (lego.pipeline.keys), so a stage that only reads records (dataset) keys the data layer and nothing
that runs or grades an attempt.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pyarrow.parquet as pq

from lego.data import codec
from lego.data.catalog import Catalog
from lego.pipeline.artifacts import StageContext
from lego.records import Outcome


def read_kinds(files: Iterable[Path], column: str) -> dict[str, str]:
    """rollout id -> `column` (a trajectory's termination, an outcome's kind), from Parquet files of one table (two
    columns read, never the tokens); a later file's row wins (a rollout graded again)."""
    out: dict[str, str] = {}
    for path in files:
        table = pq.read_table(path, columns=["rollout_id", column])
        out.update(zip(table.column("rollout_id").to_pylist(),
                       (str(value) for value in table.column(column).to_pylist()), strict=True))
    return out


def stored_terminations(ctx: StageContext, data_run_id: str, stage: str, iteration: int) -> dict[str, str]:
    with Catalog.open(ctx.work, ctx.config, in_memory=True) as catalog:
        files = catalog.files("rollouts", data_run_id, stage, iteration)
    return read_kinds(files, "termination")


def stored_rollout_ids(ctx: StageContext, data_run_id: str, stage: str, iteration: int) -> set[str]:
    return set(stored_terminations(ctx, data_run_id, stage, iteration))


def stored_outcomes(ctx: StageContext, data_run_id: str, outcome_stage: str, iteration: int) -> dict[str, Outcome]:
    with Catalog.open(ctx.work, ctx.config, in_memory=True) as catalog:
        if not catalog.files("outcomes", data_run_id, outcome_stage, iteration):
            return {}
        rows = catalog.rows(
            "SELECT * FROM outcomes WHERE run_id = ? AND stage = ? AND iteration = ? "
            "QUALIFY row_number() OVER (PARTITION BY rollout_id ORDER BY written_at DESC) = 1",
            [data_run_id, outcome_stage, iteration])
    return {row["rollout_id"]: codec.outcome_from_row(row) for row in rows}


def kind_counts(kinds: Iterable[str]) -> dict[str, int]:
    """How many of each termination or outcome kind (a progress bar's counts)."""
    counts: dict[str, int] = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
    return counts
