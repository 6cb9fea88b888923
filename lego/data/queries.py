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


# ---------------------------------------------------------------------------------------------- the dashboard
# Each takes the data run ids of one or more pipeline runs (lego.ui.data lists them from the run's manifest).


def outcome_counts(catalog: Catalog, data_run_ids: list[str]) -> list[dict[str, Any]]:
    """Per data run, stage, iteration, harness and outcome kind ('not_graded' before grading): rollouts, their
    tokens and turns, and when the newest was stored."""
    return catalog.rows(
        "SELECT r.run_id, r.stage, r.iteration, coalesce(r.harness, '') AS harness, "
        "coalesce(o.kind, 'not_graded') AS kind, count(*) AS rollouts, "
        "CAST(coalesce(sum(r.num_tokens), 0) AS BIGINT) AS tokens, "
        "CAST(coalesce(sum(r.num_turns), 0) AS BIGINT) AS turns, max(r.written_at) AS last_write "
        "FROM rollouts AS r LEFT JOIN latest_outcomes AS o ON o.run_id = r.run_id AND o.rollout_id = r.rollout_id "
        "WHERE list_contains(?, r.run_id) GROUP BY ALL ORDER BY r.run_id, r.stage, r.iteration, harness, kind",
        [data_run_ids])


def task_pass_rates(catalog: Catalog, data_run_ids: list[str]) -> list[dict[str, Any]]:
    """Per data run, iteration and task: attempts, graded attempts (infra errors and ungraded left out),
    resolved, infra errors."""
    return catalog.rows(
        "SELECT r.run_id, r.stage, r.iteration, r.task_id, count(*) AS attempts, "
        "count(*) FILTER (WHERE o.kind IS NOT NULL AND o.kind <> 'infra_error') AS graded, "
        "count(*) FILTER (WHERE o.kind = 'resolved') AS resolved, "
        "count(*) FILTER (WHERE o.kind = 'infra_error') AS infra_errors "
        "FROM rollouts AS r LEFT JOIN latest_outcomes AS o ON o.run_id = r.run_id AND o.rollout_id = r.rollout_id "
        "WHERE list_contains(?, r.run_id) GROUP BY ALL ORDER BY r.task_id, r.run_id, r.iteration",
        [data_run_ids])


def segment_counts(catalog: Catalog, data_run_ids: list[str]) -> list[dict[str, Any]]:
    """Per data run, stage, iteration and segment reason (start, rewrite, subagent): segments, tokens, sampled
    tokens and the tokens whose routed experts were recorded (routing_layers is set exactly when they were)."""
    return catalog.rows(
        "SELECT run_id, stage, iteration, coalesce(reason, 'start') AS reason, count(*) AS segments, "
        "count(*) FILTER (WHERE coalesce(thread, 'main') <> 'main') AS subagent_segments, "
        "CAST(coalesce(sum(num_tokens), 0) AS BIGINT) AS tokens, "
        "CAST(coalesce(sum(num_response_tokens), 0) AS BIGINT) AS response_tokens, "
        "CAST(coalesce(sum(num_tokens) FILTER (WHERE routing_layers IS NOT NULL), 0) AS BIGINT) AS routed_tokens "
        "FROM segments WHERE list_contains(?, run_id) GROUP BY ALL ORDER BY run_id, stage, iteration, reason",
        [data_run_ids])


def call_counts(catalog: Catalog, data_run_ids: list[str]) -> list[dict[str, Any]]:
    """Per data run, stage, iteration and call kind (start, extend, rewrite, subagent): LLM calls, failed calls,
    prompt tokens rendered anew and sampled tokens."""
    return catalog.rows(
        "SELECT run_id, stage, iteration, coalesce(kind, '') AS kind, count(*) AS calls, "
        "count(*) FILTER (WHERE error IS NOT NULL AND error <> '') AS failed, "
        "CAST(coalesce(sum(new_prompt_tokens), 0) AS BIGINT) AS new_prompt_tokens, "
        "CAST(coalesce(sum(completion_tokens), 0) AS BIGINT) AS completion_tokens "
        "FROM llm_calls WHERE list_contains(?, run_id) GROUP BY ALL ORDER BY run_id, stage, iteration, kind",
        [data_run_ids])


def rollout_index(catalog: Catalog, data_run_ids: list[str], limit: int = 1000) -> list[dict[str, Any]]:
    """The newest `limit` rollouts (no token data) with their newest outcome, newest first."""
    return catalog.rows(
        "SELECT r.run_id, r.stage, r.iteration, r.rollout_id, r.task_id, r.harness, r.sample_index, "
        "r.policy_version, r.termination, r.error, r.num_turns, r.num_tokens, r.written_at, "
        "o.kind, o.reward, o.cheat_rules, o.written_at AS graded_at "
        "FROM rollouts AS r LEFT JOIN latest_outcomes AS o ON o.run_id = r.run_id AND o.rollout_id = r.rollout_id "
        "WHERE list_contains(?, r.run_id) ORDER BY r.written_at DESC, r.rollout_id LIMIT ?",
        [data_run_ids, limit])


def rollout_detail(catalog: Catalog, run_id: str, rollout_id: str) -> dict[str, Any] | None:
    """One rollout's row (its harness log, timings, metadata; no token data) with its newest outcome."""
    rows = catalog.rows(
        "SELECT r.rollout_id, r.run_id, r.stage, r.iteration, r.task_id, r.harness, r.policy_version, "
        "r.sample_index, r.termination, r.error, r.final_diff, r.harness_log, r.timings, r.num_turns, r.num_tokens, "
        "r.num_response_tokens, r.written_at, o.kind, o.reward, o.is_cheat, o.cheat_rules, o.test_log, "
        "o.evidence_json, o.written_at AS graded_at "
        "FROM rollouts AS r LEFT JOIN latest_outcomes AS o ON o.run_id = r.run_id AND o.rollout_id = r.rollout_id "
        "WHERE r.run_id = ? AND r.rollout_id = ?",
        [run_id, rollout_id])
    return rows[0] if rows else None


def outcome_events(catalog: Catalog, data_run_ids: list[str], limit: int = 500) -> list[dict[str, Any]]:
    """The newest `limit` gradings (every grading, retries included), newest first."""
    return catalog.rows(
        "SELECT run_id, stage, iteration, rollout_id, task_id, kind, reward, cheat_rules, attempts, written_at "
        "FROM outcomes WHERE list_contains(?, run_id) ORDER BY written_at DESC, rollout_id LIMIT ?",
        [data_run_ids, limit])


def train_steps(catalog: Catalog, data_run_ids: list[str]) -> list[dict[str, Any]]:
    """The train stages' optimizer steps, in iteration and step order."""
    return catalog.rows(
        "SELECT run_id, iteration, step, policy_version, loss, num_sequences, num_tokens, duration_s, metrics, "
        "written_at FROM train_steps WHERE list_contains(?, run_id) ORDER BY iteration, step, written_at",
        [data_run_ids])


def eval_summaries(catalog: Catalog, data_run_ids: list[str]) -> list[dict[str, Any]]:
    """The eval_summary view's rows (resolved rate with its Wilson interval per harness and policy version)."""
    return catalog.rows(
        "SELECT run_id, harness, policy_version, iteration, attempts, resolved, cheat, infra_error, tasks, "
        "resolved_rate, resolved_low, resolved_high FROM eval_summary WHERE list_contains(?, run_id) "
        "ORDER BY harness, policy_version, run_id",
        [data_run_ids])
