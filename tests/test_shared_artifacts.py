"""A stage result shared through the machine's cache (the warm start's, lego.pipeline.artifacts.run_cached with
`shared`): computed once, then served to another work dir with its paths moved there and its data run copied
beside that work dir's; a killed copy never counts."""

from __future__ import annotations

import json
from pathlib import Path

from lego.config import load_config
from lego.pipeline.artifacts import StageContext, StageOutput, run_cached
from lego.workdir import WorkDir


def context(root: Path) -> StageContext:
    return StageContext(config=load_config("test", []), work=WorkDir.create(root), run_id="run-test", runner=None)


def test_a_result_computed_in_one_work_dir_is_served_to_another_with_its_paths_moved(tmp_path):
    shared = tmp_path / "machine-cache"
    calls: list[Path] = []

    def compute(directory: Path) -> StageOutput:
        calls.append(directory)
        (directory / "checkpoint").mkdir()
        (directory / "checkpoint" / "weights.bin").write_bytes(b"\x01\x02")
        data_run = ctx.work.data / "warmstart-abc" / "warmstart" / "iter=0"
        data_run.mkdir(parents=True)
        (data_run / "rollouts-1.parquet").write_bytes(b"PAR1")
        return StageOutput(metrics={"steps": 3.0}, outputs={"checkpoint": directory / "checkpoint"},
                           data={"policy_path": str(directory / "checkpoint"), "data_run_id": "warmstart-abc",
                                 "policy_version": 1})

    ctx = context(tmp_path / "first")
    first = run_cached(ctx, "warmstart", None, {"tasks": "t"}, compute, shared=shared)
    assert not first.cached and len(calls) == 1
    assert (shared / first.key / "artifact" / "result.json").is_file()
    assert (shared / first.key / "data" / "warmstart-abc" / "warmstart" / "iter=0" / "rollouts-1.parquet").is_file()

    ctx = context(tmp_path / "second")
    second = run_cached(ctx, "warmstart", None, {"tasks": "t"}, compute, shared=shared)
    assert second.cached and len(calls) == 1 and second.key == first.key
    moved = ctx.work.artifacts / "warmstart" / first.key
    assert second.path == str(moved)
    assert second.outputs["checkpoint"] == str(moved / "checkpoint") == second.data["policy_path"]
    assert (moved / "checkpoint" / "weights.bin").read_bytes() == b"\x01\x02"
    assert second.data["policy_version"] == 1 and second.metrics == first.metrics
    assert (ctx.work.data / "warmstart-abc" / "warmstart" / "iter=0" / "rollouts-1.parquet").is_file()
    # served from the work dir's own artifact from now on
    third = run_cached(ctx, "warmstart", None, {"tasks": "t"}, compute, shared=shared)
    assert third.cached and third.path == second.path and len(calls) == 1
    # other inputs, another key: computed
    run_cached(ctx, "warmstart", None, {"tasks": "other"}, _writer(calls), shared=shared)
    assert len(calls) == 2


def _writer(calls: list[Path]):
    def compute(directory: Path) -> StageOutput:
        calls.append(directory)
        (directory / "out.json").write_text(json.dumps({}))
        return StageOutput(outputs={"out": directory / "out.json"})

    return compute


def test_an_incomplete_copy_in_the_machine_cache_is_not_served(tmp_path):
    shared = tmp_path / "machine-cache"
    calls: list[Path] = []
    ctx = context(tmp_path / "work")
    key = run_cached(ctx, "warmstart", None, {"tasks": "t"}, _writer(calls), shared=shared).key
    (shared / key / "artifact" / "result.json").unlink()  # as a copy killed before its result was written
    other = context(tmp_path / "other")
    result = run_cached(other, "warmstart", None, {"tasks": "t"}, _writer(calls), shared=shared)
    assert not result.cached and len(calls) == 2

