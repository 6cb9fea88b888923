"""`lego bench dataset` runs end to end (on a small token count here) and reports exact round trips."""

from __future__ import annotations

from lego.bench import BENCHMARKS
from lego.bench.dataset import bench_dataset
from lego.config import LegoConfig
from lego.workdir import WorkDir


def test_dataset_benchmark_small(tmp_path):
    work = WorkDir.create(tmp_path / "work")
    result = bench_dataset(LegoConfig(), work, tokens=40_000)
    assert BENCHMARKS["dataset"] is bench_dataset
    assert result["tokens_per_shape"] >= 40_000
    for name, shape in result["shapes"].items():
        assert shape["lego"]["exact_round_trip"], name
        assert 0 < shape["lego"]["bytes_per_token"] < shape["raw_bytes_per_token"]
        assert shape["plain_pyarrow"]["bytes_per_token"] > 0
    assert list(work.root.glob("bench-dataset-*")) == []  # scratch data removed
