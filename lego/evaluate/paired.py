"""Statistics for a before/after comparison read task by task.

Kept apart from `stats` (which the evaluate stage runs) so that the learning report's statistics do not enter the
evaluate stage's cache key."""

from __future__ import annotations

import math
import statistics

from lego.evaluate.stats import z_for


def mean_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A normal interval for the mean of `values`, each one observation (the standard error from their sample
    variance); the point itself when they do not vary. Needs two values or more."""
    if len(values) < 2:
        raise ValueError(f"need two values or more for an interval of their mean, got {len(values)}")
    mean = statistics.fmean(values)
    spread = z_for(confidence) * statistics.stdev(values) / math.sqrt(len(values))
    return mean - spread, mean + spread


def sign_test_p(up: int, down: int) -> float:
    """The two-sided exact sign test: how likely `up` against `down` (or a split as uneven) is when each is equally
    likely; 1.0 when nothing changed."""
    if up < 0 or down < 0:
        raise ValueError(f"need counts of 0 or more, got {up} and {down}")
    total = up + down
    if total == 0:
        return 1.0
    tail = sum(math.comb(total, k) for k in range(min(up, down) + 1)) / 2**total
    return min(1.0, 2 * tail)
