"""One evaluation: resolved rate with a Wilson interval over the attempts the policy is answerable for."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel

from lego.evaluate.stats import wilson_interval
from lego.records import Outcome, OutcomeKind


class EvalReport(BaseModel):
    harness: str
    policy_version: int
    tasks: int
    attempts: int  # graded attempts (infra failures excluded)
    resolved: int
    resolved_rate: float | None
    resolved_low: float
    resolved_high: float
    confidence: float
    infra_errors: int
    infra_error_rate: float
    cheats: int
    cheat_rate: float | None
    kinds: dict[str, int]
    mean_turns: float | None
    mean_tokens: float | None
    per_task: dict[str, dict[str, int]]

    def metrics(self) -> dict[str, float]:
        """Numbers for MLflow (None rates are left out)."""
        names = ("tasks", "attempts", "resolved", "resolved_rate", "resolved_low", "resolved_high", "infra_errors",
                 "infra_error_rate", "cheats", "cheat_rate", "mean_turns", "mean_tokens")
        values = {name: getattr(self, name) for name in names}
        return {name: float(value) for name, value in values.items() if value is not None}


def summarize_outcomes(outcomes: Sequence[Outcome], rollout_stats: Mapping[str, tuple[int, int]] | None = None, *,
                       harness: str,
                       policy_version: int, confidence: float = 0.95) -> EvalReport:
    """Infra errors are counted apart and left out of the rate: an environment failure says nothing about
    the policy."""
    kinds = {kind.value: 0 for kind in OutcomeKind}
    per_task: dict[str, dict[str, int]] = {}
    for outcome in outcomes:
        kinds[outcome.kind.value] += 1
        task = per_task.setdefault(outcome.task_id, {"attempts": 0, "resolved": 0, "infra_errors": 0})
        if outcome.kind == OutcomeKind.infra_error:
            task["infra_errors"] += 1
        else:
            task["attempts"] += 1
            task["resolved"] += int(outcome.kind == OutcomeKind.resolved)
    infra = kinds[OutcomeKind.infra_error.value]
    attempts = len(outcomes) - infra
    resolved = kinds[OutcomeKind.resolved.value]
    cheats = kinds[OutcomeKind.cheat.value]
    low, high = wilson_interval(resolved, attempts, confidence)
    # (turns, tokens) of the graded attempts
    stats = rollout_stats or {}
    graded = [stats[o.rollout_id] for o in outcomes if o.kind != OutcomeKind.infra_error and o.rollout_id in stats]
    return EvalReport(
        harness=harness, policy_version=policy_version, tasks=len(per_task), attempts=attempts, resolved=resolved,
        resolved_rate=resolved / attempts if attempts else None, resolved_low=low, resolved_high=high,
        confidence=confidence, infra_errors=infra, infra_error_rate=infra / len(outcomes) if outcomes else 0.0,
        cheats=cheats, cheat_rate=cheats / attempts if attempts else None, kinds=kinds,
        mean_turns=sum(turns for turns, _ in graded) / len(graded) if graded else None,
        mean_tokens=sum(tokens for _, tokens in graded) / len(graded) if graded else None,
        per_task=per_task,
    )
