"""Named queries over the catalog's views, for the stages and the UI."""

from __future__ import annotations

from typing import Any

from lego.data.catalog import Catalog


def task_difficulty(catalog: Catalog, run_id: str) -> list[dict[str, Any]]:
    """Per task of a run's filter stage: attempts, valid attempts, solved, pass rate, verdict, keep."""
    return catalog.rows("SELECT * FROM task_difficulty WHERE run_id = ? ORDER BY task_id", [run_id])


def kept_task_ids(catalog: Catalog, run_id: str) -> list[str]:
    """Tasks whose pass rate lies in the configured window (filter.min_solved..max_solved of filter.attempts)."""
    return [row["task_id"] for row in task_difficulty(catalog, run_id) if row["keep"]]


def iteration_summary(catalog: Catalog, run_id: str | None = None) -> list[dict[str, Any]]:
    query = "SELECT * FROM iteration_summary"
    params: list = []
    if run_id is not None:
        query += " WHERE run_id = ?"
        params.append(run_id)
    return catalog.rows(query + " ORDER BY run_id, stage, iteration", params)


def advantages(catalog: Catalog, run_id: str, iteration: int) -> list[dict[str, Any]]:
    """Every rollout of the iteration with its group statistics, in_loss, excluded_reason and advantage."""
    return catalog.rows("SELECT * FROM advantages WHERE run_id = ? AND iteration = ? ORDER BY task_id, sample_index",
                        [run_id, iteration])
