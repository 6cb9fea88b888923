"""`lego status`: each signature fires on a run crafted to show it, and a healthy run (finished or live) shows none.

Runs are crafted the way the pipeline leaves them, by tests/run_builders.py (shared with the dashboard's test).
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from run_builders import (
    IM_END,
    INFRA,
    MIXED,
    PAST,
    TASKS,
    TOOL_CALL_END,
    C,
    Iteration,
    R,
    U,
    craft_run,
    crafted_config,
    segment,
)
from typer.testing import CliRunner

from lego.pipeline.diagnosis import (
    TOOL_CALL_TOKEN,
    TURN_START_TOKEN,
    _rising,
    diagnose,
    format_diagnosis,
    reply_tool_calls,
)
from lego.pipeline.manifest import manifest_path
from lego.records import OutcomeKind
from lego.workdir import WorkDir


@pytest.fixture()
def config(tmp_path):
    return crafted_config(tmp_path / "work")


@pytest.fixture()
def work(config) -> WorkDir:
    return WorkDir.create(config.project.work_dir)


def signatures(diagnosis) -> set[str]:
    return {finding.signature for finding in diagnosis.findings}


def finding(diagnosis, signature: str):
    return next(f for f in diagnosis.findings if f.signature == signature)


# ------------------------------------------------------------------------------------------------ healthy


def test_a_healthy_finished_run_triggers_none(work, config):
    craft_run(work, config, "run-healthy", [Iteration(), Iteration()])
    diagnosis = diagnose(work, config, "run-healthy")
    assert diagnosis.findings == [], format_diagnosis(diagnosis)
    assert diagnosis.status == "completed" and diagnosis.current_stage is None
    assert [point["policy"] for point in diagnosis.curve] == [0, 1, 2]
    assert "no problem found" in format_diagnosis(diagnosis)


def test_a_healthy_live_run_triggers_none_and_shows_its_progress(work, config):
    # iteration 0 recorded, iteration 1's rollouts being stored: 6 of 12 so far
    craft_run(work, config, "run-live", [Iteration()], status="running",
              live=Iteration(kinds={"task-a": MIXED, "task-b": MIXED[:2]}))
    diagnosis = diagnose(work, config, "run-live")
    assert diagnosis.findings == [], format_diagnosis(diagnosis)
    assert diagnosis.current_stage == "rollout/1"
    assert diagnosis.stages_left[:2] == ["rollout/1", "verify/1"]
    assert [(s.data_run_id, s.stage, s.iteration, s.rollouts) for s in diagnosis.live] == [
        ("rollout-run-live-1", "rollout", 1, 6)]
    assert diagnosis.minutes_since_progress is not None and diagnosis.minutes_since_progress < 15


def test_a_grading_in_progress_shows_its_outcomes_so_far(work, config):
    manifest = craft_run(work, config, "run-grading", [Iteration(), Iteration()], status="running", stages_after=7)
    assert list(manifest.stages)[-1] == "rollout/1"
    graded = next(work.data.glob("rollout-run-grading-1/verify-*/iter=1"))
    os.utime(graded)  # the verify stage is writing its outcomes now
    diagnosis = diagnose(work, config, "run-grading")
    assert diagnosis.findings == [], format_diagnosis(diagnosis)
    assert diagnosis.current_stage == "verify/1"
    assert [(s.data_run_id, s.stage, s.iteration, s.rollouts, s.outcomes) for s in diagnosis.live] == [
        ("rollout-run-grading-1", "rollout", 1, 12, {"resolved": 6, "unresolved": 6})]


# ------------------------------------------------------------------------------------------------ signatures


def test_pearson_below_threshold_is_a_logprob_mismatch(work, config):
    craft_run(work, config, "run-pearson", [Iteration(), Iteration(pearson=0.93)])
    diagnosis = diagnose(work, config, "run-pearson")
    assert signatures(diagnosis) == {"logprob_mismatch"}
    found = finding(diagnosis, "logprob_mismatch")
    assert found.area == "trainer" and found.severity == "error"
    assert found.evidence["iterations_below"] == [1]
    assert found.evidence["pearson_by_iteration"] == {0: 0.99998, 1: 0.93}
    assert any("R3" in item for item in found.what_to_check)


def test_infra_errors_rising(work, config):
    infra = {"task-a": [R, U, R, INFRA], "task-b": [R, U, INFRA, U], "task-c": [INFRA, U, R, U]}
    manifest = craft_run(work, config, "run-infra", [Iteration(), Iteration(kinds=infra)])
    diagnosis = diagnose(work, config, "run-infra")
    assert signatures(diagnosis) == {"infra_errors_rising"}
    found = finding(diagnosis, "infra_errors_rising")
    assert found.area == "environment" and found.severity == "error"  # 3 of 12: at INFRA_ERROR_HIGH
    assert found.evidence["infra_error_rate_by_iteration"] == {0: 0.0, 1: 0.25}
    data_run = manifest.stages["rollout/1"].data["data_run_id"]
    assert found.evidence["rollout_ids"] == sorted([f"{data_run}-task-a-3", f"{data_run}-task-b-2",
                                                    f"{data_run}-task-c-0"])


@pytest.mark.parametrize(("series", "rising"), [
    ([(0, 0.0), (1, 0.1)], True),  # above the floor and above the first iteration
    ([(0, 0.1), (1, 0.1)], False),  # flat below the high mark
    ([(0, 0.02), (1, 0.04)], False),  # rising but under the floor
    ([(0, 0.3), (1, 0.26)], True),  # falling, but high
    ([(0, 0.06)], True),  # one iteration: compared with zero
    ([], False),
])
def test_the_rising_rule(series, rising):
    assert _rising(series, 0.05, 0.25) is rising


def test_groups_without_reward_variance_are_zero_variance_groups(work, config):
    solved = {task: [R, R, R, R] for task in TASKS}
    manifest = craft_run(work, config, "run-flat", [Iteration(), Iteration(kinds=solved)])
    diagnosis = diagnose(work, config, "run-flat")
    assert signatures(diagnosis) == {"zero_variance_groups"}
    found = finding(diagnosis, "zero_variance_groups")
    assert found.area == "policy" and found.severity == "error"
    assert found.evidence["groups_by_iteration"] == {0: {"in_loss": 3, "with_signal": 3},
                                                     1: {"in_loss": 3, "with_signal": 0}}
    data_run = manifest.stages["rollout/1"].data["data_run_id"]
    assert found.evidence["flat_groups"][0] == {"task_id": "task-a", "reward": 1.0,
                                                "rollout_ids": [f"{data_run}-task-a-{i}" for i in range(4)]}
    assert "3 all solved" in found.summary


def test_all_solved_groups_have_signal_under_the_success_mass_estimator(work, config):
    config.train.adv_estimator = "success_mass"  # it raises the likelier successes of an all-solved group too
    solved = {task: [R, R, R, R] for task in TASKS}
    craft_run(work, config, "run-solved", [Iteration(), Iteration(kinds=solved)])
    assert "zero_variance_groups" not in signatures(diagnose(work, config, "run-solved"))
    failed = {task: [U, U, U, U] for task in TASKS}
    craft_run(work, config, "run-failed", [Iteration(), Iteration(kinds=failed)])
    found = finding(diagnose(work, config, "run-failed"), "zero_variance_groups")
    assert found.evidence["groups_by_iteration"][1] == {"in_loss": 3, "with_signal": 0}


def test_replies_without_tool_calls_are_a_collapse(work, config):
    manifest = craft_run(work, config, "run-collapse", [Iteration(), Iteration(tool_calls=False)])
    diagnosis = diagnose(work, config, "run-collapse")
    assert signatures(diagnosis) == {"tool_call_collapse"}
    found = finding(diagnosis, "tool_call_collapse")
    assert found.area == "policy"
    by_iteration = found.evidence["by_iteration"]
    assert by_iteration["rollout/0"] == {"rollouts": 12, "rollouts_without_tool_call": 0, "share": 0.0,
                                         "replies": 36, "replies_without_tool_call": 12}
    assert by_iteration["rollout/1"]["share"] == 1.0
    data_run = manifest.stages["rollout/1"].data["data_run_id"]
    assert found.evidence["rollout_ids"][0] == f"{data_run}-task-a-0" and len(found.evidence["rollout_ids"]) == 10


def test_a_collapse_shows_while_the_rollout_stage_is_still_running(work, config):
    craft_run(work, config, "run-collapsing", [Iteration()], status="running",
              live=Iteration(kinds={"task-a": MIXED, "task-b": MIXED}, tool_calls=False))
    diagnosis = diagnose(work, config, "run-collapsing")
    assert signatures(diagnosis) == {"tool_call_collapse"}
    assert "rollout/1 (in progress)" in finding(diagnosis, "tool_call_collapse").summary


def test_reply_tool_calls_reads_sampled_calls_and_forced_openings():
    seg = segment([True, False, True])
    assert reply_tool_calls(seg.token_ids, seg.response_mask) == [True, False, True]
    # A forced call: `<tool_call>` closes the prompt of the reply's own turn (mask 0), the reply continues it.
    forced = np.array([TURN_START_TOKEN, 872, IM_END, TURN_START_TOKEN, 77091, TOOL_CALL_TOKEN, 515, 606,
                       TOOL_CALL_END, IM_END, TURN_START_TOKEN, 872, TOOL_CALL_TOKEN, IM_END, TURN_START_TOKEN, 77091,
                       40, IM_END], dtype=np.int32)
    mask = np.array([0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1], dtype=np.uint8)
    # the second reply's prompt mentions the tag in an earlier (user) turn: that is not its own call
    assert reply_tool_calls(forced, mask) == [True, False]
    assert reply_tool_calls(forced, np.zeros_like(mask)) == []


def test_learning_rate_at_zero(work, config):
    craft_run(work, config, "run-lr", [Iteration(), Iteration(learning_rate=0.0)])
    diagnosis = diagnose(work, config, "run-lr")
    assert signatures(diagnosis) == {"learning_rate_zero"}
    found = finding(diagnosis, "learning_rate_zero")
    assert found.area == "trainer" and found.evidence["iterations_at_zero"] == [1]


def test_an_evaluation_with_infra_errors_is_short_of_coverage(work, config):
    manifest = craft_run(work, config, "run-eval", [Iteration(), Iteration(eval_kinds=[R, INFRA])])
    diagnosis = diagnose(work, config, "run-eval")
    assert signatures(diagnosis) == {"eval_coverage_short"}
    found = finding(diagnosis, "eval_coverage_short")
    assert found.evidence["short"] == [{"evaluation": "evaluate/1", "split": "eval", "graded": 2, "planned": 4,
                                        "coverage": 0.5, "tasks_covered": 2, "tasks_planned": 2, "infra_errors": 2}]
    eval_run = manifest.stages["evaluate/1"].data["data_run_id"]
    assert found.evidence["rollout_ids"] == [f"{eval_run}-eval-b-0", f"{eval_run}-eval-b-1"]


def test_a_finished_run_missing_a_scheduled_evaluation_is_short_of_coverage(work, config):
    craft_run(work, config, "run-noeval", [Iteration(evaluate=False), Iteration()])
    diagnosis = diagnose(work, config, "run-noeval")
    assert signatures(diagnosis) == {"eval_coverage_short"}
    assert finding(diagnosis, "eval_coverage_short").evidence["missing"] == ["evaluate/0"]


def test_a_running_run_without_progress_is_stalled(work, config):
    craft_run(work, config, "run-stall", [Iteration(), Iteration()], status="running", stages_after=9)
    assert signatures(diagnose(work, config, "run-stall")) == set()  # it just moved
    later = datetime.now(UTC) + timedelta(minutes=20)
    diagnosis = diagnose(work, config, "run-stall", now=later)
    assert signatures(diagnosis) == {"stage_stalled"}
    found = finding(diagnosis, "stage_stalled")
    assert found.evidence["stage"] == "train/1" and found.evidence["minutes_since_progress"] >= 20
    assert found.area == "pipeline"
    assert signatures(diagnose(work, config, "run-stall", now=later, stall_minutes=30)) == set()


def test_all_rewards_zero(work, config):
    failed = {"task-a": [U, U, U, U], "task-b": [U, U, OutcomeKind.agent_timeout, U], "task-c": [U, U, U, U]}
    manifest = craft_run(work, config, "run-zero", [Iteration(), Iteration(kinds=failed)])
    diagnosis = diagnose(work, config, "run-zero")
    # rewards all 0 leave every group without variance too: both say so
    assert signatures(diagnosis) == {"rewards_all_zero", "zero_variance_groups"}
    found = finding(diagnosis, "rewards_all_zero")
    assert found.evidence["outcomes"] == {"unresolved": 11, "agent_timeout": 1}
    assert found.evidence["iterations"] == [1]
    assert found.evidence["rollout_ids"][0] == f"{manifest.stages['rollout/1'].data['data_run_id']}-task-a-0"


def test_cheat_rate_rising(work, config):
    cheating = {task: [R, U, R, C] for task in TASKS}
    craft_run(work, config, "run-cheat", [Iteration(), Iteration(kinds=cheating)])
    diagnosis = diagnose(work, config, "run-cheat")
    assert signatures(diagnosis) == {"cheat_rate_rising"}
    found = finding(diagnosis, "cheat_rate_rising")
    assert found.area == "policy" and found.severity == "error"
    assert found.evidence["cheat_rate_by_iteration"] == {0: 0.0, 1: 0.25}
    assert found.evidence["rules_fired"] == {"tests_modified": 3}
    assert len(found.evidence["rollout_ids"]) == 3


def test_a_failed_run(work, config):
    craft_run(work, config, "run-failed", [Iteration()], status="failed",
              summary={"error": "DockerUnavailableError: no Docker engine"})
    diagnosis = diagnose(work, config, "run-failed")
    assert signatures(diagnosis) == {"run_failed"}
    assert "DockerUnavailableError" in finding(diagnosis, "run_failed").summary


# ------------------------------------------------------------------------------------------------ the command


def test_the_command_prints_json_and_exits_1_on_an_error(work, config):
    from lego_cli import app

    craft_run(work, config, "run-a", [Iteration(), Iteration()])
    craft_run(work, config, "run-b", [Iteration(), Iteration(pearson=0.5)])
    older = PAST.timestamp()
    os.utime(manifest_path(work, "run-a"), (older, older))  # the newest manifest is run-b's
    runner = CliRunner()
    base = ["status", "-c", "test", f"project.work_dir={work.root}", "--json"]
    latest = runner.invoke(app, base)  # run-b was written last: the default
    assert latest.exit_code == 1, latest.output
    report = json.loads(latest.stdout)
    assert report["run_id"] == "run-b"
    assert [f["signature"] for f in report["findings"]] == ["logprob_mismatch"]
    assert report["findings"][0]["evidence"]["pearson_by_iteration"] == {"0": 0.99998, "1": 0.5}
    healthy = runner.invoke(app, ["status", "run-a", "-c", "test", f"project.work_dir={work.root}"])
    assert healthy.exit_code == 0, healthy.output
    assert "run run-a: completed" in healthy.stdout and "no problem found" in healthy.stdout
