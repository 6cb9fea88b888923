"""lego.track.store_seed and lego.pipeline.prefect_env: a new work dir's MLflow store and Prefect database are copies
of the machine's empty migrated ones, and MLflow treats the store as one it made itself (schema at its head revision,
the default experiment added at the first open)."""

from __future__ import annotations

import sqlite3

from lego.config import load_config
from lego.track.store_seed import empty_store_template
from lego.track.tracker import Tracker
from lego.workdir import WorkDir


def _tracker(root):
    config = load_config("test", [f"project.work_dir={root}"])
    return Tracker(config, WorkDir.create(config.project.work_dir))


def test_a_new_store_is_seeded_from_the_machine_cache_and_works(tmp_path):
    first = _tracker(tmp_path / "a")
    template = empty_store_template()  # the first tracker on this machine built it
    with sqlite3.connect(template) as db:  # empty: no experiment, not even MLflow's default one
        assert db.execute("SELECT count(*) FROM experiments").fetchone() == (0,)
    second = _tracker(tmp_path / "b")
    for tracker, root in ((first, tmp_path / "a"), (second, tmp_path / "b")):
        assert tracker.client.get_experiment("0").name == "Default"
        own = tracker.client.get_experiment(tracker.experiment_id)
        assert own.artifact_location == (root / "mlflow" / "artifacts").as_uri()
        run = tracker.start_pipeline_run("run-a")
        tracker.log_metrics(run, {"loss": 0.5})
        assert tracker.client.get_run(run).data.metrics == {"loss": 0.5}
    # each work dir has its own store: nothing one logs shows in the other
    assert len(first.client.search_runs([first.experiment_id])) == 1
    assert len(second.client.search_runs([second.experiment_id])) == 1


def test_an_existing_store_is_left_as_it_is(tmp_path):
    first = _tracker(tmp_path / "a")
    run = first.start_pipeline_run("run-a")
    again = _tracker(tmp_path / "a")
    assert again.find_run({"lego.run_id": "run-a", "lego.kind": "pipeline"}) == run


def test_a_new_prefect_home_gets_the_migrated_empty_database(tmp_path, monkeypatch):
    """The copy is what Prefect's migrations leave (its revision, no runs); the servers that start on it run in
    tests/test_pipeline.py (`lego deploy`) and tests/test_run_output.py (`lego run`'s ephemeral API)."""
    from lego.pipeline.prefect_env import seed_prefect_database

    monkeypatch.delenv("PREFECT_API_DATABASE_CONNECTION_URL", raising=False)
    seed_prefect_database(tmp_path / "home")
    with sqlite3.connect(tmp_path / "home" / "prefect.db") as db:
        assert db.execute("SELECT count(*) FROM alembic_version").fetchone() == (1,)
        assert db.execute("SELECT count(*) FROM flow_run").fetchone() == (0,)
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "prefect.db").write_bytes(b"")
    seed_prefect_database(tmp_path / "kept")
    assert (tmp_path / "kept" / "prefect.db").read_bytes() == b""
