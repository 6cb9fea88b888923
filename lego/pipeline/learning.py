"""The learning curve of one pipeline run, read from its manifest: does RL raise the resolved rate?

Per policy (the warm start's, then the one after each RL iteration):
- the train split's resolved rate: the rollout stage's own graded samples at that policy (`verify/i` grades the
  rollouts iteration i sampled from policy i), and the `train.` metrics of an evaluation of that policy;
- the eval split's resolved rate (`baseline` for the starting policy, `evaluate/i` after iteration i);
- each with its attempt count and Wilson interval; GRPO groups with reward variance (signal) per iteration; the
  train step's metrics; infra and cheat rates; the wall time of each stage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lego.evaluate.stats import wilson_interval
from lego.pipeline.manifest import RunManifest


def _rate(resolved: float | None, attempts: float | None, confidence: float) -> dict[str, Any] | None:
    if resolved is None or not attempts:
        return None
    low, high = wilson_interval(int(resolved), int(attempts), confidence)
    return {"resolved": int(resolved), "attempts": int(attempts), "rate": resolved / attempts,
            "low": low, "high": high}


def _eval_rate(metrics: dict[str, float], prefix: str, confidence: float) -> dict[str, Any] | None:
    # an evaluation's `attempts` are its graded attempts: infra failures are already left out
    return _rate(metrics.get(f"{prefix}resolved"), metrics.get(f"{prefix}attempts"), confidence)


def learning_curve(manifest: RunManifest, confidence: float = 0.95) -> dict[str, Any]:
    """One entry per policy: `policy` 0 is the one RL starts from, `policy` i+1 the one after iteration i."""
    points: dict[int, dict[str, Any]] = {}

    def point(index: int) -> dict[str, Any]:
        return points.setdefault(index, {"policy": index})

    if (baseline := manifest.stages.get("baseline")) is not None:
        point(0)["eval_split"] = _eval_rate(baseline.metrics, "", confidence)
        point(0)["train_split_eval"] = _eval_rate(baseline.metrics, "train.", confidence)
    if (warm := manifest.stages.get("warmstart")) is not None:
        point(0)["warmstart"] = {name: warm.metrics.get(name) for name in
                                 ("resolved_demonstrations", "demonstrations", "steps", "final_loss",
                                  "final_token_accuracy")}
    for result in manifest.stages.values():
        index = result.iteration or 0
        if result.stage == "verify":
            graded = result.metrics.get("graded", 0)
            entry = point(index)
            entry["train_split"] = _rate(result.metrics.get("outcome.resolved"), graded, confidence)
            entry["infra_error_rate"] = result.metrics.get("infra_error_rate")
            entry["cheat_rate"] = result.metrics.get("cheat_rate")
        elif result.stage == "dataset":
            groups = result.metrics.get("groups_in_loss", 0)
            point(index)["groups"] = {"in_loss": int(groups),
                                      "with_signal": int(result.metrics.get("groups_with_signal", 0)),
                                      "nonzero_advantages": int(result.metrics.get("nonzero_advantages", 0))}
        elif result.stage == "train":
            point(index)["train_step"] = {name: value for name, value in result.metrics.items()
                                          if name in ("loss", "entropy", "kl_to_inference", "logprob_pearson",
                                                      "grad_norm", "sequences", "sequences_trained",
                                                      "optimizer_steps", "groups_with_signal", "seconds",
                                                      "clip_fraction", "learning_rate", "logprob_change_positive",
                                                      "logprob_change_negative",
                                                      "logprob_change_likeliest_positive")}
        elif result.stage == "evaluate":
            entry = point(index + 1)
            entry["eval_split"] = _eval_rate(result.metrics, "", confidence)
            entry["train_split_eval"] = _eval_rate(result.metrics, "train.", confidence)
    seconds: dict[str, float] = {}
    for result in manifest.stages.values():
        seconds[result.stage] = round(seconds.get(result.stage, 0.0) + (0.0 if result.cached else result.seconds), 1)
    curve = [points[index] for index in sorted(points)]
    return {"run_id": manifest.run_id, "confidence": confidence, "curve": curve, "verdict": _verdict(curve),
            "stage_seconds": seconds}


def plot_learning_curve(curve: dict[str, Any], path: str | Path) -> Path:
    """Resolved rate per policy with its interval: the train split (RL's own samples) and the eval split."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for key, label, marker in (("train_split", "train split (RL rollouts)", "o"),
                               ("train_split_eval", "train split (evaluation)", "s"),
                               ("eval_split", "eval split (held out)", "^")):
        xs, ys, lows, highs = [], [], [], []
        for entry in curve["curve"]:
            rate = entry.get(key)
            if rate:
                xs.append(entry["policy"])
                ys.append(rate["rate"])
                lows.append(rate["rate"] - rate["low"])
                highs.append(rate["high"] - rate["rate"])
        if xs:
            axis.errorbar(xs, ys, yerr=[lows, highs], marker=marker, capsize=4, label=label)
    axis.set_xlabel("policy (0: after the warm start; i: after RL iteration i)")
    axis.set_ylabel("resolved rate")
    axis.set_ylim(-0.02, 1.02)
    axis.set_title(f"learning curve of run {curve['run_id']} ({int(curve['confidence'] * 100)}% Wilson intervals)")
    axis.grid(alpha=0.3)
    axis.legend(loc="best", fontsize=8)
    figure.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return out


def _verdict(curve: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Did RL raise the train-split resolved rate? The last evaluated policy against the one RL started from, both
    measured the same way (an evaluation of the train split; the RL rollouts in between sample other policies and
    may differ in protocol): `above_start_interval` when the last rate lies above the start's interval,
    `intervals_apart` when the two intervals do not overlap."""
    measured = [entry for entry in curve if entry.get("train_split_eval")]
    if len(measured) < 2 or measured[0]["policy"] != 0:
        return None
    start, end = measured[0]["train_split_eval"], measured[-1]["train_split_eval"]
    return {"start_policy": 0, "end_policy": measured[-1]["policy"], "start": start, "end": end,
            "rise": end["rate"] - start["rate"], "above_start_interval": end["rate"] > start["high"],
            "intervals_apart": end["low"] > start["high"]}
