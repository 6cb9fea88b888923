"""The DuckDB catalog of a work dir: views over the Parquet files, plus the difficulty, advantage, metric and
comparison views from sql/.

All tables are views (no rows live in the DuckDB file), so the catalog always reflects the complete files on
disk and can be rebuilt at any time; opening it re-creates the views with the current config's settings
(filter window, GRPO settings). When another process holds the catalog file's lock, the same views are built
in an in-memory database instead: they read the same files.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from lego.config import LegoConfig
from lego.data.schema import SCHEMA_DIR_PARTS, TABLES, check_table, table_glob
from lego.data.sql import load_sql
from lego.data.writer import ensure_schema_files
from lego.workdir import WorkDir

VIEW_FILES = ("schema", "difficulty", "advantages", "metrics", "comparisons")


@dataclass(frozen=True)
class TableFiles:
    table: str
    files: int
    bytes: int


def view_params(config: LegoConfig) -> dict[str, dict[str, Any]]:
    """The config-dependent parameters of each SQL file (besides schema.sql's globs)."""
    k = config.filter.attempts
    max_solved = config.filter.max_solved if config.filter.max_solved is not None else k - 1
    return {
        "difficulty": {"stage": "filter", "temperature": float(config.sampling.temperature), "k": k,
                       "min_solved": config.filter.min_solved, "max_solved": max_solved},
        "advantages": {"stage": "rollout", "min_valid": config.data.min_valid_per_group,
                       "epsilon": float(config.data.advantage_epsilon), "norm_by_std": config.data.norm_adv_by_std},
        "metrics": {},
        "comparisons": {"z": statistics.NormalDist().inv_cdf(0.5 + config.eval.confidence / 2)},
    }


class Catalog:
    """A DuckDB connection with the work dir's views. Use as a context manager or call close()."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, data_root: Path, config: LegoConfig,
                 path: Path | None):
        self.connection = connection
        self.data_root = data_root
        self.config = config
        self.path = path  # None: an in-memory catalog (the file was locked by another process)
        self.refresh()

    @classmethod
    def open(cls, work: WorkDir | Path, config: LegoConfig | None = None, *, in_memory: bool = False) -> Catalog:
        work = work if isinstance(work, WorkDir) else WorkDir(Path(work).expanduser().resolve())
        work.data.mkdir(parents=True, exist_ok=True)
        ensure_schema_files(work.data)
        config = config or LegoConfig()
        if in_memory:
            return cls(duckdb.connect(), work.data, config, None)
        try:
            connection = duckdb.connect(str(work.catalog))
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower():
                raise
            return cls(duckdb.connect(), work.data, config, None)
        return cls(connection, work.data, config, work.catalog)

    def refresh(self) -> None:
        """(Re)create every view with the current config."""
        globs = {f"{table}_glob": table_glob(str(self.data_root), table) for table in TABLES}
        params = view_params(self.config)
        self.connection.execute(load_sql("schema", **globs))
        for name in VIEW_FILES[1:]:
            self.connection.execute(load_sql(name, **params[name]))

    def sql(self, query: str, params: list | dict | None = None) -> duckdb.DuckDBPyRelation:
        return self.connection.sql(query, params=params) if params is not None else self.connection.sql(query)

    def one(self, query: str, params: list | dict | None = None) -> tuple | None:
        """The first row of a query, as a tuple (None when it returns no row)."""
        return self.connection.execute(query, params or []).fetchone()

    def rows(self, query: str, params: list | dict | None = None) -> list[dict[str, Any]]:
        cursor = self.connection.execute(query, params or [])
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def files(self, table: str, run_id: str | None = None, stage: str | None = None,
              iteration: int | None = None) -> list[Path]:
        """The complete files of one table (schema seed files excluded), sorted by path."""
        check_table(table)
        pattern = f"{run_id or '*'}/{stage or '*'}/iter={'*' if iteration is None else iteration}/{table}-*.parquet"
        seed = self.data_root.joinpath(*SCHEMA_DIR_PARTS)
        return sorted(path for path in self.data_root.glob(pattern) if path.parent != seed)

    def table_files(self) -> list[TableFiles]:
        out = []
        for table in TABLES:
            files = self.files(table)
            out.append(TableFiles(table, len(files), sum(path.stat().st_size for path in files)))
        return out

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> Catalog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
