"""`lego bench learn`: run the learning configuration end to end and print its curve.

It runs `lego run` with the given config (default `learn`) in a child process, exactly as a user would, then reads
the run's manifest: resolved rate with its Wilson interval per policy on the train and eval splits, the GRPO
groups with signal, each train step's metrics and the wall time of each stage (lego.pipeline.learning). The plot
is written beside the run's reports. A benchmark, not a test: it takes tens of minutes on a small machine.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

from lego.bench import register
from lego.config import LegoConfig
from lego.errors import LegoError, tail
from lego.workdir import WorkDir


@register("learn")
def bench_learn(config: LegoConfig, work: WorkDir, run_config: str = "learn") -> dict[str, Any]:
    """`run_config`: the config `lego run` gets (a name or a path)."""
    from lego.config import load_config
    from lego.pipeline.learning import learning_curve, plot_learning_curve
    from lego.pipeline.manifest import latest_run_id, load_manifest

    name = run_config
    learn = load_config(name)
    learn_work = WorkDir.create(learn.project.work_dir)
    started = time.monotonic()
    # The command line, not the flows: lego never imports the orchestration layer.
    done = subprocess.run([sys.executable, "-m", "lego_cli", "run", "-c", name], capture_output=True, text=True)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise LegoError(f"`lego run -c {name}` failed (exit {done.returncode}): {tail(done.stderr or done.stdout)}")
    manifest = load_manifest(learn_work, latest_run_id(learn_work))
    curve = learning_curve(manifest, learn.eval.confidence)
    png = plot_learning_curve(curve, learn_work.root / "reports" / manifest.run_id / "learning.png")
    return {"config": name, "wall_s": round(wall, 1), "plot": str(png), **curve}
