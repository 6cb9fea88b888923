"""Per-step series of a stage for MLflow: the train stage's optimizer steps and the warm start's SFT steps.

They are read back from the stage's artifact (the train stage's metrics.json `steps`, the warm start's
sft_steps.json), never from the stage's return value, so a result served from cache draws the same curves. Each
series goes to the stage's own run as `step.<name>` (its unprefixed names are the stage's per-iteration summary)
and to the pipeline's run as `<stage>.<name>`, at the step the trainer numbered: the policy's cumulative optimizer
step count, which goes on across iterations and resumptions (lego.train.trainer.OptimizerStep).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

from lego.errors import LegoError

# stage -> (the output holding its steps, the key of the list in that JSON file; None: the file is the list)
STEP_SOURCES: dict[str, tuple[str, str | None]] = {"train": ("train_metrics", "steps"),
                                                   "warmstart": ("sft_steps", None)}
STAGE_RUN_PREFIX = "step."


class StepSeriesError(LegoError):
    """A stage artifact's per-step file cannot be read."""


def stage_steps(stage: str, outputs: Mapping[str, str]) -> list[tuple[int, dict[str, float]]]:
    """(step, metrics) of each step the stage recorded, in order; empty for a stage without steps or an artifact
    written before steps were kept. An entry without its own `step` is numbered by position from 1."""
    source = STEP_SOURCES.get(stage)
    if source is None or source[0] not in outputs:
        return []
    path = Path(outputs[source[0]])
    try:
        data = json.loads(path.read_text())
        entries = data if source[1] is None else data.get(source[1], [])
        series = []
        for index, entry in enumerate(entries):
            step = int(entry["step"]) if "step" in entry else index + 1
            metrics = {name: float(value) for name, value in entry.items()
                       if name != "step" and isinstance(value, int | float) and not isinstance(value, bool)
                       and math.isfinite(float(value))}
            series.append((step, metrics))
    except (OSError, ValueError, TypeError, AttributeError, KeyError) as exc:
        raise StepSeriesError(f"cannot read the {stage} stage's steps from {path} ({type(exc).__name__}: {exc}); "
                              f"the artifact is damaged: rerun the stage with `lego stage {stage} --force`") from None
    return series


def log_stage_steps(tracker, stage: str, outputs: Mapping[str, str], *, stage_run: str, pipeline_run: str) -> set[str]:
    """Log the stage's per-step series (see the module docstring); returns the metric names logged, which the
    pipeline run then leaves out of the stage's per-iteration values (one name, one axis)."""
    series = stage_steps(stage, outputs)
    if not series:
        return set()
    tracker.log_metric_steps(stage_run, [(step, {f"{STAGE_RUN_PREFIX}{name}": value for name, value in metrics.items()})
                                         for step, metrics in series])
    tracker.log_metric_steps(pipeline_run, [(step, {f"{stage}.{name}": value for name, value in metrics.items()})
                                            for step, metrics in series])
    return {name for _, metrics in series for name in metrics}
