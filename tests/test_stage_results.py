"""A stage's result file: what is stored, and what reads as a cache hit."""

from __future__ import annotations

import json

from lego.pipeline.artifacts import RESULT_FILE, StageResult, artifact_dir, load_result
from lego.pipeline.manifest import RunManifest, load_manifest, save_manifest
from lego.workdir import WorkDir


def test_a_metric_the_stage_could_not_measure_is_absent_and_the_result_still_loads(tmp_path):
    work = WorkDir.create(tmp_path / "work")
    directory = artifact_dir(work, "train", "k")
    directory.mkdir(parents=True)
    result = StageResult(stage="train", iteration=0, key="k", path=str(directory),
                         metrics={"loss": 0.5, "routing_differs_share": float("nan"), "grad_norm": None})
    assert result.metrics == {"loss": 0.5}
    # a file written with null for an unmeasured metric (JSON has no NaN) is still the stage's result: a cache hit,
    # and a manifest holding it loads
    (directory / RESULT_FILE).write_text(json.dumps(
        {**result.model_dump(), "metrics": {"loss": 0.5, "routing_differs_share": None}}))
    loaded = load_result(work, "train", "k")
    assert loaded is not None and loaded.cached and loaded.metrics == {"loss": 0.5}
    manifest = RunManifest(run_id="r", created_at="2026-12-06T00:00:00Z", stages={"train/0": loaded})
    path = save_manifest(work, manifest)
    stored = json.loads(path.read_text())
    stored["stages"]["train/0"]["metrics"]["kl_to_inference"] = None
    path.write_text(json.dumps(stored))
    assert load_manifest(work, "r").stages["train/0"].metrics == {"loss": 0.5}
