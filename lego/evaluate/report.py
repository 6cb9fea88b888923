"""One evaluation: resolved rate with a Wilson interval over the attempts the policy is answerable for, per repo,
with its coverage (graded attempts / planned attempts)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, Field

from lego.evaluate.stats import wilson_interval
from lego.records import Outcome, OutcomeKind


class RepoRate(BaseModel):
    """The resolved rate of one repository's tasks (infra failures apart, as in the whole report)."""

    attempts: int  # graded
    resolved: int
    infra_errors: int
    resolved_rate: float | None
    resolved_low: float
    resolved_high: float


class EvalReport(BaseModel):
    harness: str
    policy_version: int
    tasks: int
    attempts: int  # graded attempts (infra failures excluded)
    resolved: int
    # None when nothing was graded, or when the coverage fell short (`covered` False): a rate over the attempts
    # that happened to survive the infrastructure would be reported as if it measured the task set.
    resolved_rate: float | None
    resolved_low: float | None
    resolved_high: float | None
    confidence: float
    infra_errors: int
    infra_error_rate: float
    cheats: int
    cheat_rate: float | None
    kinds: dict[str, int]
    mean_turns: float | None
    mean_tokens: float | None
    per_task: dict[str, dict[str, int]]
    planned: int = 0  # attempts asked for (tasks x samples)
    coverage: float = 1.0  # graded / planned
    min_coverage: float = 0.0
    per_repo: dict[str, RepoRate] = Field(default_factory=dict)
    infra_checks: dict[str, int] = Field(default_factory=dict)  # infra failures by the check that named them

    @property
    def covered(self) -> bool:
        return self.coverage >= self.min_coverage

    def headline(self) -> str:
        """The result in one line: the rate with its interval, or why there is none."""
        infra = f"infra failures {self.infra_errors} (apart)"
        if not self.covered:
            return (f"coverage short: {self.attempts} of {self.planned} planned attempts graded ({self.coverage:.0%} "
                    f"< eval.min_coverage {self.min_coverage:.0%}); no resolved rate. {infra}: "
                    f"{_checks(self.infra_checks)}. Fix the infrastructure and rerun")
        if self.resolved_rate is None:
            return f"resolved {self.resolved}/{self.attempts}: nothing graded; {infra}"
        return (f"resolved {self.resolved}/{self.attempts} = {self.resolved_rate:.1%} "
                f"[{self.resolved_low:.1%}, {self.resolved_high:.1%}] ({self.confidence:.0%} Wilson); {infra}")

    def metrics(self) -> dict[str, float]:
        """Numbers for MLflow (None rates are left out, so an evaluation short of coverage logs no rate)."""
        names = ("tasks", "attempts", "resolved", "resolved_rate", "resolved_low", "resolved_high", "infra_errors",
                 "infra_error_rate", "cheats", "cheat_rate", "mean_turns", "mean_tokens", "planned", "coverage")
        values = {name: getattr(self, name) for name in names}
        values["coverage_short"] = 0 if self.covered else 1
        for repo, rate in self.per_repo.items():
            values[f"repo.{repo}.attempts"] = rate.attempts
            values[f"repo.{repo}.resolved"] = rate.resolved
            if self.covered:
                values[f"repo.{repo}.resolved_rate"] = rate.resolved_rate
        return {name: float(value) for name, value in values.items() if value is not None}


def _checks(checks: Mapping[str, int]) -> str:
    return ", ".join(f"{name} x{count}" for name, count in sorted(checks.items())) or "none named"


def _rate(resolved: int, attempts: int, confidence: float) -> tuple[float | None, float, float]:
    low, high = wilson_interval(resolved, attempts, confidence)
    return (resolved / attempts if attempts else None), low, high


def summarize_outcomes(outcomes: Sequence[Outcome], rollout_stats: Mapping[str, tuple[int, int]] | None = None, *,
                       harness: str, policy_version: int, confidence: float = 0.95, planned: int | None = None,
                       min_coverage: float = 0.0, repos: Mapping[str, str] | None = None) -> EvalReport:
    """Infra errors are counted apart and left out of the rate: an environment failure says nothing about
    the policy. `planned`: the attempts asked for (default: one per outcome); `repos`: task id -> repository, for
    the per-repo rates."""
    kinds = {kind.value: 0 for kind in OutcomeKind}
    per_task: dict[str, dict[str, int]] = {}
    per_repo: dict[str, dict[str, int]] = {}
    infra_checks: dict[str, int] = {}
    for outcome in outcomes:
        kinds[outcome.kind.value] += 1
        task = per_task.setdefault(outcome.task_id, {"attempts": 0, "resolved": 0, "infra_errors": 0})
        repo = per_repo.setdefault((repos or {}).get(outcome.task_id, "?"),
                                   {"attempts": 0, "resolved": 0, "infra_errors": 0})
        for counts in (task, repo):
            if outcome.kind == OutcomeKind.infra_error:
                counts["infra_errors"] += 1
            else:
                counts["attempts"] += 1
                counts["resolved"] += int(outcome.kind == OutcomeKind.resolved)
        if outcome.kind == OutcomeKind.infra_error:
            check = str((outcome.evidence or {}).get("check") or "unnamed")
            infra_checks[check] = infra_checks.get(check, 0) + 1
    infra = kinds[OutcomeKind.infra_error.value]
    attempts = len(outcomes) - infra
    resolved = kinds[OutcomeKind.resolved.value]
    cheats = kinds[OutcomeKind.cheat.value]
    planned = len(outcomes) if planned is None else planned
    coverage = attempts / planned if planned else 0.0
    covered = coverage >= min_coverage
    rate, low, high = _rate(resolved, attempts, confidence)
    # (turns, tokens) of the graded attempts
    stats = rollout_stats or {}
    graded = [stats[o.rollout_id] for o in outcomes if o.kind != OutcomeKind.infra_error and o.rollout_id in stats]
    return EvalReport(
        harness=harness, policy_version=policy_version, tasks=len(per_task), attempts=attempts, resolved=resolved,
        resolved_rate=rate if covered else None, resolved_low=low if covered else None,
        resolved_high=high if covered else None,
        confidence=confidence, infra_errors=infra, infra_error_rate=infra / len(outcomes) if outcomes else 0.0,
        cheats=cheats, cheat_rate=cheats / attempts if attempts else None, kinds=kinds,
        mean_turns=sum(turns for turns, _ in graded) / len(graded) if graded else None,
        mean_tokens=sum(tokens for _, tokens in graded) / len(graded) if graded else None,
        per_task=per_task, planned=planned, coverage=coverage, min_coverage=min_coverage,
        per_repo={repo: RepoRate(**counts, **dict(zip(("resolved_rate", "resolved_low", "resolved_high"),
                                                      _rate(counts["resolved"], counts["attempts"], confidence),
                                                      strict=True)))
                  for repo, counts in sorted(per_repo.items())} if repos is not None else {},
        infra_checks=infra_checks,
    )
