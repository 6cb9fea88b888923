"""`lego bench sandbox` through the CLI, on two bundled tasks."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.docker


def test_bench_sandbox_reports_starts_execs_and_verifications_beside_bare_docker_run(docker_engine, base_image):
    from typer.testing import CliRunner

    from lego_cli import app

    result = CliRunner().invoke(app, ["bench", "sandbox", "-c", "test", "tasks.limit=2",
                                      f"docker.host={docker_engine.base_url}"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout[result.stdout.index("{"):])
    assert report["tasks"] == 2 and report["verify_resolved"] == 2
    assert report["bare_docker_run_s"]["n"] == 10 and "docker" in report["bare_docker_run_s"]["via"]
    for key in ("sandbox_start_s", "sandbox_close_s", "exec_roundtrip_ms", "verify_gold_s"):
        assert 0 < report[key]["median"] <= report[key]["p95"] <= report[key]["max"]
    assert report["exec_roundtrip_ms"]["n"] == 20
