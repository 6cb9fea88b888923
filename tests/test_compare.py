"""`lego compare`: two harness runs side by side from MLflow, as a table, a PNG plot and an HTML page."""

from __future__ import annotations

import math

import pytest

from lego.config import load_config
from lego.evaluate.compare import compare_runs
from lego.evaluate.report import summarize_outcomes
from lego.evaluate.stats import wilson_interval
from lego.records import Outcome, OutcomeKind
from lego.track.tracker import Tracker
from lego.workdir import WorkDir


def test_wilson_interval_known_values():
    low, high = wilson_interval(5, 10, 0.95)
    assert low == pytest.approx(0.2366, abs=1e-4) and high == pytest.approx(0.7634, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    low, high = wilson_interval(10, 10, 0.95)
    assert high == 1.0 and low == pytest.approx(0.7225, abs=1e-4)


def test_report_keeps_infra_errors_apart():
    kinds = [OutcomeKind.resolved, OutcomeKind.unresolved, OutcomeKind.infra_error, OutcomeKind.cheat]
    outcomes = [Outcome(f"r{i}", f"t{i % 2}", kind) for i, kind in enumerate(kinds)]
    report = summarize_outcomes(outcomes, {"r0": (3, 100), "r1": (5, 300), "r2": (1, 10)}, harness="h",
                                policy_version=2)
    assert report.attempts == 3 and report.resolved == 1 and report.infra_errors == 1
    assert report.resolved_rate == pytest.approx(1 / 3) and report.cheat_rate == pytest.approx(1 / 3)
    assert (report.resolved_low, report.resolved_high) == pytest.approx(wilson_interval(1, 3))
    assert report.mean_turns == 4 and report.mean_tokens == 200  # the infra-error attempt is not averaged


def _eval_run(tracker, parent, run_id, harness, policy, resolved, attempts, infra):
    stage = tracker.start_stage_run(parent, run_id, "evaluate", 0)
    low, high = wilson_interval(resolved, attempts)
    tracker.set_tags(stage, {"lego.harness": harness, "lego.policy_version": policy,
                             "lego.artifact_key": f"key-{run_id}"})
    tracker.log_metrics(stage, {"attempts": attempts, "resolved": resolved, "resolved_rate": resolved / attempts,
                                "resolved_low": low, "resolved_high": high, "mean_turns": 4.0,
                                "mean_tokens": 900.0, "infra_error_rate": infra, "cheat_rate": 0.0})
    tracker.end(stage)


def test_compare_two_harness_runs(tmp_path):
    config = load_config("test", [f"project.work_dir={tmp_path / 'w'}"])
    tracker = Tracker(config, WorkDir.create(config.project.work_dir))
    for run_id, harness, resolved in (("run-mini", "mini-swe-agent", 3), ("run-oc", "opencode", 7)):
        parent = tracker.start_pipeline_run(run_id)
        _eval_run(tracker, parent, run_id, harness, 1, resolved, 10, 0.1)

    result = compare_runs(tracker, tmp_path / "out")
    rows = result["rows"]
    assert [(row["harness"], row["resolved"]) for row in rows] == [("mini-swe-agent", 3), ("opencode", 7)]
    assert rows[1]["ci_low"] == pytest.approx(wilson_interval(7, 10)[0])
    assert result["table"].row_count == 2
    png = result["png"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert "opencode" in result["html"].read_text()
    only = compare_runs(tracker, tmp_path / "out2", harnesses=["opencode"])["rows"]
    assert [row["run"] for row in only] == ["run-oc"] and not math.isnan(only[0]["resolved_rate"])
