"""`lego bench learn`: run a learning configuration end to end and report what RL did, against baselines.

With no arms, it runs `lego run -c CONFIG` once in a child process, exactly as a user would, and prints that run's
curve (lego.pipeline.learning): resolved rate with its Wilson interval per policy on the train and eval splits, the
GRPO groups with signal, each train step's metrics and the wall time of each stage; the plot is written beside the
run's reports.

With `-o arms=sft,rft,grpo,success_mass -o seeds=0,1,2` it runs one `lego run` per arm and seed, each the config
plus that arm's overrides (`arm_overrides`): the same warm start per seed (one work dir per seed, so the warm start,
the evaluation before RL and iteration 0's rollouts are computed once and served from the cache to the other arms),
the same rollouts sampled per iteration and the same number of optimizer steps; only the update differs:
- `sft`: continued supervised fine-tuning on the warm start's demonstrations (`train.adv_estimator: sft`; its
  iterations sample no rollouts, which it would not train on);
- `rft`: rejection-sampling fine-tuning, the likelihood of the policy's own resolved rollouts (`rft`);
- `grpo`: GRPO's group-normalized advantages;
- `success_mass`: each found success weighted by its share of the group's found success mass.
It also evaluates each seed's warm start at greedy decoding (`lego eval`, temperature 0, one attempt per task); its
rate at the sampling temperature is every arm's `before`. And each arm's last policy at greedy decoding on the
held-out split (the rows `ARM greedy`, before: the warm start at greedy decoding): RL that only sharpens the warm
start's distribution raises the rate at the sampling temperature as a lower temperature would, not this one. The
result: a row per arm x seed x split x phase (resolved, attempts, rate, Wilson interval; tasks solved and the
interval by task, as attempts at one task are not independent), the seeds pooled, the change of each arm and seed
read task by task (the same tasks before and after), the last arm listed against each other arm after RL on the same
tasks (does the method beat its baselines, not only its start), the table as text and as Markdown and a plot, and
each seed's warm start curve (its loss and token accuracy per step) as a second plot, written under <work
dir>/reports/bench-learn-<time>/ and rewritten after each arm (a campaign cut short keeps what it finished). And
each arm's time as computed, from its stages' stored seconds: a resumed bench or an arm served from the cache
reports what the arm costs from scratch, apart from the stages its seed's arms share (the warm start and its
evaluation).
A benchmark, not a test: hours at full size on a small machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lego.bench import register
from lego.config import LegoConfig, load_config
from lego.errors import LegoError, tail
from lego.workdir import WorkDir

# What each arm changes in the config; everything else (warm start, sampling, rollouts, lr, epochs) is shared.
ARMS: dict[str, list[str]] = {
    "sft": ["train.adv_estimator=sft"],
    "rft": ["train.adv_estimator=rft"],
    "grpo": ["train.adv_estimator=grpo"],
    "success_mass": ["train.adv_estimator=success_mass"],
}
CLI = [sys.executable, "-m", "lego_cli"]


def parse_list(text: str, what: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise LegoError(f"bench learn: {what} is empty; give a comma-separated list")
    return items


def seed_work_dir(base: Path, seed: int) -> Path:
    """Every arm of a seed runs in this work dir: its shared stages are computed once."""
    return Path(base) / f"seed-{seed}"


def arm_overrides(arm: str, seed: int, base_work_dir: Path) -> list[str]:
    """The overrides that make `lego run -c CONFIG` run `arm` at `seed`."""
    if arm not in ARMS:
        raise LegoError(f"bench learn: unknown arm {arm!r}; choose from {', '.join(ARMS)}")
    return [*ARMS[arm], f"project.seed={seed}", f"project.work_dir={seed_work_dir(base_work_dir, seed)}"]


def _child(args: list[str], log: Path) -> tuple[int, str, float]:
    """Run the command line in a child process, its output to `log`; returns (exit code, stdout, seconds)."""
    started = time.monotonic()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as err:
        done = subprocess.run(args, stdout=subprocess.PIPE, stderr=err, text=True)
    log.write_text(log.read_text() + (done.stdout or ""))
    return done.returncode, done.stdout or "", time.monotonic() - started


def _say(message: str) -> None:
    print(f"bench learn: {message}", file=sys.stderr, flush=True)


@register("learn")
def bench_learn(bench_config: LegoConfig, work: WorkDir, config: str = "learn", arms: str = "", seeds: str = "",
                overrides: str = "", run_config: str = "") -> dict[str, Any]:
    """`config`: the config `lego run` gets (a name or a path; `run_config` is its older name). `arms`, `seeds`:
    comma-separated; with neither, one run of the config as it is. `overrides`: space-separated key=value
    overrides for every run (a smaller scale, say)."""
    name = run_config or config
    extra = overrides.split()
    if not arms and not seeds:
        return _single_run(name, extra)
    return run_arms(name, parse_list(arms or ",".join(ARMS), "arms"),
                    [int(seed) for seed in parse_list(seeds or "0", "seeds")], extra)


def _single_run(name: str, extra: list[str]) -> dict[str, Any]:
    from lego.pipeline.learning import learning_curve, plot_learning_curve
    from lego.pipeline.manifest import latest_run_id, load_manifest

    learn = load_config(name, extra)
    learn_work = WorkDir.create(learn.project.work_dir)
    started = time.monotonic()
    # The command line, not the flows: lego never imports the orchestration layer.
    done = subprocess.run([*CLI, "run", "-c", name, *extra], capture_output=True, text=True)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise LegoError(f"`lego run -c {name}` failed (exit {done.returncode}): {tail(done.stderr or done.stdout)}")
    manifest = load_manifest(learn_work, latest_run_id(learn_work))
    curve = learning_curve(manifest, learn.eval.confidence)
    png = plot_learning_curve(curve, learn_work.root / "reports" / manifest.run_id / "learning.png")
    return {"config": name, "wall_s": round(wall, 1), "plot": str(png), **curve}


def run_arms(name: str, arms: list[str], seeds: list[int], extra: list[str]) -> dict[str, Any]:
    for arm in arms:
        arm_overrides(arm, 0, Path("."))  # an unknown arm fails before anything runs
    base = load_config(name, extra)
    confidence = base.eval.confidence
    base_work = Path(base.project.work_dir)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    reports = WorkDir.create(base_work).root / "reports" / f"bench-learn-{stamp}"
    reports.mkdir(parents=True, exist_ok=True)
    _say(f"the report, rewritten after each arm: {reports}")
    started = time.monotonic()
    runs: list[dict[str, Any]] = []
    warmstarts: list[dict[str, Any]] = []
    result: dict[str, Any] = {}
    for seed in seeds:
        for arm in arms:
            run = run_arm(name, arm, seed, extra, base_work, reports, confidence)
            runs.append(run)
            first = next((other for other in runs if other["seed"] == seed and other.get("warmstart_key")), None)
            if first is not None and run.get("warmstart_key") not in (None, first["warmstart_key"]):
                # A code edit in the warm start's import closure (a shared working tree) gave it another key: this
                # arm did not start from the same warm start as the seed's first arm.
                run["warmstart_differs_from"] = first["arm"]
                _say(f"arm {arm} seed {seed}: its warm start ({run['warmstart_key'][:12]}) is not arm "
                     f"{first['arm']}'s ({first['warmstart_key'][:12]}): the code changed between the runs")
            if run.get("warmstart_policy") and not any(warm["seed"] == seed for warm in warmstarts):
                warmstarts.append(warmstart_rates(name, seed, extra, base_work, run, reports, confidence))
            if run.get("final_policy_version"):
                run["greedy_after"] = final_policy_greedy_rates(name, seed, extra, base_work, run, reports,
                                                                confidence)
            result = write_report(name, extra, arms, seeds, confidence, reports, started, runs, warmstarts)
    _say("\n" + (reports / "learn_arms.txt").read_text().rstrip("\n"))
    return result


def write_report(name: str, extra: list[str], arms: list[str], seeds: list[int], confidence: float, reports: Path,
                 started: float, runs: list[dict[str, Any]], warmstarts: list[dict[str, Any]]) -> dict[str, Any]:
    """The table, plots and JSON of the arms run so far, rewritten after each: a campaign of hours cut short (a
    killed process, a lost machine) leaves the report of every arm it finished, marked partial."""
    from lego.pipeline import learning

    done = [f"{run['arm']} seed {run['seed']}" for run in runs]
    complete = len(runs) == len(arms) * len(seeds)
    status = "" if complete else \
        f"partial: {len(runs)} of {len(arms) * len(seeds)} arm runs done ({', '.join(done)})\n\n"
    rows = learning.bench_table(runs, warmstarts, confidence)
    rises = learning.seed_rises(rows, confidence)
    contrasts = learning.arm_contrasts(rows, confidence)
    table = status + learning.format_table(rows) + "\n\n" + learning.format_rises(rises)
    if contrasts:
        table += "\n\n" + learning.format_contrasts(contrasts)
    if failures := format_failures(runs, warmstarts):
        table += "\n\n" + failures
    if times := learning.format_times(runs):
        table += "\n\n" + times
    png = learning.plot_bench(rows, reports / "learn_arms.png", confidence)
    curves = {f"seed {warm['seed']}": warm["curve"] for warm in sorted(warmstarts, key=lambda warm: warm["seed"])
              if warm.get("curve")}
    warm_png = learning.plot_warmstart_curves(curves, reports / "warmstart_curves.png")
    result = {"config": name, "overrides": extra, "arms": arms, "seeds": seeds, "confidence": confidence,
              "complete": complete, "done": done,
              "wall_s": round(time.monotonic() - started, 1), "reports": str(reports), "plot": str(png),
              "warmstart_plot": str(warm_png),
              "table": rows, "rises": rises, "contrasts": contrasts, "arm_times": learning.arm_times(runs),
              "runs": runs, "warmstart": warmstarts,
              "warmstart_differs": [f"{run['arm']} seed {run['seed']}" for run in runs
                                    if run.get("warmstart_differs_from")]}
    # Each file whole or not at all: a kill mid-write leaves the previous arm's report, not half of this one.
    for file_name, text in (("learn_arms.json", json.dumps(result, indent=2, default=str)),
                            ("learn_arms.txt", table + "\n"),
                            ("learn_arms.md", status + learning.format_markdown(rows, confidence) + "\n"),
                            ("learn_summary.md", status + learning.format_summary(rows) + "\n")):
        partial = reports / f".{file_name}.partial"
        partial.write_text(text)
        partial.replace(reports / file_name)
    return result


def run_arm(name: str, arm: str, seed: int, extra: list[str], base_work: Path, reports: Path,
            confidence: float) -> dict[str, Any]:
    """One `lego run` of the config under `arm` at `seed`: its before/after rates, curve and times."""
    from lego.pipeline.learning import arm_seconds, before_after, learning_curve
    from lego.pipeline.manifest import latest_run_id, load_manifest

    arm_extra = [*extra, *arm_overrides(arm, seed, base_work)]
    command = [*CLI, "run", "-c", name, *arm_extra]
    _say(f"arm {arm} seed {seed}: lego run -c {name} {' '.join(arm_extra)}")
    code, _, wall = _child(command, reports / f"{arm}-seed{seed}.log")
    entry: dict[str, Any] = {"arm": arm, "seed": seed, "command": " ".join(["lego", *command[3:]]),
                             "wall_s": round(wall, 1)}
    if code != 0:
        entry["error"] = f"exit {code}: {tail((reports / f'{arm}-seed{seed}.log').read_text())}"
        _say(f"arm {arm} seed {seed}: failed ({entry['error'][-300:]})")
        return entry
    run_work = WorkDir.create(load_config(name, arm_extra).project.work_dir)
    manifest = load_manifest(run_work, latest_run_id(run_work))
    curve = learning_curve(manifest, confidence)
    rates = before_after(curve)
    warm = manifest.get("warmstart")
    versions = [int(result.data["policy_version"]) for result in manifest.stages.values()
                if "policy_version" in result.data and "policy_path" in result.data]
    entry.update({"run_id": manifest.run_id, "final_policy_version": max(versions, default=0), "work_dir": str(run_work.root), "rates": rates,
                  "rollouts": [point.get("train_split") for point in curve["curve"] if point.get("train_split")],
                  "optimizer_steps": [int((point.get("train_step") or {}).get("optimizer_steps", 0))
                                      for point in curve["curve"] if "train_step" in point],
                  "verdict": curve["verdict"], "stage_seconds": curve["stage_seconds"],
                  "computed_seconds": curve["computed_seconds"], "stages": curve["stages"],
                  "arm_seconds": arm_seconds(curve["computed_seconds"])})
    if warm is not None:
        entry["warmstart_key"] = warm.key
        entry["warmstart_policy"] = warm.data.get("policy_path")
        entry["warmstart_steps"] = str(warm.outputs["sft_steps"]) if warm.outputs.get("sft_steps") else None
        entry["warmstart"] = {key: warm.metrics.get(key) for key in
                              ("resolved_demonstrations", "demonstrations", "steps", "final_loss",
                               "final_token_accuracy")}
    _say(f"arm {arm} seed {seed}: done in {wall:.0f} s ({entry['arm_seconds'] / 60:.1f} min as computed); "
         + ", ".join(f"{phase} {split} {rate['resolved']}/{rate['attempts']}" for phase in ("before", "after")
                     for split, rate in rates[phase].items() if rate))
    return entry


def warmstart_rates(name: str, seed: int, extra: list[str], base_work: Path, run: dict[str, Any], reports: Path,
                    confidence: float) -> dict[str, Any]:
    """The seed's warm start: its rate at the sampling temperature (the baseline evaluation every arm starts from)
    and at greedy decoding, on both splits."""
    from lego.pipeline.learning import warmstart_curve

    arm_extra = [*extra, *arm_overrides(run["arm"], seed, base_work)]
    config = load_config(name, arm_extra)
    _say(f"seed {seed}: the warm start at greedy decoding")
    greedy = greedy_rates(name, arm_extra, ["--policy", run["warmstart_policy"]], ("train", "eval"),
                          reports / f"warmstart-greedy-seed{seed}", confidence)
    steps = run.get("warmstart_steps")
    curve = warmstart_curve(steps) if steps and Path(steps).is_file() else None
    return {"seed": seed, "sampled": (run.get("rates") or {}).get("before"), "greedy": greedy,
            "temperature": config.sampling.temperature, **(run.get("warmstart") or {}), "curve": curve}


def final_policy_greedy_rates(name: str, seed: int, extra: list[str], base_work: Path, run: dict[str, Any],
                              reports: Path, confidence: float) -> dict[str, dict[str, Any] | None]:
    """The arm's last policy at greedy decoding on the held-out split: a rise at the sampling temperature can be
    sharpening alone (what a lower temperature does to the warm start), a rise at greedy decoding cannot."""
    arm_extra = [*extra, *arm_overrides(run["arm"], seed, base_work)]
    _say(f"arm {run['arm']} seed {seed}: its last policy at greedy decoding")
    return greedy_rates(name, arm_extra, ["--run", run["run_id"], "--policy-version", str(run["final_policy_version"])],
                        ("eval",), reports / f"{run['arm']}-greedy-seed{seed}", confidence)


def greedy_rates(name: str, arm_extra: list[str], policy: list[str], splits: tuple[str, ...], log_stem: Path,
                 confidence: float) -> dict[str, dict[str, Any] | None]:
    """`lego eval` of `policy` at temperature 0, one attempt per task (greedy decoding is deterministic), per split:
    its rate, and the interval by task over the same outcomes (one attempt a task). An evaluation stored
    by an earlier identical one is resumed, so a rerun of the bench costs nothing here."""
    from lego.bench.failures import failure_parts
    from lego.pipeline.learning import rate_by_task, rate_of

    arm_extra = [*arm_extra, "eval.temperature=0"]
    config = load_config(name, arm_extra)
    limits = {"train": config.tasks.limit or 100_000, "eval": config.eval.limit or 100_000}
    rates: dict[str, dict[str, Any] | None] = {}
    for split in splits:
        command = [*CLI, "eval", "-c", name, *arm_extra, *policy, "--split", split, "--limit", str(limits[split]),
                   "--samples", "1", "--json"]
        code, stdout, _ = _child(command, log_stem.with_name(f"{log_stem.name}-{split}.log"))
        rates[split] = None
        if code in (0, 1) and stdout.strip():
            evaluation = json.loads(stdout[stdout.index("{"):])
            report = next(iter(evaluation["harnesses"].values()))["report"]
            resolved, attempts = report["resolved"], report["attempts"]
            if attempts:
                by_task = {task: [counts["resolved"], counts["attempts"]]
                           for task, counts in sorted(report.get("per_task", {}).items())}
                rates[split] = rate_by_task(rate_of(resolved, attempts, confidence), by_task, confidence)
                data_run_id = next(iter(evaluation["harnesses"].values())).get("data_run_id")
                failures = failure_parts(config.project.work_dir, config, data_run_id) if data_run_id else None
                if rates[split] is not None and failures:
                    rates[split] = {**rates[split], "failures": failures}
    return rates


def format_failures(runs: list[dict[str, Any]], warmstarts: list[dict[str, Any]]) -> str:
    """Per seed, the held-out failures at greedy decoding by what their first reply wrote of the task's command
    (lego.bench.failures): the warm start's, then each arm's last policy's."""
    entries = [(f"seed {warm['seed']} warm start", ((warm.get("greedy") or {}).get("eval") or {}).get("failures"))
               for warm in warmstarts]
    entries += [(f"seed {run['seed']} {run['arm']}", ((run.get("greedy_after") or {}).get("eval") or {})
                 .get("failures")) for run in runs]
    lines = [f"{name}: " + ", ".join(f"{label} {count}" for label, count in failures.items() if count)
             for name, failures in entries if failures]
    return "held-out failures at greedy decoding, by what the first reply wrote of the task's command:\n" + \
        "\n".join(lines) if lines else ""
