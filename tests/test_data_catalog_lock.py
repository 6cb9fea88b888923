"""When another process holds the catalog file, Catalog.open falls back to in-memory views over the same files."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np

from lego.data.catalog import Catalog
from lego.data.synthetic import synthetic_trajectory
from lego.data.writer import DatasetWriter
from lego.workdir import WorkDir

HOLDER = textwrap.dedent("""
    import sys, duckdb
    connection = duckdb.connect(sys.argv[1])
    print("holding", flush=True)
    sys.stdin.read()
""")


def test_locked_catalog_falls_back_to_memory(tmp_path):
    work = WorkDir(tmp_path / "work")
    DatasetWriter(work, "run").append_trajectories([synthetic_trajectory(np.random.default_rng(0), "r", "t")])
    Catalog.open(work).close()  # create the catalog file
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(work.catalog)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        with Catalog.open(work) as catalog:
            assert catalog.path is None
            assert catalog.one("SELECT count(*) FROM rollouts") == (1,)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    with Catalog.open(work) as catalog:
        assert catalog.path == work.catalog
