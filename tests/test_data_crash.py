"""A writer killed with SIGKILL in the middle of a write leaves no partial file visible."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pyarrow.parquet as pq

from lego.data.catalog import Catalog
from lego.data.reader import iter_trajectories
from lego.data.writer import remove_stale_temp_files
from lego.workdir import WorkDir

WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from lego.data.writer import DatasetWriter
    from lego.records import Segment, Trajectory

    rng = np.random.default_rng(0)
    tokens = 40_000
    segment = Segment(token_ids=rng.integers(0, 151_000, tokens, dtype=np.int32),
                      response_mask=(rng.random(tokens) < 0.3).astype(np.uint8),
                      logprobs=-rng.random(tokens, dtype=np.float32),
                      routed_experts=rng.integers(0, 128, (tokens, 48, 8), dtype=np.uint8))
    writer = DatasetWriter(sys.argv[1], "crash")
    for batch in range(1000):
        writer.append_trajectories([
            Trajectory(rollout_id=f"b{batch}-{i}", task_id="t", harness="h", policy_version=0,
                       segments=[segment, segment]) for i in range(2)
        ])
        print(batch, flush=True)
""")


def test_sigkill_mid_write_leaves_only_complete_files(tmp_path):
    work = WorkDir(tmp_path / "work")
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(work.data)], stdout=subprocess.PIPE, text=True)
    killed_mid_write = False
    try:
        assert child.stdout.readline().strip() == "0", "the writer did not finish its first append"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and child.poll() is None:
            if any(work.data.glob("crash/*/iter=*/.*.tmp")):
                os.kill(child.pid, signal.SIGKILL)
                killed_mid_write = True
                break
            time.sleep(0.005)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
    assert killed_mid_write and child.returncode == -signal.SIGKILL
    leftovers = list(work.data.glob("crash/*/iter=*/.*.tmp"))
    assert leftovers, "the kill should have landed while a temp file was open"

    with Catalog.open(work) as catalog:
        visible = [path for table in ("rollouts", "segments", "llm_calls") for path in catalog.files(table)]
        assert all(not path.name.startswith(".") for path in visible)
        for path in visible:
            pq.read_metadata(path)  # every visible file is complete (a truncated file has no footer)
        rollouts = catalog.one("SELECT count(*) FROM rollouts")[0]
        assert rollouts >= 2 and rollouts % 2 == 0
        # every visible rollout has its segments: the rollouts file is written last
        assert catalog.one("SELECT count(*) FROM segments WHERE rollout_id IN (SELECT rollout_id FROM rollouts)") == (
            2 * rollouts,)
        trajectories = list(iter_trajectories(catalog, batch_size=1))
        assert len(trajectories) == rollouts
        assert all(t.segments[0].routed_experts.shape == (40_000, 48, 8) for t in trajectories)
    assert sorted(remove_stale_temp_files(work.data, older_than_s=0)) == sorted(leftovers)


def test_a_pipeline_run_removes_what_a_killed_writer_left_an_hour_ago_and_nothing_newer(tmp_path, lego_config):
    from lego.data.writer import TEMP_SUFFIX
    from lego.pipeline.pipeline_run import PipelineRun

    work = WorkDir.create(tmp_path / "work")
    iteration = work.data / "rollouts" / "run=old" / "iter=0"
    iteration.mkdir(parents=True)
    old, fresh = iteration / f".part-0.parquet{TEMP_SUFFIX}", iteration / f".part-1.parquet{TEMP_SUFFIX}"
    for path in (old, fresh):
        path.write_bytes(b"half a file")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    lines: list[str] = []
    PipelineRun(lego_config, work, log=lines.append, track=False)
    assert not old.exists() and fresh.exists()  # a writer still going is left alone
    assert any("removed 1 temp file" in line for line in lines)
