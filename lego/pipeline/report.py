"""What `lego run` tells a person: one line per finished stage, and the closing summary (did the policy improve,
and on what), read from the run's manifest.

Outside every stage's import closure (lego.pipeline.keys), like progress.py: how a run reads changes no stage's
content key.
"""

from __future__ import annotations

import math
import shlex
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lego.pipeline.artifacts import StageResult
from lego.pipeline.learning import learning_curve
from lego.pipeline.manifest import RunManifest

LABEL_WIDTH = 12
RUN_LOG = "run.log"  # beside the run's manifest: everything the run logged, third-party chatter included


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes} min {rest:02d} s"


def _int(metrics: dict[str, float], name: str) -> int:
    return int(metrics.get(name, 0) or 0)


def _taskset(m: dict[str, float]) -> str:
    return f"{_int(m, 'train_tasks')} training tasks, {_int(m, 'eval_tasks')} held out"


def _warmstart(m: dict[str, float]) -> str:
    text = (f"{_int(m, 'resolved_demonstrations')}/{_int(m, 'demonstrations')} gold demonstrations resolved; "
            f"fine-tuned for {_int(m, 'steps')} steps to a loss of {m.get('final_loss', 0.0):.4f}")
    if "least_likely_demonstration_logprob" in m:
        text += f", each gold reply at probability {math.exp(m['least_likely_demonstration_logprob']):.2f} or more"
    return text


def _filter(m: dict[str, float]) -> str:
    return f"kept {_int(m, 'kept')} of {_int(m, 'tasks')} tasks"


def _evaluation(m: dict[str, float]) -> str:
    parts = []
    for prefix, split in (("train.", "training tasks"), ("", "held-out tasks")):
        if f"{prefix}attempts" in m or f"{prefix}planned" in m:
            parts.append(f"{split} {_int(m, prefix + 'resolved')}/{_int(m, prefix + 'attempts')} resolved")
    return ", ".join(parts)


def _rollout(m: dict[str, float]) -> str:
    return (f"{_int(m, 'rollouts')} rollouts, {m.get('mean_turns', 0.0):.1f} turns and "
            f"{m.get('mean_tokens', 0.0):.0f} tokens each on average")


def _verify(m: dict[str, float]) -> str:
    text = f"{_int(m, 'outcome.resolved')}/{_int(m, 'graded')} resolved"
    for kind in ("cheat", "infra_error"):
        if m.get(f"outcome.{kind}"):
            text += f", {_int(m, 'outcome.' + kind)} {kind.replace('_', ' ')}"
    return text


def _dataset(m: dict[str, float]) -> str:
    return f"{_int(m, 'in_loss')} rollouts in the loss, {_int(m, 'groups_in_loss')} groups"


def _train(m: dict[str, float]) -> str:
    if m.get("trained") and "groups" not in m:  # `train.adv_estimator: sft`: the demonstrations, no groups
        return (f"{_int(m, 'optimizer_steps')} optimizer step(s) on {_int(m, 'sequences')} demonstrations, "
                f"loss {m.get('loss', 0.0):.4f}")
    signal = f"{_int(m, 'groups_with_signal')} of {_int(m, 'groups')} groups with signal"
    if not m.get("trained"):
        return f"{signal}; no update"
    text = (f"{_int(m, 'optimizer_steps')} optimizer step(s) on {_int(m, 'sequences_trained')} of "
            f"{_int(m, 'sequences')} sequences ({signal})")
    if "logprob_change_positive" in m:
        text += f"; successes' log-prob {m['logprob_change_positive']:+.2f} nats"
    return text


STAGE_DETAILS: dict[str, Callable[[dict[str, float]], str]] = {
    "taskset": _taskset, "warmstart": _warmstart, "filter": _filter, "baseline": _evaluation,
    "evaluate": _evaluation, "rollout": _rollout, "verify": _verify, "dataset": _dataset, "train": _train}


def stage_line(result: StageResult) -> str:
    """`rollout/0    8 rollouts, 2.0 turns and 1450 tokens each on average  (52.3 s)`; a stage another machine
    computed (placed on a cluster node: pipeline.placement) says which: `(41.0 s on worker1)`."""
    detail = STAGE_DETAILS.get(result.stage, lambda _: "done")(result.metrics)
    took = "from cache" if result.cached else duration(result.seconds)
    if not result.cached and result.host and result.host != socket.gethostname():
        took += f" on {result.host}"
    return f"{result.label():<{LABEL_WIDTH}} {detail}  ({took})"


def _rate(rate: dict[str, Any]) -> str:
    return f"{rate['resolved']}/{rate['attempts']} = {rate['rate']:.0%} [{rate['low']:.0%}, {rate['high']:.0%}]"


EVALUATED_BEFORE = "an evaluation before RL"


def before_after(manifest: RunManifest) -> dict[str, Any] | None:
    """The training tasks' resolved rate of the policy RL started from and of the one it ended with.

    Before: an evaluation of the training tasks at the start (stage `baseline` with eval.splits holding `train`)
    when there is one, else the graded rollouts of iteration 0, which sample that same policy at the same
    temperature through the same harness. After: the last evaluation of the training tasks."""
    curve = learning_curve(manifest)
    points = curve["curve"]
    start = next((point for point in points if point["policy"] == 0), None)
    end = next((point for point in reversed(points) if point["policy"] > 0 and point.get("train_split_eval")), None)
    if start is None or end is None:
        return None
    if start.get("train_split_eval"):
        before, source = start["train_split_eval"], EVALUATED_BEFORE
    elif start.get("train_split"):
        before, source = start["train_split"], "the graded rollouts of RL iteration 0"
    else:
        return None
    after = end["train_split_eval"]
    train_step = start.get("train_step") or {}
    return {"before": before, "after": after, "before_source": source, "end_policy": end["policy"],
            "change": after["rate"] - before["rate"], "confidence": curve["confidence"],
            "same_attempts": before["attempts"] == after["attempts"], "train_step": train_step,
            "held_out": [point.get("eval_split") for point in (start, end)]}


def _train_summary(manifest: RunManifest) -> list[str]:
    lines = []
    for label, result in manifest.stages.items():
        if result.stage != "train":
            continue
        m = result.metrics
        text = f"{label}: {_int(m, 'groups_with_signal')} of {_int(m, 'groups')} groups had signal"
        if not m.get("trained"):
            lines.append(text + "; no update (the policy kept its version)")
            continue
        if "logprob_change_positive" in m:
            text += (f"; the update moved the successes' log-probs by {m['logprob_change_positive']:+.2f} nats "
                     f"on average")
            if "logprob_change_likeliest_positive" in m:
                text += f" (each group's likeliest success: {m['logprob_change_likeliest_positive']:+.2f})"
        if "logprob_change_negative" in m:
            text += f", the failures' by {m['logprob_change_negative']:+.2f}"
        lines.append(text)
    return lines


def learning_lines(manifest: RunManifest, config: dict[str, Any]) -> list[str]:
    """Did the policy improve, on which tasks, with how many attempts; what the updates did."""
    found = before_after(manifest)
    lines = []
    if found is None:
        lines.append("no before/after comparison: this run did not evaluate the training tasks after RL "
                     "(eval.splits must hold train)")
    else:
        before, after = found["before"], found["after"]
        taskset = manifest.stages.get("taskset")
        count = _int(taskset.metrics, "train_tasks") if taskset is not None else 0
        temperature = (config.get("eval") or {}).get("temperature") or (config.get("sampling") or {}).get(
            "temperature")
        attempts = (f"{before['attempts']} attempts each" if found["same_attempts"]
                    else f"{before['attempts']} attempts before, {after['attempts']} after: not the same number")
        if found["same_attempts"] and found["before_source"] == EVALUATED_BEFORE:
            attempts += ", paired: each draws the random numbers of its counterpart"
        iterations = found["end_policy"]
        lines += [f"resolved rate on the {count} training tasks ({attempts}, temperature {temperature}, "
                  f"{int(found['confidence'] * 100)}% Wilson intervals):",
                  f"  before RL  {_rate(before)}  the policy RL started from ({found['before_source']})",
                  f"  after RL   {_rate(after)}  the policy after {iterations} RL iteration"
                  f"{'s' if iterations != 1 else ''} (an evaluation)",
                  f"  change     {found['change'] * 100:+.0f} points"]
        held_before, held_after = found["held_out"]
        if held_after:
            lines.append(f"held-out tasks, never trained on: {_rate(held_before) if held_before else 'not evaluated'}"
                         f" before RL, {_rate(held_after)} after")
    return lines + _train_summary(manifest)


def next_commands(work_root: Path, run_id: str, cli_args: list[str], mlflow_uri: str) -> list[str]:
    """The commands to look further, each with what it shows and where; `cli_args` (the run's config and work
    dir overrides) are repeated so that each command opens this run's work dir."""
    suffix = "".join(" " + shlex.quote(arg) for arg in cli_args)
    rows = [
        (f"lego ui{suffix}", "the dashboard of this run, at http://127.0.0.1:8050"),
        (f"lego status{suffix}", "a diagnosis of this run"),
        (f"lego server{suffix}", f"the MLflow UI at http://127.0.0.1:5000 (its store: {mlflow_uri}) and Prefect's "
                                 "at http://127.0.0.1:4200"),
        (f"lego data show{suffix}", f"the rollouts, tokens and outcomes stored in {work_root / 'data'}"),
    ]
    width = max(len(command) for command, _ in rows)
    lines = [f"  {command:<{width}}  {what}" for command, what in rows]
    lines.append(f"  {'':<{width}}  this run's files: {work_root / 'runs' / run_id} (manifest.json; {RUN_LOG}, the "
                 "full log)")
    return lines
