"""A new SQLite MLflow store starts as a copy of an empty, migrated one from the machine cache (lego.cache).

MLflow builds a new SQLite store by running its whole chain of schema migrations, one SQLite commit each: seconds
of CPU and disk syncs in every new work dir (every test's, every `lego run` on a fresh one). The copy is the same
database those migrations produce, kept once per MLflow version, without the default experiment (id 0): MLflow
adds that one at the first open with the artifact location of the store it is opened as.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
from pathlib import Path

from lego.cache import cache_dir, seed_database_from

SQLITE_PREFIX = "sqlite:///"


def seed_sqlite_store(uri: str) -> None:
    """Put the machine's empty migrated store at `uri`'s path when it is a SQLite file that does not exist yet."""
    if not uri.startswith(SQLITE_PREFIX):
        return
    seed_database_from(Path(uri.removeprefix(SQLITE_PREFIX)), empty_store_template)


def empty_store_template() -> Path:
    """The cached empty store of the installed MLflow version, built (one full migration) when missing."""
    import mlflow

    template = cache_dir("mlflow") / f"empty-store-{mlflow.__version__}.db"
    if not template.is_file():
        with tempfile.TemporaryDirectory(dir=template.parent) as scratch:
            built = Path(scratch) / "store.db"
            _migrate_empty(built)
            os.replace(built, template)  # atomic: concurrent builders each put a whole copy
    return template


def _migrate_empty(db: Path) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"{SQLITE_PREFIX}{db}")
    client.get_experiment("0")  # opening the store runs the migrations and adds the default experiment
    with contextlib.closing(sqlite3.connect(db)) as connection, connection:
        connection.execute("DELETE FROM experiment_tags WHERE experiment_id = 0")
        connection.execute("DELETE FROM experiments WHERE experiment_id = 0")

