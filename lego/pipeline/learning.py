"""The learning curve of one pipeline run, read from its manifest: does RL raise the resolved rate?

Per policy (the warm start's, then the one after each RL iteration):
- the train split's resolved rate: the rollout stage's own graded samples at that policy (`verify/i` grades the
  rollouts iteration i sampled from policy i), and the `train.` metrics of an evaluation of that policy;
- the eval split's resolved rate (`baseline` for the starting policy, `evaluate/i` after iteration i);
- each with its attempt count and Wilson interval; GRPO groups with reward variance (signal) per iteration; the
  train step's metrics; infra and cheat rates; the wall time of each stage, in this run (`stage_seconds`) and as
  computed, cache or not (`computed_seconds`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lego.evaluate.paired import mean_interval, sign_test_p
from lego.evaluate.stats import wilson_interval
from lego.pipeline.artifacts import StageResult
from lego.pipeline.manifest import RunManifest


def task_clustered_interval(per_task: Sequence[tuple[int, int]], confidence: float = 0.95) -> tuple[float, float]:
    """An interval for the pooled rate sum(resolved) / sum(attempts) of several attempts per task.

    Attempts at one task share its difficulty: a task is solved in nearly all of them or in none, so they are not
    independent trials and Wilson's interval over attempts is too narrow. This is Wilson's interval over the
    effective number of attempts: the attempts divided by the design effect (the cluster-robust variance of the
    rate, each task one observation, over the binomial variance). It is never narrower than Wilson's over the
    attempts; when every task has the same rate (all 0, say) there is no spread to measure and each task counts
    once. Fewer than two tasks say nothing beyond themselves: (0, 1).
    """
    tasks = [(resolved, attempts) for resolved, attempts in per_task if attempts > 0]
    if any(not 0 <= resolved <= attempts for resolved, attempts in tasks):
        raise ValueError(f"need 0 <= resolved <= attempts for every task, got {per_task}")
    if len(tasks) < 2:
        return 0.0, 1.0
    attempts = sum(count for _, count in tasks)
    rate = sum(count for count, _ in tasks) / attempts
    if 0 < rate < 1:
        clustered = len(tasks) / (len(tasks) - 1) * sum((count - rate * tried) ** 2 for count, tried in tasks)
        design_effect = clustered / attempts**2 / (rate * (1 - rate) / attempts)
        effective = attempts / max(design_effect, 1.0)
    else:
        effective = len(tasks)
    # Wilson's formula holds for a fractional count of trials
    return wilson_interval(rate * effective, effective, confidence)

def _rate(resolved: float | None, attempts: float | None, confidence: float) -> dict[str, Any] | None:
    if resolved is None or not attempts:
        return None
    low, high = wilson_interval(int(resolved), int(attempts), confidence)
    return {"resolved": int(resolved), "attempts": int(attempts), "rate": resolved / attempts,
            "low": low, "high": high}


def _per_task(path: Path) -> dict[str, list[int]] | None:
    """[resolved, attempts] by task id from an evaluation's outcomes file (infra failures left out, as in its
    report); None when the file is missing or unreadable."""
    try:
        rows = json.loads(path.read_text())
        counts: dict[str, list[int]] = {}
        for row in rows:
            if row["kind"] != "infra_error":
                count = counts.setdefault(row["task_id"], [0, 0])
                count[0] += row["kind"] == "resolved"
                count[1] += 1
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return {task: counts[task] for task in sorted(counts)}


def rate_with_tasks(rate: dict[str, Any] | None, per_task: list[list[int]] | None,
                    confidence: float, task_ids: list[str] | None = None) -> dict[str, Any] | None:
    """`rate` plus its tasks: how many were attempted and solved at least once, and the interval with each task as
    one observation (`task_low`, `task_high`), the one to read a change against when attempts repeat tasks.
    `task_ids` (aligned with `per_task`) let two rates of the same tasks be compared task by task (`paired_change`)."""
    if rate is None or not per_task or sum(attempts for _, attempts in per_task) != rate["attempts"]:
        return rate
    low, high = task_clustered_interval([(resolved, attempts) for resolved, attempts in per_task], confidence)
    ids = {"task_ids": list(task_ids)} if task_ids is not None and len(task_ids) == len(per_task) else {}
    return {**rate, "tasks": len(per_task), "tasks_solved": sum(1 for resolved, _ in per_task if resolved),
            "task_low": low, "task_high": high, "per_task": per_task, **ids}


def rate_by_task(rate: dict[str, Any] | None, by_task: dict[str, list[int]] | None,
                 confidence: float) -> dict[str, Any] | None:
    """`rate_with_tasks` from [resolved, attempts] by task id; tasks with no graded attempt left out."""
    counted = {task: count for task, count in (by_task or {}).items() if count[1] > 0}
    return rate_with_tasks(rate, list(counted.values()) or None, confidence, list(counted))


def paired_change(before: dict[str, Any], after: dict[str, Any], confidence: float = 0.95) -> dict[str, Any] | None:
    """The change from `before` to `after` measured task by task, on the tasks both evaluated.

    Both rates share their tasks, and a task's difficulty is most of what decides it: comparing each task with
    itself removes that shared part, which the interval of either rate alone still holds. `rise` is the mean over
    tasks of (rate after - rate before), with a normal interval over tasks as observations (`low`, `high`); `up`
    and `down` count the tasks whose rate rose or fell, and `sign_p` is the two-sided sign test's p-value over
    them. None without task ids on both sides or with fewer than two shared tasks.
    """
    if "task_ids" not in before or "task_ids" not in after:
        return None
    rates_before = {task: resolved / attempts for task, (resolved, attempts)
                    in zip(before["task_ids"], before["per_task"], strict=True)}
    rates_after = {task: resolved / attempts for task, (resolved, attempts)
                   in zip(after["task_ids"], after["per_task"], strict=True)}
    shared = sorted(set(rates_before) & set(rates_after))
    if len(shared) < 2:
        return None
    changes = [rates_after[task] - rates_before[task] for task in shared]
    low, high = mean_interval(changes, confidence)
    up, down = sum(1 for change in changes if change > 0), sum(1 for change in changes if change < 0)
    return {"tasks": len(shared), "rise": sum(changes) / len(changes), "low": low, "high": high, "up": up,
            "down": down, "sign_p": sign_test_p(up, down)}


def _eval_rate(result: StageResult, split: str, confidence: float) -> dict[str, Any] | None:
    # an evaluation's `attempts` are its graded attempts: infra failures are already left out
    prefix, suffix = ("", "") if split == "eval" else (f"{split}.", f"-{split}")
    rate = _rate(result.metrics.get(f"{prefix}resolved"), result.metrics.get(f"{prefix}attempts"), confidence)
    outcomes = result.outputs.get(f"eval_outcomes{suffix}") or str(result.dir / f"outcomes{suffix}.json")
    return rate_by_task(rate, _per_task(Path(outcomes)), confidence)


def learning_curve(manifest: RunManifest, confidence: float = 0.95) -> dict[str, Any]:
    """One entry per policy: `policy` 0 is the one RL starts from, `policy` i+1 the one after iteration i."""
    points: dict[int, dict[str, Any]] = {}

    def point(index: int) -> dict[str, Any]:
        return points.setdefault(index, {"policy": index})

    if (baseline := manifest.stages.get("baseline")) is not None:
        point(0)["eval_split"] = _eval_rate(baseline, "eval", confidence)
        point(0)["train_split_eval"] = _eval_rate(baseline, "train", confidence)
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
            entry["eval_split"] = _eval_rate(result, "eval", confidence)
            entry["train_split_eval"] = _eval_rate(result, "train", confidence)
    seconds: dict[str, float] = {}
    computed: dict[str, float] = {}
    for result in manifest.stages.values():
        seconds[result.stage] = round(seconds.get(result.stage, 0.0) + (0.0 if result.cached else result.seconds), 1)
        # a stage served from cache keeps the seconds it took when computed: what the run costs from scratch
        computed[result.stage] = round(computed.get(result.stage, 0.0) + result.seconds, 1)
    curve = [points[index] for index in sorted(points)]
    # each stage's key beside its computed seconds: runs that share a key (a seed's arms) computed that stage once
    stages = {label: {"key": result.key, "seconds": round(result.seconds, 1)}
              for label, result in manifest.stages.items()}
    return {"run_id": manifest.run_id, "confidence": confidence, "curve": curve, "verdict": _verdict(curve),
            "stage_seconds": seconds, "computed_seconds": computed, "stages": stages}


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
    return _save(figure, path)


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


# ------------------------------------------------------------------------------ `lego bench learn`'s arms and seeds

SPLITS = ("train", "eval")
PHASES = ("before", "after")


def before_after(curve: dict[str, Any]) -> dict[str, dict[str, dict[str, Any] | None]]:
    """Per phase and split, the resolved rate of an evaluation: `before` is the policy RL starts from (the warm
    start's, the `baseline` stage), `after` the last evaluated policy. The train split's figures are evaluations of
    the training tasks (`train_split_eval`), not RL's own rollouts, so that before and after are measured alike."""
    keys = {"train": "train_split_eval", "eval": "eval_split"}
    points = curve["curve"]
    start = next((entry for entry in points if entry["policy"] == 0), {})
    later = [entry for entry in points if entry["policy"] > 0]
    result: dict[str, dict[str, dict[str, Any] | None]] = {"before": {}, "after": {}}
    for split, key in keys.items():
        result["before"][split] = start.get(key)
        measured = [entry for entry in later if entry.get(key)]
        result["after"][split] = measured[-1][key] if measured else None
    return result


def rate_of(resolved: int, attempts: int, confidence: float = 0.95) -> dict[str, Any] | None:
    """A resolved count as the bench reports it: count, attempts, rate and its Wilson interval."""
    return _rate(resolved, attempts, confidence)


def bench_table(runs: list[dict[str, Any]], warmstarts: list[dict[str, Any]],
                confidence: float = 0.95) -> list[dict[str, Any]]:
    """One row per arm x seed x split x phase (`runs`: each with arm, seed and `rates` as `before_after` gives),
    then one per seed x split for the warm start at greedy decoding (arm `warmstart-greedy`, phase `before`), then
    per arm whose last policy was evaluated at greedy decoding (`greedy_after`) the arm `ARM greedy`: before is the
    seed's warm start at greedy decoding, after is that policy; then the seeds pooled (seed `all`: the counts
    summed, the interval over them). Rows come grouped by arm (in the order the arms first appear), seeds in
    ascending order within each, whatever order the runs finished in."""
    rows: list[dict[str, Any]] = []
    arm_order = {arm: index for index, arm in enumerate(dict.fromkeys(run["arm"] for run in runs))}
    runs = sorted(runs, key=lambda run: (arm_order[run["arm"]], _seed_order(run["seed"])))
    warmstarts = sorted(warmstarts, key=lambda warm: _seed_order(warm["seed"]))

    def add(arm: str, seed: int | str, split: str, phase: str, rate: dict[str, Any] | None) -> None:
        if rate:
            rows.append({"arm": arm, "seed": seed, "split": split, "phase": phase,
                         **{name: rate[name] for name in ("resolved", "attempts", "rate", "low", "high", "tasks",
                                                          "tasks_solved", "task_low", "task_high", "per_task",
                                                          "task_ids")
                            if name in rate}})

    for run in runs:
        for phase in PHASES:
            for split in SPLITS:
                add(run["arm"], run["seed"], split, phase, (run.get("rates") or {}).get(phase, {}).get(split))
    for warm in warmstarts:
        for split in SPLITS:
            add("warmstart-greedy", warm["seed"], split, "before", (warm.get("greedy") or {}).get(split))
    greedy_before = {warm["seed"]: warm.get("greedy") or {} for warm in warmstarts}
    for run in runs:
        for split, after in (run.get("greedy_after") or {}).items():
            if after and greedy_before.get(run["seed"], {}).get(split):
                add(f"{run['arm']} greedy", run["seed"], split, "before", greedy_before[run["seed"]][split])
                add(f"{run['arm']} greedy", run["seed"], split, "after", after)
    pooled: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in rows:
        pooled.setdefault((row["arm"], row["split"], row["phase"]), []).append(row)
    for (arm, split, phase), seeds in pooled.items():
        if len(seeds) > 1:
            rate = _rate(sum(row["resolved"] for row in seeds), sum(row["attempts"] for row in seeds), confidence)
            # each seed's tasks are observations of their own: a seed's policy differs
            per_task = [count for row in seeds for count in row.get("per_task", [])] \
                if all("per_task" in row for row in seeds) else None
            task_ids = [f"{row['seed']}/{task}" for row in seeds for task in row.get("task_ids", [])] \
                if all("task_ids" in row for row in seeds) else None
            add(arm, "all", split, phase, rate_with_tasks(rate, per_task, confidence, task_ids))
    return rows


def _seed_order(seed: int | str) -> tuple[int, int | str]:
    return (0, seed) if isinstance(seed, int) else (1, str(seed))


def seed_rises(rows: list[dict[str, Any]], confidence: float = 0.95) -> list[dict[str, Any]]:
    """Per arm and split: in how many seeds the rate after RL lies above the interval of the rate before it, by
    task (attempts at one task are not independent: the interval to read a change against) and per attempt. The
    issue's bar for learning is the held-out split's rise beyond the warm start's interval in most seeds.
    Beside it, the paired reading (`paired_change`): each task after against itself before, and in how many seeds
    that interval lies above zero."""
    found: dict[tuple[str, str], list[dict[str, Any]]] = {}
    by_key = {(row["arm"], row["seed"], row["split"], row["phase"]): row for row in rows if row["seed"] != "all"}
    for (arm, seed, split, phase), after in by_key.items():
        before = by_key.get((arm, seed, split, "before"))
        if phase != "after" or before is None:
            continue
        found.setdefault((arm, split), []).append({
            "seed": seed, "before": before["rate"], "after": after["rate"], "rise": after["rate"] - before["rate"],
            "above_per_attempt": after["rate"] > before["high"],
            "above_by_task": after["rate"] > before["task_high"] if "task_high" in before else None,
            "paired": paired_change(before, after, confidence)})
    return [{"arm": arm, "split": split, "seeds": len(seeds),
             "above_by_task": sum(1 for seed in seeds if seed["above_by_task"]),
             "by_task_known": sum(1 for seed in seeds if seed["above_by_task"] is not None),
             "paired_above_zero": sum(1 for seed in seeds if seed["paired"] and seed["paired"]["low"] > 0),
             "paired_known": sum(1 for seed in seeds if seed["paired"]),
             "above_per_attempt": sum(1 for seed in seeds if seed["above_per_attempt"]), "per_seed": seeds}
            for (arm, split), seeds in found.items()]


GREEDY_SUFFIX = " greedy"  # bench_table's rows of an arm's last policy at greedy decoding: "ARM greedy"


def arm_contrasts(rows: list[dict[str, Any]], confidence: float = 0.95) -> list[dict[str, Any]]:
    """The last arm listed against each other arm, after RL, task by task on the same tasks of the same seed
    (`paired_change` from the other arm to it): does the method beat its baselines, or only its own start? Per split
    and seed, the seeds pooled (`all`: each seed's tasks as units of their own), and at greedy decoding the same
    between the arms' `ARM greedy` rows."""
    after = {(row["arm"], row["seed"], row["split"]): row for row in rows if row["phase"] == "after"}
    arms = [arm for arm in dict.fromkeys(row["arm"] for row in rows if row["phase"] == "after")
            if not arm.endswith(GREEDY_SUFFIX)]
    if len(arms) < 2:
        return []
    reference = arms[-1]
    contrasts = []
    for suffix in ("", GREEDY_SUFFIX):
        others = {other + suffix for other in arms[:-1]}
        for (arm, seed, split), theirs in after.items():
            ours = after.get((reference + suffix, seed, split))
            change = paired_change(theirs, ours, confidence) if arm in others and ours else None
            if change:
                contrasts.append({"arm": reference + suffix, "against": arm, "seed": seed, "split": split, **change})
    return contrasts


def format_contrasts(contrasts: list[dict[str, Any]]) -> str:
    """`arm_contrasts` as one line per compared arm and split, its seeds side by side."""
    lines: dict[tuple[str, str, str], list[str]] = {}
    for contrast in sorted(contrasts, key=lambda item: _seed_order(item["seed"])):
        lines.setdefault((contrast["arm"], contrast["against"], contrast["split"]), []).append(
            f"seed {contrast['seed']} {contrast['rise']:+.3f} [{contrast['low']:+.3f}, {contrast['high']:+.3f}], "
            f"{contrast['up']} tasks up, {contrast['down']} down")
    split_names = {"train": "training tasks", "eval": "held-out tasks"}
    return "\n".join(f"{arm} against {against} after RL, {split_names.get(split, split)}, task by task: "
                     + "; ".join(seeds) for (arm, against, split), seeds in lines.items())


def format_rises(rises: list[dict[str, Any]]) -> str:
    """`seed_rises` as one line per arm and split."""
    lines = []
    for rise in rises:
        by_task = (f"{rise['above_by_task']} of {rise['seeds']} seeds" if rise["by_task_known"] == rise["seeds"]
                   else f"{rise['above_by_task']} of the {rise['by_task_known']} seeds with outcomes by task")
        lines.append(f"{rise['arm']} {rise['split']}: after RL above the interval before it by task in {by_task}, "
                     f"per attempt in {rise['above_per_attempt']} of {rise['seeds']} (rises "
                     + ", ".join(f"{seed['rise']:+.3f}" for seed in rise["per_seed"]) + ")")
        if rise.get("paired_known"):
            lines.append(f"{rise['arm']} {rise['split']}: task by task, the rise's interval above zero in "
                         f"{rise['paired_above_zero']} of {rise['paired_known']} seeds ("
                         + ", ".join(f"{paired['rise']:+.3f} [{paired['low']:+.3f}, {paired['high']:+.3f}], "
                                     f"{paired['up']} tasks up, {paired['down']} down"
                                     for seed in rise["per_seed"] if (paired := seed["paired"])) + ")")
    return "\n".join(lines)


# Computed once per seed and served from the cache to every arm of it: not an arm's own time.
SHARED_STAGES = ("taskset", "warmstart", "filter", "baseline")


def arm_seconds(computed_seconds: dict[str, float]) -> float:
    """What one arm of one seed computes on its own (its iterations and its evaluations), from its stages'
    computed seconds: the same whether this run computed a stage or found it in the cache."""
    return round(sum(seconds for stage, seconds in computed_seconds.items() if stage not in SHARED_STAGES), 1)


def arm_times(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per arm and seed: `alone`, what the arm computes after its seed's warm start (arm_seconds); `beside`, what it
    adds to the other arms of its seed, less the stages it shares with one of them (the same key: iteration 0's
    rollouts and their grading, sampled from the warm start by every arm that trains on rollouts); `shared`, those
    stages' labels."""
    timed = [run for run in runs if run.get("computed_seconds")]
    times = []
    for run in timed:
        others = {info["key"] for other in timed if other is not run and other["seed"] == run["seed"]
                  for info in (other.get("stages") or {}).values()}
        shared = sorted(label for label, info in (run.get("stages") or {}).items()
                        if label not in SHARED_STAGES and info["key"] in others)
        alone = arm_seconds(run["computed_seconds"])
        beside = round(alone - sum(run["stages"][label]["seconds"] for label in shared), 1)
        times.append({"arm": run["arm"], "seed": run["seed"], "alone": alone, "beside": beside, "shared": shared})
    return times


def format_times(runs: list[dict[str, Any]]) -> str:
    """Per arm, each seed's arm time, alone and beside the seed's other arms; per seed, the shared stages every arm
    of it starts from."""
    timed = [run for run in runs if run.get("computed_seconds")]
    if not timed:
        return ""
    times = arm_times(timed)
    lines = ["time as computed (each stage's own seconds, whether this bench computed it or found it in the cache):"]
    for arm in dict.fromkeys(run["arm"] for run in timed):
        seeds = sorted((time for time in times if time["arm"] == arm), key=lambda time: _seed_order(time["seed"]))
        parts = []
        for time in seeds:
            part = f"seed {time['seed']} {time['alone'] / 60:.1f} min"
            if time["shared"]:
                part += f" ({time['beside'] / 60:.1f} min beside its seed's other arms, {', '.join(time['shared'])} " \
                        "shared)"
            parts.append(part)
        longest = max(time["alone"] for time in seeds) / 60
        lines.append(f"{arm}: " + ", ".join(parts)
                     + f" (the longest {longest:.1f} min; its iterations and evaluations, the shared stages apart)")
    for seed in sorted(dict.fromkeys(run["seed"] for run in timed), key=_seed_order):
        shared = next(run["computed_seconds"] for run in timed if run["seed"] == seed)
        if stages := [f"{stage} {shared[stage] / 60:.1f} min" for stage in SHARED_STAGES if shared.get(stage)]:
            lines.append(f"seed {seed}, shared by its arms: " + ", ".join(stages))
    return "\n".join(lines)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The table as text, one line per row, for a terminal or a note."""
    header = (f"{'arm':<20}{'seed':>5}  {'split':<6}{'phase':<8}{'resolved':>12}{'rate':>8}  {'interval':<16}"
              f"{'tasks solved':>13}  by task")
    lines = [header, "-" * len(header)]
    for row in rows:
        tasks = (f"{row['tasks_solved']:>6}/{row['tasks']:<6}  [{row['task_low']:.3f}, {row['task_high']:.3f}]"
                 if "tasks" in row else f"{'-':>7}")
        lines.append(f"{row['arm']:<20}{row['seed']!s:>5}  {row['split']:<6}{row['phase']:<8}"
                     f"{row['resolved']:>6}/{row['attempts']:<5}{row['rate']:>8.3f}  "
                     f"[{row['low']:.3f}, {row['high']:.3f}]  {tasks}")
    return "\n".join(lines)


SPLIT_NAMES = {"train": "training tasks", "eval": "held-out tasks"}


def format_markdown(rows: list[dict[str, Any]], confidence: float = 0.95) -> str:
    """The table as Markdown, one line per arm x split x seed: the rate before and after with its interval (by task
    where the row has one), the after in bold where it lies above that interval of the before, and the change task
    by task (`paired_change`). What the README and a closing note show."""
    def cell(row: dict[str, Any] | None, bold: bool = False) -> str:
        if row is None:
            return "-"
        low, high = (row["task_low"], row["task_high"]) if "task_low" in row else (row["low"], row["high"])
        figure = f"{row['resolved']}/{row['attempts']}, {row['rate']:.3f}"
        return f"**{figure}** [{low:.3f}, {high:.3f}]" if bold else f"{figure} [{low:.3f}, {high:.3f}]"

    by_key = {(row["arm"], row["seed"], row["split"], row["phase"]): row for row in rows}
    lines = [f"| arm | split | seed | before | after | change, task by task ({int(confidence * 100)}% interval) |",
             "|---|---|---|---|---|---|"]
    for arm, seed, split in dict.fromkeys((row["arm"], row["seed"], row["split"]) for row in rows):
        before, after = by_key.get((arm, seed, split, "before")), by_key.get((arm, seed, split, "after"))
        above = bool(before and after and after["rate"] > before.get("task_high", before["high"]))
        change = paired_change(before, after, confidence) if before and after and seed != "all" else None
        paired = (f"{change['rise']:+.3f} [{change['low']:+.3f}, {change['high']:+.3f}], {change['up']} up, "
                  f"{change['down']} down" if change else "-")
        lines.append(f"| {arm} | {SPLIT_NAMES.get(split, split)} | {seed} | {cell(before)} | {cell(after, above)} "
                     f"| {paired} |")
    return "\n".join(lines)


def format_summary(rows: list[dict[str, Any]], split: str = "eval") -> str:
    """One split at a glance, as Markdown: a line per arm, a column per seed (and the seeds pooled), each cell the
    resolved attempts before -> after RL, the after in bold where it lies above the before's interval (by task
    where the row has one); the last column counts the seeds where it does. What the README shows; the full table
    is `format_markdown`'s."""
    by_key = {(row["arm"], row["seed"], row["split"], row["phase"]): row for row in rows if row["split"] == split}
    seeds = sorted({seed for _, seed, _, _ in by_key}, key=_seed_order)
    arms = [arm for arm in dict.fromkeys(arm for arm, _, _, _ in by_key)
            if any((arm, seed, split, "after") in by_key for seed in seeds)]

    def cell(arm: str, seed: int | str) -> tuple[str, bool | None]:
        before, after = by_key.get((arm, seed, split, "before")), by_key.get((arm, seed, split, "after"))
        if before is None or after is None:
            return "-", None
        above = after["rate"] > before.get("task_high", before["high"])
        figure = f"{after['resolved']}/{after['attempts']}"
        return f"{before['resolved']} -> {f'**{figure}**' if above else figure}", above

    lines = ["| arm | " + " | ".join(f"seed {seed}" if seed != "all" else "seeds pooled" for seed in seeds)
             + " | above the interval |", "|---" * (len(seeds) + 2) + "|"]
    for arm in arms:
        cells = {seed: cell(arm, seed) for seed in seeds}
        verdicts = [above for seed, (_, above) in cells.items() if seed != "all" and above is not None]
        lines.append(f"| {arm} | " + " | ".join(text for text, _ in cells.values())
                     + f" | {sum(verdicts)} of {len(verdicts)} seeds |")
    return "\n".join(lines)


def plot_bench(rows: list[dict[str, Any]], path: str | Path, confidence: float = 0.95) -> Path:
    """One panel per split: per arm, each seed's resolved rate before (hollow) and after (filled) RL with its
    interval by task where the row has one (attempts at one task are not independent: the interval `seed_rises`
    reads a rise against), else its per-attempt Wilson interval. A panel shows only the arms it has rows for; the
    warm start at greedy decoding has a column of its own only in a panel where no `ARM greedy` column already
    shows it as its before."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeded = [row for row in rows if row["seed"] != "all"]
    seeds = sorted({row["seed"] for row in seeded}, key=_seed_order)
    columns: dict[str, list[str]] = {}
    for split in SPLITS:
        arms = list(dict.fromkeys(row["arm"] for row in seeded if row["split"] == split))
        if any(arm.endswith(" greedy") for arm in arms):
            arms = [arm for arm in arms if arm != "warmstart-greedy"]
        columns[split] = arms
    widest = max((len(arms) for arms in columns.values()), default=1)
    figure, axes = plt.subplots(1, len(SPLITS), figsize=(4 + 2.4 * widest, 4.2), sharey=True, squeeze=False)
    width = 0.8 / max(1, 2 * len(seeds))
    top = min(1.02, max((row.get("task_high", row["high"]) for row in seeded), default=1.0) + 0.08)
    for axis, split in zip(axes[0], SPLITS, strict=True):
        arms = columns[split]
        for arm_index, arm in enumerate(arms):
            for seed_index, seed in enumerate(seeds):
                for phase_index, phase in enumerate(PHASES):
                    found = [row for row in seeded if (row["arm"], row["seed"], row["split"], row["phase"])
                             == (arm, seed, split, phase)]
                    if not found:
                        continue
                    row = found[0]
                    low, high = (row["task_low"], row["task_high"]) if "task_low" in row else (row["low"], row["high"])
                    x = arm_index - 0.4 + width * (2 * seed_index + phase_index + 0.5)
                    spread = [[max(0.0, row["rate"] - low)], [max(0.0, high - row["rate"])]]
                    axis.errorbar([x], [row["rate"]], yerr=spread,
                                  fmt="o", capsize=3, color=f"C{seed_index}",
                                  markerfacecolor="white" if phase == "before" else f"C{seed_index}",
                                  label=f"seed {seed} {phase}")
        axis.set_xticks(range(len(arms)))
        axis.set_xticklabels([_column_label(arm) for arm in arms], fontsize=8)
        axis.set_title(f"{split} split" + (" (held out)" if split == "eval" else " (training tasks)"))
        axis.set_xlim(-0.5, max(1, len(arms)) - 0.5)
        axis.set_ylim(-0.02, top)
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"resolved rate ({int(confidence * 100)}% interval, by task)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    if unique:
        axes[0][-1].legend(unique.values(), unique.keys(), loc="best", fontsize=7)
    figure.suptitle("lego bench learn: before (hollow) and after (filled) RL, per arm and seed\n"
                    "(greedy) columns: the warm start and the arm's last policy at greedy decoding", fontsize=9)
    return _save(figure, path)


def _column_label(arm: str) -> str:
    if arm == "warmstart-greedy":
        return "warm start\n(greedy)"
    return arm.removesuffix(" greedy") + "\n(greedy)" if arm.endswith(" greedy") else arm


def warmstart_curve(steps_path: str | Path) -> list[dict[str, float]]:
    """The warm start's own curve from its stage's `sft_steps.json`: per optimizer step, the mean token loss, the
    token accuracy and the least likely demonstration's log-probability (what its stopping rule reads)."""
    names = ("loss", "token_accuracy", "least_likely_demonstration_logprob")
    return [{"step": index + 1, **{name: float(step[name]) for name in names if step.get(name) is not None}}
            for index, step in enumerate(json.loads(Path(steps_path).read_text()))]


def plot_warmstart_curves(curves: dict[str, list[dict[str, float]]], path: str | Path) -> Path:
    """Each seed's warm start: its token loss (log scale) and token accuracy per optimizer step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (loss_axis, accuracy_axis) = plt.subplots(1, 2, figsize=(9, 3.5))
    for index, (label, curve) in enumerate(curves.items()):
        steps = [point["step"] for point in curve]
        loss_axis.plot(steps, [point.get("loss", float("nan")) for point in curve], color=f"C{index}", label=label)
        accuracy_axis.plot(steps, [point.get("token_accuracy", float("nan")) for point in curve], color=f"C{index}",
                           label=label)
    loss_axis.set_yscale("log")
    loss_axis.set_ylabel("mean token loss (nats)")
    accuracy_axis.set_ylabel("token accuracy")
    accuracy_axis.set_ylim(-0.02, 1.02)
    for axis in (loss_axis, accuracy_axis):
        axis.set_xlabel("optimizer step")
        axis.grid(alpha=0.3)
    if curves:
        accuracy_axis.legend(loc="best", fontsize=8)
    figure.suptitle("the warm start's own curve on its demonstrations, per seed", fontsize=9)
    return _save(figure, path)


def _save(figure, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    figure.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return out
