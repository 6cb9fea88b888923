"""The whole pipeline end to end on the real stages: bundled task, tiny policy, mini-swe-agent in a Docker sandbox
through the proxy, grading in a fresh sandbox, the real dataset and train stages, evaluation; Prefect (test
harness) and MLflow on SQLite."""

from __future__ import annotations

from pathlib import Path

import pytest

from lego import CONFIGS_DIR

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def prefect_api():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def test_pipeline_end_to_end_real_stages(prefect_api, docker_engine, base_image, tiny_model_path, tmp_path):
    from flows.pipeline import pipeline_flow
    from lego.pipeline.manifest import load_manifest
    from lego.workdir import WorkDir

    work = tmp_path / "work"
    overrides = [f"project.work_dir={work}", "tasks.limit=1", "eval.limit=1", "rollout.samples_per_task=2",
                 "sampling.max_tokens=24", "harness.max_turns=2", "pipeline.iterations=1",
                 f"model.path={tiny_model_path}"]
    summary = pipeline_flow(config=str(CONFIGS_DIR / "test.yaml"), overrides=overrides)
    manifest = load_manifest(WorkDir(work), summary["run_id"])
    assert manifest.status == "completed"
    assert sorted(manifest.stages) == ["dataset/0", "evaluate/0", "rollout/0", "taskset", "train/0", "verify/0"]
    assert manifest.get("rollout", 0).metrics["rollouts"] == 2
    verify = manifest.get("verify", 0).metrics
    assert verify["outcomes"] == 2
    report = manifest.get("evaluate", 0)
    assert Path(report.outputs["eval_report"]).is_file()
    assert report.metrics["attempts"] + report.metrics["infra_errors"] == 1

    again = pipeline_flow(config=str(CONFIGS_DIR / "test.yaml"), overrides=overrides)
    assert again["computed"] == []
