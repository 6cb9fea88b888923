"""`lego bench learn` with arms and seeds (lego/bench/learn.py, lego/pipeline/learning.py), cheaply: the family
config loads and validates; each arm's overrides train as intended and share everything else; the `rft` and `sft`
estimators reach the train stage; the table, intervals and plot from crafted manifests; and the bench's loop over
arms and seeds with the child commands replaced by stand-ins that leave what a run leaves."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from run_builders import Iteration, R, U, crafted_config, grade, store_rollouts

from lego.bench import benchmark_options
from lego.bench import learn as bench
from lego.config import load_config
from lego.engine.checkpoint import tiny_model_fingerprint
from lego.engine.tokenizer import load_tokenizer
from lego.errors import LegoError
from lego.evaluate.paired import mean_interval, sign_test_p
from lego.evaluate.stats import wilson_interval
from lego.harness.base import get_harness
from lego.pipeline.artifacts import StageContext, StageResult
from lego.pipeline.attempts import gold_command
from lego.pipeline.dataset_stage import run_dataset_stage
from lego.pipeline.learning import (
    arm_contrasts,
    arm_seconds,
    arm_times,
    before_after,
    bench_table,
    format_contrasts,
    format_markdown,
    format_rises,
    format_summary,
    format_table,
    format_times,
    learning_curve,
    plot_bench,
    rate_by_task,
    rate_of,
    rate_with_tasks,
    seed_rises,
    task_clustered_interval,
)
from lego.pipeline.manifest import RunManifest, save_manifest
from lego.pipeline.policy import Policy
from lego.pipeline.train_stage import run_train_stage, training_batch
from lego.pipeline.verify_stage import outcome_metrics
from lego.tasksets.family import family_tasks, parse_family_source
from lego.workdir import WorkDir

ARMS = ("sft", "rft", "grpo", "success_mass")


def test_the_family_config_loads_and_validates():
    config = load_config("family")
    family = parse_family_source(config.tasks.source)
    assert (family.name, family.seed) == ("constants", 0)
    # the warm start and RL see the training tasks, the held-out split is evaluated only
    assert (config.tasks.split, config.tasks.eval_split) == ("train", "eval")
    assert config.warmstart.enabled and config.eval.at_start and set(config.eval.splits) == {"train", "eval"}
    # some training tasks are demonstrated, and RL also practises others with no demonstration
    tasks = family_tasks(family.name, family.seed, family.train, family.held_out)
    train_tasks = sum(task.split == "train" for task in tasks)
    assert config.warmstart.tasks is not None and 0 < config.warmstart.tasks < train_tasks
    assert config.eval.every == config.pipeline.iterations  # evaluated before RL and after the last iteration
    # the cap cuts no gold reply of the family, held-out ones included (each ends with one more token, its stop)
    harness, tokenizer = get_harness(config.harness.name), load_tokenizer()
    longest = max(len(tokenizer.encode(reply)) + 1 for task in tasks for reply in harness.gold_replies(gold_command(task)))
    assert longest <= config.sampling.max_tokens
    assert config.filter.enabled is False and config.rollout.samples_per_task >= 2
    # every seed of the bench starts from one pretrained base: the same initial weights' key whatever project.seed
    seeds = [load_config("family", [f"project.seed={seed}"]) for seed in (0, 1, 2)]
    assert len({tiny_model_fingerprint(other.model.init, other.project.seed) for other in seeds}) == 1


@pytest.mark.parametrize("arm", ARMS)
def test_each_arm_trains_with_its_estimator_and_shares_everything_else(arm, tmp_path):
    config = load_config("family", bench.arm_overrides(arm, 2, tmp_path))
    assert config.train.adv_estimator == arm
    assert config.project.seed == 2 and config.project.work_dir == tmp_path / "seed-2"
    reference = load_config("family", bench.arm_overrides("success_mass", 2, tmp_path))
    # the same warm start (its cache key's settings), rollouts, evaluation and optimizer budget
    for section in ("warmstart", "sampling", "rollout", "eval", "model", "tasks", "pipeline", "project"):
        assert config.section_dict(section) == reference.section_dict(section), section
    assert config.section_dict("train") == {**reference.section_dict("train"), "adv_estimator": arm}


def test_the_bench_takes_arms_seeds_and_config_as_options():
    options = benchmark_options("learn", bench.bench_learn,
                                {"arms": "sft,grpo", "seeds": "0,1,2", "config": "family", "overrides": "a=1"})
    assert options == {"arms": "sft,grpo", "seeds": "0,1,2", "config": "family", "overrides": "a=1"}
    with pytest.raises(Exception, match="unknown arm"):
        bench.arm_overrides("ppo", 0, Path("."))


# ------------------------------------------------------------------------------ the new estimators in the train stage


def dataset_of(tmp_path: Path, *overrides: str) -> tuple[StageContext, StageResult]:
    config = crafted_config(tmp_path / "work", "train.router_replay=disabled", *overrides)
    work = WorkDir.create(config.project.work_dir)
    ctx = StageContext(config=config, work=work, run_id="arms", runner=None, log=lambda message: None)
    kinds = [R, U, R, U]
    rollouts = store_rollouts(work, "rollout-arms-0", 0, Iteration(kinds={"task-a": kinds}))
    outcomes = grade(work, "rollout-arms-0", 0, rollouts, kinds, "verify-arms")
    verify = StageResult(stage="verify", iteration=0, key="verify-arms", path=str(work.artifacts / "verify"),
                         created_at="2026-01-01T00:00:00+00:00", metrics=outcome_metrics(outcomes),
                         data={"data_run_id": "rollout-arms-0", "outcome_stage": "verify-arms"})
    return ctx, run_dataset_stage(ctx, verify)


def test_rft_trains_on_the_resolved_rollouts_with_advantage_one(tmp_path):
    ctx, dataset = dataset_of(tmp_path, "train.adv_estimator=rft")
    assert sorted(training_batch(ctx, dataset).advantages) == [0.0, 0.0, 1.0, 1.0]


def test_sft_fine_tunes_on_the_warm_starts_resolved_demonstrations(tmp_path, tiny_model_path):
    ctx, dataset = dataset_of(tmp_path, "train.adv_estimator=sft", "train.epochs=2")
    assert not ctx.config.train.trains_on_rollouts  # the pipeline samples no rollouts for it (flows/pipeline.py)
    demonstrations = store_rollouts(ctx.work, "warmstart-arms", 0, Iteration(kinds={"task-a": [R], "task-b": [U]}),
                                    stage="warmstart")
    grade(ctx.work, "warmstart-arms", 0, demonstrations, [R, U], "warmstart-verify")
    warmstart = StageResult(stage="warmstart", key="warm-arms", path=str(tmp_path / "warm"),
                            data={"data_run_id": "warmstart-arms"})
    with pytest.raises(Exception, match="warmstart.enabled"):
        run_train_stage(ctx, 0, None, Policy.from_path(tiny_model_path))
    result = run_train_stage(ctx, 0, None, Policy.from_path(tiny_model_path), warmstart)
    assert result.data["trained"] and result.metrics["optimizer_steps"] == 2
    assert result.metrics["sequences"] == 1  # the resolved demonstration only
    assert result.inputs["demonstrations"] == "warm-arms" and "dataset" not in result.inputs
    # An estimator that trains on rollouts refuses to run without the iteration's dataset.
    rft = replace(ctx, config=ctx.config.model_copy(update={"train": ctx.config.train.model_copy(
        update={"adv_estimator": "rft"})}))
    with pytest.raises(LegoError, match="rollout, verify and dataset stages"):
        run_train_stage(rft, 0, None, Policy.from_path(tiny_model_path))
    assert result.data["policy_version"] == Policy.from_path(tiny_model_path).version + 1


# ------------------------------------------------------------------------------ the table, intervals and plot


def _stage(stage: str, iteration: int | None, metrics: dict, data: dict | None = None) -> StageResult:
    return StageResult(stage=stage, iteration=iteration, key=f"{stage}-{iteration}", path="/nowhere", metrics=metrics,
                       data=data or {})


def _policy_data(version: int) -> dict:
    return {"policy_path": f"/run/policy-{version}", "policy_version": version, "policy_key": f"policy-{version}"}


def crafted_manifest(run_id: str, before: tuple[int, int], after: tuple[int, int], attempts: int = 8,
                     policy: str = "/warm/checkpoint", sft_steps: Path | None = None) -> RunManifest:
    """A run as the pipeline leaves it: the baseline and the last evaluation, on the train (`train.`) and eval
    splits, `before`/`after` = (train resolved, eval resolved) of `attempts` each."""
    def split_metrics(resolved: tuple[int, int]) -> dict:
        return {"resolved": resolved[1], "attempts": attempts, "train.resolved": resolved[0],
                "train.attempts": attempts}

    stages = [_stage("warmstart", None, {"steps": 40, "final_loss": 0.01, "resolved_demonstrations": 4,
                                         "demonstrations": 4}, {"policy_path": policy}),
              _stage("baseline", None, split_metrics(before)),
              _stage("verify", 0, {"graded": 8, "outcome.resolved": 3}),
              _stage("train", 0, {"optimizer_steps": 4, "loss": 0.5}, _policy_data(1)),
              _stage("verify", 1, {"graded": 8, "outcome.resolved": 5}),
              _stage("train", 1, {"optimizer_steps": 4, "loss": 0.4}, _policy_data(2)),
              _stage("evaluate", 1, split_metrics(after))]
    if sft_steps is not None:
        stages[0].outputs["sft_steps"] = str(sft_steps)
    return RunManifest(run_id=run_id, created_at="2026-12-02T00:00:00+00:00",
                       stages={result.label(): result for result in stages})


def test_before_and_after_come_from_the_baseline_and_the_last_evaluation():
    rates = before_after(learning_curve(crafted_manifest("r", before=(2, 0), after=(6, 1))))
    assert {phase: {split: rate["resolved"] for split, rate in rates[phase].items()} for phase in rates} == \
        {"before": {"train": 2, "eval": 0}, "after": {"train": 6, "eval": 1}}
    low, high = wilson_interval(6, 8, 0.95)
    assert rates["after"]["train"] == {"resolved": 6, "attempts": 8, "rate": 0.75, "low": low, "high": high}


def test_an_arms_time_counts_its_own_stages_as_computed_whether_or_not_this_run_found_them_cached():
    """A resumed bench serves most stages from the cache: its wall time says nothing of what an arm costs. Each stage
    keeps the seconds it took when computed, and the arm's time sums its own (not its seed's shared warm start and
    its evaluation)."""
    manifest = crafted_manifest("r", before=(2, 0), after=(6, 1))
    took = {"warmstart": 1800.0, "baseline": 1200.0, "verify/0": 200.0, "train/0": 100.0, "verify/1": 180.0,
            "train/1": 120.0, "evaluate/1": 1000.0}
    for label, result in manifest.stages.items():
        result.seconds = took[label]
        result.cached = label in ("warmstart", "baseline", "verify/0", "train/0")  # a rerun after a kill
    curve = learning_curve(manifest)
    assert curve["stage_seconds"] == {"warmstart": 0.0, "baseline": 0.0, "verify": 180.0, "train": 120.0,
                                      "evaluate": 1000.0}
    assert curve["computed_seconds"] == {"warmstart": 1800.0, "baseline": 1200.0, "verify": 380.0, "train": 220.0,
                                         "evaluate": 1000.0}
    assert arm_seconds(curve["computed_seconds"]) == 1600.0
    runs = [{"arm": "grpo", "seed": 1, "computed_seconds": curve["computed_seconds"]},
            {"arm": "grpo", "seed": 0, "computed_seconds": {**curve["computed_seconds"], "evaluate": 2000.0}},
            {"arm": "sft", "seed": 0, "error": "exit 1"}]
    assert format_times(runs).splitlines()[1:] == [
        "grpo: seed 0 43.3 min, seed 1 26.7 min (the longest 43.3 min; its iterations and evaluations, the shared "
        "stages apart)",
        "seed 0, shared by its arms: warmstart 30.0 min, baseline 20.0 min",
        "seed 1, shared by its arms: warmstart 30.0 min, baseline 20.0 min"]
    assert format_times([{"arm": "sft", "seed": 0, "error": "exit 1"}]) == ""


def test_stages_two_arms_of_a_seed_share_by_key_are_counted_once_beside_them():
    """Iteration 0's rollouts sample the warm start: every arm of a seed that trains on rollouts has the same
    rollout/0 and verify/0 (one key, computed once). An arm alone still costs them; beside the others it does not."""
    def run(arm, seed, keys):
        stages = {"warmstart": {"key": "w", "seconds": 1800.0}, **{label: {"key": key, "seconds": 60.0}
                                                                  for label, key in keys.items()}}
        computed = {"warmstart": 1800.0, "rollout": 0.0, "train": 0.0}
        for label in keys:
            computed[label.split("/")[0]] += 60.0
        return {"arm": arm, "seed": seed, "stages": stages, "computed_seconds": computed}

    runs = [run("rft", 0, {"rollout/0": "r0", "train/0": "rft-t0", "rollout/1": "rft-r1"}),
            run("grpo", 0, {"rollout/0": "r0", "train/0": "grpo-t0", "rollout/1": "grpo-r1"}),
            run("sft", 0, {"train/0": "sft-t0"}),
            run("grpo", 1, {"rollout/0": "s1-r0", "train/0": "s1-t0"})]
    times = {(time["arm"], time["seed"]): time for time in arm_times(runs)}
    assert times["rft", 0] == {"arm": "rft", "seed": 0, "alone": 180.0, "beside": 120.0, "shared": ["rollout/0"]}
    assert times["grpo", 0]["shared"] == ["rollout/0"] and times["grpo", 0]["beside"] == 120.0
    assert times["sft", 0] == {"arm": "sft", "seed": 0, "alone": 60.0, "beside": 60.0, "shared": []}
    assert times["grpo", 1]["shared"] == []  # another seed's rollouts are other rollouts (another key)
    lines = format_times(runs).splitlines()
    assert lines[1] == ("rft: seed 0 3.0 min (2.0 min beside its seed's other arms, rollout/0 shared) (the longest "
                        "3.0 min; its iterations and evaluations, the shared stages apart)")
    assert lines[3].startswith("sft: seed 0 1.0 min (the longest")


def test_the_table_has_a_row_per_arm_seed_split_and_phase_the_greedy_warm_start_and_pooled_seeds(tmp_path):
    runs = [{"arm": arm, "seed": seed, "rates": before_after(learning_curve(
        crafted_manifest(f"{arm}-{seed}", before=(2, 0), after=(2 + seed, seed))))}
        for arm in ("grpo", "sft") for seed in (0, 1)]
    greedy = {"train": {"resolved": 4, "attempts": 4, "rate": 1.0, "low": 0.5, "high": 1.0}, "eval": None}
    rows = bench_table(runs, [{"seed": 0, "greedy": greedy}])
    per_seed = [row for row in rows if row["seed"] != "all"]
    assert len(per_seed) == 2 * 2 * 2 * 2 + 1
    pooled = {(row["arm"], row["split"], row["phase"]): row for row in rows if row["seed"] == "all"}
    assert len(pooled) == 2 * 2 * 2  # the greedy warm start has one seed: nothing to pool
    assert (pooled["grpo", "eval", "after"]["resolved"], pooled["grpo", "eval", "after"]["attempts"]) == (1, 16)
    assert (pooled["grpo", "eval", "after"]["low"], pooled["grpo", "eval", "after"]["high"]) == wilson_interval(1, 16)
    text = format_table(rows)
    assert "warmstart-greedy" in text and "[0.500, 1.000]" in text
    png = plot_bench(rows, tmp_path / "arms.png")
    assert png.read_bytes()[:4] == b"\x89PNG"



def test_the_table_groups_rows_by_arm_with_seeds_ascending_whatever_order_the_runs_finished_in():
    def run(arm: str, seed: int) -> dict:
        return {"arm": arm, "seed": seed, "rates": before_after(learning_curve(
            crafted_manifest(f"{arm}-{seed}", before=(2, 0), after=(3, 1))))}

    # the bench runs seed by seed, every arm within a seed, and a resumed bench may start at any seed
    runs = [run(arm, seed) for seed in (1, 2, 0) for arm in ("sft", "grpo")]
    greedy = {"train": {"resolved": 4, "attempts": 8, "rate": 0.5, "low": 0.2, "high": 0.8}, "eval": None}
    rows = bench_table(runs, [{"seed": seed, "greedy": greedy} for seed in (2, 0, 1)])
    order = list(dict.fromkeys((row["arm"], row["seed"]) for row in rows))
    assert order == [("sft", 0), ("sft", 1), ("sft", 2), ("grpo", 0), ("grpo", 1), ("grpo", 2),
                     ("warmstart-greedy", 0), ("warmstart-greedy", 1), ("warmstart-greedy", 2),
                     ("sft", "all"), ("grpo", "all"), ("warmstart-greedy", "all")]


def test_the_interval_by_task_widens_when_each_task_is_solved_in_all_its_attempts_or_none():
    # 9 of 32 tasks solved in every one of 16 attempts: 144/512 attempts, but 32 observations
    clustered = [(16, 16)] * 9 + [(0, 16)] * 23
    low, high = task_clustered_interval(clustered)
    wilson_low, wilson_high = wilson_interval(144, 512)
    assert low < wilson_low - 0.05 and high > wilson_high + 0.05
    assert (low, high) == pytest.approx(wilson_interval(9, 32), abs=0.01)  # about 32 observations
    # one attempt per task: tasks are the attempts, and the interval is about Wilson's
    one_each = task_clustered_interval([(1, 1)] * 9 + [(0, 1)] * 23)
    assert one_each[0] <= wilson_interval(9, 32)[0] and one_each[1] >= wilson_interval(9, 32)[1]
    assert one_each == pytest.approx(wilson_interval(9, 32), abs=0.01)
    assert task_clustered_interval([(0, 16)] * 32) == wilson_interval(0, 32)  # no spread: each task counts once
    assert task_clustered_interval([(3, 4)]) == (0.0, 1.0)  # one task says nothing beyond itself
    with pytest.raises(ValueError):
        task_clustered_interval([(5, 4), (0, 4)])


def _outcomes(path: Path, counts: dict[str, tuple[int, int]], infra: int = 0) -> None:
    rows = [{"task_id": task, "kind": "resolved" if n < resolved else "unresolved"}
            for task, (resolved, attempts) in counts.items() for n in range(attempts)]
    rows += [{"task_id": "t0", "kind": "infra_error"}] * infra
    path.write_text(json.dumps(rows))


def test_an_evaluation_reports_its_tasks_solved_and_the_interval_by_task(tmp_path):
    manifest = crafted_manifest("r", before=(2, 4), after=(6, 8))
    baseline = manifest.stages["baseline"]
    baseline.path = str(tmp_path)
    # 4/8 held-out: both attempts of two tasks, none of the other two; an infra failure counts nowhere
    _outcomes(tmp_path / "outcomes.json", {"t0": (2, 2), "t1": (2, 2), "t2": (0, 2), "t3": (0, 2)}, infra=1)
    _outcomes(tmp_path / "outcomes-train.json", {"t4": (1, 4), "t5": (1, 3)})  # 7 attempts, not the metrics' 8
    rates = before_after(learning_curve(manifest))
    held_out = rates["before"]["eval"]
    assert (held_out["tasks"], held_out["tasks_solved"]) == (4, 2)
    assert held_out["per_task"] == [[2, 2], [2, 2], [0, 2], [0, 2]]
    assert (held_out["task_low"], held_out["task_high"]) == task_clustered_interval([(2, 2)] * 2 + [(0, 2)] * 2)
    assert held_out["task_high"] - held_out["task_low"] > held_out["high"] - held_out["low"]
    assert "tasks" not in rates["before"]["train"]  # outcomes that do not add up to the metrics are not used
    assert "tasks" not in rates["after"]["eval"]  # no outcomes file: the per-attempt interval only
    rows = bench_table([{"arm": "grpo", "seed": seed, "rates": rates} for seed in (0, 1)], [])
    pooled = next(row for row in rows if row["seed"] == "all" and row["split"] == "eval" and row["phase"] == "before")
    assert (pooled["tasks"], pooled["tasks_solved"]) == (8, 4)  # a seed's tasks are observations of their own
    text = format_table(rows)
    assert "by task" in text and "2/4" in text

def test_the_rise_counts_the_seeds_whose_after_rate_clears_the_interval_before_it():
    def rate(resolved: int, tasks_solved_twice: int, tasks: int = 96) -> dict:
        # two attempts a task: `tasks_solved_twice` tasks solved in both, the rest of `resolved` once each
        once = resolved - 2 * tasks_solved_twice
        per_task = [[2, 2]] * tasks_solved_twice + [[1, 2]] * once + [[0, 2]] * (tasks - tasks_solved_twice - once)
        return rate_with_tasks(rate_of(resolved, 2 * tasks), per_task, 0.95)

    seeds = {0: (26, 43), 1: (26, 39), 2: (26, 30)}  # seed 0 clears both intervals, seed 1 only per attempt
    runs = [{"arm": "success_mass", "seed": seed, "rates": {"before": {"eval": rate(before, 8)},
                                                            "after": {"eval": rate(after, 16)}}}
            for seed, (before, after) in seeds.items()]
    rows = bench_table(runs, [])
    [rise] = seed_rises(rows)
    before = rate(26, 8)
    assert before["high"] < 39 / 192 < before["task_high"] < 43 / 192
    assert (rise["arm"], rise["split"], rise["seeds"]) == ("success_mass", "eval", 3)
    assert (rise["above_by_task"], rise["above_per_attempt"]) == (1, 2)
    assert [seed["rise"] for seed in rise["per_seed"]] == pytest.approx([17 / 192, 13 / 192, 4 / 192])
    assert "by task in 1 of 3 seeds, per attempt in 2 of 3" in format_rises([rise])
    # without outcomes by task, a seed is not counted as clearing the interval it has not got
    bare = [{**run, "rates": {phase: {"eval": rate_of(r["eval"]["resolved"], 192)} for phase, r in run["rates"].items()}}
            for run in runs]
    [rise] = seed_rises(bench_table(bare, []))
    assert (rise["above_by_task"], rise["by_task_known"], rise["above_per_attempt"]) == (0, 0, 2)


def test_the_summary_shows_each_arms_held_out_rate_per_seed_bold_only_above_the_interval_by_task():
    def rate(resolved: int, tasks_solved_twice: int, tasks: int = 96) -> dict:
        once = resolved - 2 * tasks_solved_twice
        per_task = [[2, 2]] * tasks_solved_twice + [[1, 2]] * once + [[0, 2]] * (tasks - tasks_solved_twice - once)
        return rate_with_tasks(rate_of(resolved, 2 * tasks), per_task, 0.95)

    # rft: seed 0 clears the interval by task; seed 1 only the per-attempt one, which is not enough
    figures = {("rft", 0): (26, 43), ("rft", 1): (26, 39), ("sft", 0): (26, 25), ("sft", 1): (26, 26)}
    runs = [{"arm": arm, "seed": seed, "rates": {"before": {"eval": rate(before, 8), "train": rate_of(5, 10)},
                                                 "after": {"eval": rate(after, 16), "train": rate_of(7, 10)}}}
            for (arm, seed), (before, after) in figures.items()]
    summary = format_summary(bench_table(runs, []))
    lines = summary.splitlines()
    assert lines[0] == "| arm | seed 0 | seed 1 | seeds pooled | above the interval |"
    assert lines[2] == "| rft | 26 -> **43/192** | 26 -> 39/192 | 52 -> **82/384** | 1 of 2 seeds |"
    assert lines[3] == "| sft | 26 -> 25/192 | 26 -> 26/192 | 52 -> 51/384 | 0 of 2 seeds |"
    assert len(lines) == 4  # the held-out split only
    assert "| rft | 5 -> 7/10 | 5 -> 7/10 | 10 -> 14/20 | 0 of 2 seeds |" in format_summary(bench_table(runs, []), "train")


def test_a_rise_inside_the_interval_before_it_can_still_be_clear_task_by_task():
    """The held-out tasks are the same before and after: read task by task, a rise that every task shares (or none
    loses) is clear where the interval of the rate before it, wide from the tasks' spread in difficulty, is not."""
    tasks = [f"t{n:02d}" for n in range(96)]
    before = [[2, 2]] * 12 + [[1, 2]] * 8 + [[0, 2]] * 76  # 32/192
    after = [[2, 2]] * 12 + [[2, 2]] * 8 + [[1, 2]] * 3 + [[0, 2]] * 73  # 43/192: 11 tasks up, none down
    runs = [{"arm": "success_mass", "seed": 1, "rates": {
        "before": {"eval": rate_with_tasks(rate_of(32, 192), before, 0.95, tasks)},
        "after": {"eval": rate_with_tasks(rate_of(43, 192), list(reversed(after)), 0.95, list(reversed(tasks)))}}}]
    [rise] = seed_rises(bench_table(runs, []))
    [seed] = rise["per_seed"]
    assert seed["above_by_task"] is False and rise["paired_above_zero"] == 1  # paired by id, not by position
    assert (seed["paired"]["tasks"], seed["paired"]["up"], seed["paired"]["down"]) == (96, 11, 0)
    assert seed["paired"]["rise"] == pytest.approx(11 / 192)
    assert seed["paired"]["sign_p"] == pytest.approx(2 / 2**11)
    assert "the rise's interval above zero in 1 of 1 seeds" in format_rises([rise])
    markdown = format_markdown(bench_table(runs, []))
    assert "| success_mass | held-out tasks | 1 | 32/192, 0.167 [" in markdown  # the interval by task
    assert "| 43/192, 0.224 [" in markdown and "**" not in markdown  # inside the interval before it: not bold
    assert "| +0.057 [+0.0" in markdown and ", 11 up, 0 down |" in markdown
    # the same counts with the gains and losses balanced: no clear change
    mixed = [[2, 2]] * 4 + [[1, 2]] * 8 + [[2, 2]] * 8 + [[1, 2]] * 3 + [[0, 2]] * 73
    runs[0]["rates"]["after"]["eval"] = rate_with_tasks(rate_of(43, 192), mixed, 0.95, tasks)
    [rise] = seed_rises(bench_table(runs, []))
    assert rise["paired_above_zero"] == 0 and rise["per_seed"][0]["paired"]["down"] == 8
    # without task ids (a report from before they were kept) there is no pairing, and nothing is counted
    runs[0]["rates"]["after"]["eval"] = rate_with_tasks(rate_of(43, 192), after, 0.95)
    [rise] = seed_rises(bench_table(runs, []))
    assert rise["per_seed"][0]["paired"] is None and rise["paired_known"] == 0


def test_the_last_arm_is_compared_with_each_other_arm_task_by_task_after_rl_per_seed_pooled_and_greedy():
    """Beating its own start is not beating the baselines: the last arm's rate after RL against each other arm's,
    on the same tasks of the same seed."""
    def rate(solved: set[int]) -> dict:
        by_task = {f"t{n}": [int(n in solved), 1] for n in range(8)}
        return rate_by_task(rate_of(len(solved), 8), by_task, 0.95)

    solved_after = {"rft": {0, 1, 2}, "success_mass": {0, 1, 2, 3, 4}}
    runs = [{"arm": arm, "seed": seed, "rates": {"before": {"eval": rate({0})},
                                                 "after": {"eval": rate(solved_after[arm])}},
             "greedy_after": {"eval": rate(solved_after[arm] - {0})}}
            for arm in ("rft", "success_mass") for seed in (0, 1)]
    warm = [{"seed": seed, "greedy": {"eval": rate({0})}} for seed in (0, 1)]
    contrasts = arm_contrasts(bench_table(runs, warm))
    found = {(item["arm"], item["against"], item["seed"]): (item["up"], item["down"], item["tasks"])
             for item in contrasts}
    assert found == {("success_mass", "rft", 0): (2, 0, 8), ("success_mass", "rft", 1): (2, 0, 8),
                     ("success_mass", "rft", "all"): (4, 0, 16),
                     ("success_mass greedy", "rft greedy", 0): (2, 0, 8),
                     ("success_mass greedy", "rft greedy", 1): (2, 0, 8),
                     ("success_mass greedy", "rft greedy", "all"): (4, 0, 16)}
    assert all(item["rise"] == pytest.approx(0.25) and item["split"] == "eval" for item in contrasts)
    assert format_contrasts(contrasts).splitlines()[0].startswith(
        "success_mass against rft after RL, held-out tasks, task by task: seed 0 +0.250 [")
    assert arm_contrasts(bench_table(runs[:2], warm)) == []  # one arm: nothing to compare it with


def test_the_sign_test_and_the_interval_of_a_mean():
    assert sign_test_p(0, 0) == 1.0 and sign_test_p(3, 3) == 1.0
    assert sign_test_p(9, 1) == pytest.approx(2 * 11 / 1024) == sign_test_p(1, 9)
    low, high = mean_interval([0.0, 1.0] * 50)
    assert low == pytest.approx(0.5 - 1.96 * 0.50252 / 10, abs=1e-4) and high == pytest.approx(1 - low)
    assert mean_interval([0.25, 0.25]) == (0.25, 0.25)
    with pytest.raises(ValueError):
        mean_interval([1.0])
    with pytest.raises(ValueError):
        sign_test_p(-1, 2)


def test_the_bench_runs_every_arm_and_seed_and_writes_its_report(tmp_path, monkeypatch):
    """The loop over arms and seeds, with `lego run` and `lego eval` replaced by stand-ins that leave what they
    leave: a manifest in the seed's work dir, an evaluation's JSON on stdout."""
    base = tmp_path / "bench"
    commands: list[list[str]] = []

    def child(args: list[str], log: Path) -> tuple[int, str, float]:
        commands.append(args)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("stand-in\n")
        work_dir = [arg.split("=", 1)[1] for arg in args if arg.startswith("project.work_dir=")][-1]  # the last wins
        if args[3] == "run":
            arm = next(arg.split("=", 1)[1] for arg in args if arg.startswith("train.adv_estimator="))
            steps = WorkDir.create(work_dir).root / "sft_steps.json"  # the warm start stage's per-step record
            steps.write_text(json.dumps([{"loss": 2.0, "token_accuracy": 0.4, "grad_norm": 3.0},
                                         {"loss": 0.5, "token_accuracy": 0.9, "grad_norm": 1.0}]))
            save_manifest(WorkDir.create(work_dir), crafted_manifest(f"run-{arm}-{len(commands)}", (2, 0), (5, 1),
                                                                     sft_steps=steps))
            return 0, "", 1.0
        if "--run" in args:  # an arm's last policy: 5 of 8 held-out tasks at greedy decoding
            assert args[args.index("--policy-version") + 1] == "2" and args[args.index("--split") + 1] == "eval"
            resolved = 5
        else:  # the warm start
            resolved = 3 if args[args.index("--split") + 1] == "train" else 0
        # one attempt per task, the first `resolved` tasks solved; a ninth task's only attempt an infra failure
        per_task = {f"task-{n}": {"attempts": 1, "resolved": int(n < resolved), "infra_errors": 0} for n in range(8)}
        per_task["task-8"] = {"attempts": 0, "resolved": 0, "infra_errors": 1}
        report = {"resolved": resolved, "attempts": 8, "per_task": per_task}
        data_run_id = f"eval-mini-swe-agent-{len(commands)}"
        return 0, json.dumps({"harnesses": {"mini-swe-agent": {"report": report, "data_run_id": data_run_id}}}), 1.0

    def failure_parts(work_dir, config, data_run_id):  # what lego.bench.failures reads from the stored evaluation
        assert Path(work_dir).name in ("seed-0", "seed-1") and data_run_id.startswith("eval-mini-swe-agent-")
        return {"resolved": 5, "function and body, not the path": 3}

    monkeypatch.setattr(bench, "_child", child)
    monkeypatch.setattr("lego.bench.failures.failure_parts", failure_parts)
    result = bench.bench_learn(None, None, config="family", arms="sft,grpo", seeds="0,1",
                               overrides=f"project.work_dir={base} tasks.limit=2")
    # per seed: the first arm's run, its warm start at greedy decoding on both splits, its last policy at greedy
    # decoding on the held-out split; then the next arm's run and its last policy
    assert [args[3] for args in commands] == ["run", "eval", "eval", "eval", "run", "eval"] * 2
    assert all("tasks.limit=2" in args for args in commands)
    evals = [args for args in commands if args[3] == "eval"]
    assert all("eval.temperature=0" in args for args in evals)
    assert sum("/warm/checkpoint" in args for args in evals) == 4 and sum("--run" in args for args in evals) == 4
    assert {(run["arm"], run["seed"]) for run in result["runs"]} == {("sft", 0), ("grpo", 0), ("sft", 1), ("grpo", 1)}
    assert [warm["greedy"]["train"]["resolved"] for warm in result["warmstart"]] == [3, 3]
    # each seed's warm start reports its own curve, drawn in a plot of its own
    assert result["warmstart"][0]["curve"] == [{"step": 1, "loss": 2.0, "token_accuracy": 0.4},
                                               {"step": 2, "loss": 0.5, "token_accuracy": 0.9}]
    assert Path(result["warmstart_plot"]).read_bytes()[:4] == b"\x89PNG"
    assert Path(result["plot"]).is_file() and Path(result["reports"], "learn_arms.json").is_file()
    table = {(row["arm"], row["seed"], row["split"], row["phase"]): row["resolved"] for row in result["table"]}
    assert table["grpo", 1, "eval", "after"] == 1 and table["warmstart-greedy", 0, "train", "before"] == 3
    assert table["sft", "all", "train", "after"] == 10
    # at greedy decoding: the warm start before, the arm's last policy after, on the held-out split only
    assert (table["grpo greedy", 1, "eval", "before"], table["grpo greedy", 1, "eval", "after"]) == (0, 5)
    assert ("grpo greedy", 1, "train", "after") not in table
    greedy_rises = {(rise["arm"], rise["split"]): rise for rise in result["rises"]}["sft greedy", "eval"]
    assert (greedy_rises["seeds"], greedy_rises["above_by_task"]) == (2, 2)
    # task by task: the same eight held-out tasks (the infra failure left out), five up and none down in each seed
    paired = greedy_rises["per_seed"][0]["paired"]
    assert (paired["tasks"], paired["up"], paired["down"], paired["rise"]) == (8, 5, 0, 5 / 8)
    assert 0 < paired["low"] < 5 / 8 < paired["high"] and paired["sign_p"] == pytest.approx(2 / 32)
    assert greedy_rises["paired_above_zero"] == 2
    assert result["warmstart_differs"] == []  # every arm of a seed started from the same warm start
    assert (result["complete"], len(result["done"])) == (True, 4)
    assert not Path(result["reports"], "learn_arms.txt").read_text().startswith("partial")
    assert {(rise["arm"], rise["split"]): rise["above_per_attempt"] for rise in result["rises"]}["grpo", "train"] == 2
    assert "after RL above the interval before it" in Path(result["reports"], "learn_arms.txt").read_text()
    assert result["runs"][1]["greedy_after"]["eval"]["failures"]["function and body, not the path"] == 3
    assert "seed 1 grpo: resolved 5, function and body, not the path 3" in \
        Path(result["reports"], "learn_arms.txt").read_text()
    summary = Path(result["reports"], "learn_summary.md").read_text()
    assert "| grpo greedy | 0 -> **5/8** | 0 -> **5/8** | 0 -> **10/16** | 2 of 2 seeds |" in summary
    markdown = Path(result["reports"], "learn_arms.md").read_text()
    assert "| grpo greedy | held-out tasks | 1 | 0/8, 0.000 [" in markdown and "| **5/8, 0.625** [" in markdown
    assert result["runs"][0]["arm_seconds"] == 0.0  # the stand-in's stages took no time
    # the last arm against the others, where outcomes by task are known (the stand-in's greedy evaluations): the
    # arms resolve the same tasks, so no task moves
    assert {(item["arm"], item["against"], item["seed"], item["up"], item["down"]) for item in result["contrasts"]} \
        == {("grpo greedy", "sft greedy", seed, 0, 0) for seed in (0, 1, "all")}
    assert "grpo greedy against sft greedy after RL, held-out tasks, task by task: seed 0 +0.000" in \
        Path(result["reports"], "learn_arms.txt").read_text()
    # the stand-ins' manifests give both arms of a seed the same stage keys: all their stages count as shared
    assert "sft: seed 0 0.0 min (0.0 min beside its seed's other arms" in \
        Path(result["reports"], "learn_arms.txt").read_text()
    assert {(time["arm"], time["seed"]) for time in result["arm_times"]} == {("sft", 0), ("grpo", 0), ("sft", 1),
                                                                            ("grpo", 1)}


def test_the_bench_says_when_an_arm_did_not_start_from_the_seeds_warm_start(tmp_path, monkeypatch):
    """A code edit between two runs of a seed (a shared working tree) changes the warm start's key."""
    runs = iter(["warm-a", "warm-b"])

    def child(args: list[str], log: Path) -> tuple[int, str, float]:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("")
        if args[3] == "eval":
            return 1, "", 1.0
        manifest = crafted_manifest(f"run-{len(log.name)}-{log.name}", (2, 0), (5, 1))
        manifest.stages["warmstart"].key = next(runs)
        work_dir = [arg.split("=", 1)[1] for arg in args if arg.startswith("project.work_dir=")][-1]
        save_manifest(WorkDir.create(work_dir), manifest)
        return 0, "", 1.0

    monkeypatch.setattr(bench, "_child", child)
    result = bench.bench_learn(None, None, config="family", arms="sft,grpo", seeds="0",
                               overrides=f"project.work_dir={tmp_path}")
    assert result["warmstart_differs"] == ["grpo seed 0"]


def test_a_bench_cut_short_leaves_the_report_of_every_arm_it_finished(tmp_path, monkeypatch):
    """Hours of arms on a small machine: a kill during the second arm keeps the first arm's table, marked partial."""
    class Killed(Exception):
        pass

    runs = 0

    def child(args: list[str], log: Path) -> tuple[int, str, float]:
        nonlocal runs
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("")
        if args[3] == "eval":
            return 1, "", 1.0  # no greedy evaluation: the report still stands on the runs
        runs += 1
        if runs == 2:
            raise Killed
        work_dir = [arg.split("=", 1)[1] for arg in args if arg.startswith("project.work_dir=")][-1]
        save_manifest(WorkDir.create(work_dir), crafted_manifest("run-sft", (2, 0), (5, 1)))
        return 0, "", 1.0

    monkeypatch.setattr(bench, "_child", child)
    with pytest.raises(Killed):
        bench.bench_learn(None, None, config="family", arms="sft,grpo", seeds="0",
                          overrides=f"project.work_dir={tmp_path}")
    (reports,) = (tmp_path / "reports").iterdir()
    report = json.loads((reports / "learn_arms.json").read_text())
    assert (report["complete"], report["done"]) == (False, ["sft seed 0"])
    assert {(row["arm"], row["phase"]) for row in report["table"] if row["split"] == "eval"} >= \
        {("sft", "before"), ("sft", "after")}
    for name in ("learn_arms.txt", "learn_arms.md", "learn_summary.md"):
        assert (reports / name).read_text().startswith("partial: 1 of 2 arm runs done (sft seed 0)")
    assert sorted(path.name for path in reports.iterdir() if path.name.startswith(".")) == []


def test_the_run_summary_states_the_held_out_rate_before_and_after_rl_and_draws_no_conclusion():
    from lego.pipeline.report import learning_lines

    lines = learning_lines(crafted_manifest("r", before=(2, 1), after=(6, 5)), {"sampling": {"temperature": 0.5}})
    (held,) = [line for line in lines if line.startswith("held-out tasks")]
    assert "1/8 = 12%" in held and "5/8 = 62%" in held and "transfer" not in held


def test_a_family_evaluations_failures_are_split_by_the_parts_of_the_command_they_wrote(tmp_path):
    """Stored through the real writer: five attempts at family tasks, one resolved and four failed, each with the
    first reply a policy could write (a parsed tool call, raw text that did not parse, an Anthropic tool_use)."""
    from lego import records
    from lego.bench.failures import command_parts, failure_parts, reply_text
    from lego.data.writer import DatasetWriter

    tasks = [task for task in family_tasks("constants", 0) if task.split == "eval"][:5]
    parts = [command_parts(task.provenance["gold_command"]) for task in tasks]
    assert all(parts) and parts[0]["path"] == tasks[0].provenance["fixed_files"][0]
    assert parts[0]["function"] == tasks[0].provenance["function"] and str(tasks[0].provenance["value"]) in \
        parts[0]["body"]
    assert command_parts("git diff") is None

    def tool_call(command: str) -> str:
        return json.dumps({"role": "assistant", "content": "I will apply the fix.", "tool_calls": [
            {"type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": command})}}]})

    def sed(part: dict, path: str) -> str:
        return f"sed -i '/def {part['function']}/,/^$/s/retu.*/{part['body']}/' {path} && git diff"

    replies = [
        tool_call(sed(parts[0], parts[0]["path"])),  # resolved
        tool_call(sed(parts[1], "appconf perform:")),  # the path garbled
        json.dumps({"role": "assistant", "content": "<tool_call>\n" + sed(parts[2], parts[2]["path"]) + "\n{{"}),
        json.dumps({"role": "assistant", "content": [{"type": "tool_use", "name": "bash", "input": {
            "command": f"sed -i '/def {parts[3]['function']}/d' x.py"}}]}),  # the function alone
        json.dumps({"role": "assistant", "content": "bash bash bash"}),
    ]
    assert parts[1]["body"] in reply_text(replies[1]) and "I will apply the fix." in reply_text(replies[1])
    assert f"def {parts[3]['function']}" in reply_text(replies[3])
    work = WorkDir.create(tmp_path / "work")
    config = crafted_config(tmp_path / "work")
    run_id = "eval-mini-swe-agent-0123456789ab"
    writer = DatasetWriter(work, run_id)
    writer.append_tasks(tasks)
    trajectories = []
    for index, (task, reply) in enumerate(zip(tasks, replies, strict=True)):
        call = records.LLMCall(call_index=0, protocol="openai_chat", started_at=1_800_000_000.0, latency_s=0.2,
                               prompt_tokens=20, completion_tokens=8, finish_reason="stop", segment_index=0,
                               kind="start", reply_json=reply)
        trajectories.append(records.Trajectory(
            rollout_id=f"{run_id}.{task.instance_id}.0", task_id=task.instance_id, harness="mini-swe-agent",
            policy_version=1, iteration=0, sample_index=index, segments=[], calls=[call],
            termination=records.TerminationReason.completed, harness_log=""))
    writer.append_trajectories(trajectories, stage="evaluate")
    grade(work, run_id, 0, trajectories, [R, U, U, U, U], "evaluate-verify")
    counts = failure_parts(work.root, config, run_id)
    assert counts == {"resolved": 1, "all three": 1, "function and body, not the path": 1, "function only": 1,
                      "none of them": 1, "other": 0, "infra_error": 0}
    assert failure_parts(work.root, config, "eval-mini-swe-agent-nothing") is None
