"""scripts/gpu_check.sh, CPU-sized: what a session lent a GPU runs, checked here at the size CI affords.

The script must run the real engine and trainer end to end and write one JSON the closing note can quote: Pearson
of train against inference log-probs with and without R3 and the seconds per optimizer step of each.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_cpu_size_writes_its_report(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": str(ROOT / ".venv" / "bin" / "python")}
    env.pop("OUT", None)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--cpu", str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["device"] == "cpu"
    assert report["inference_dtype"] == "bfloat16" and report["training_dtype"] == "float32"
    summary = report["summary"]
    # bf16 sampling against an fp32 forward: replaying the recorded routing agrees with inference at least as well as
    # letting the routers choose, and both are close on the tiny model
    assert summary["pearson_with_r3"] >= summary["pearson_without_r3"] - 1e-6
    assert summary["pearson_with_r3"] > 0.99
    assert 0.0 <= summary["routing_differs_share"] < 1.0
    for mode in ("with_r3", "without_r3"):
        trained = report["trainer_steps"][mode]
        assert len(trained["step_seconds"]) == 2 and all(s > 0 for s in trained["step_seconds"])
        assert trained["grad_norm"] > 0  # the steps trained on something
    assert report["trainer_steps"]["sampled_tokens"] > 0


def test_gpu_check_names_what_cannot_be_imported(tmp_path):
    """On a machine without the project's dependencies the script says which are missing instead of a traceback."""
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--cpu", str(tmp_path)],
                          env={**os.environ, "PYTHON": "/usr/bin/python3.11"}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 3
    assert "cannot import" in done.stderr and "torch" in done.stderr
