"""lego.engine.pool: which engines stay between stages, which are closed, and when a policy is loaded.

The real engines: the transformers engine is closed after each lease here; the vLLM engine's reuse across stages,
with its weights loaded in place, is tested on real vLLM in test_vllm_engine.py. The rules themselves are shown
with a double that counts what is made, loaded and closed.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from rollout_helpers import with_overrides

import lego.engine.factory
from lego.engine.pool import EnginePool


class CountingEngine:
    """Stands in for an engine: records loads and closes."""

    def __init__(self, path, keep_warm: bool) -> None:
        self.model_path, self.policy_version, self.keep_warm = Path(path), 0, keep_warm
        self.loads: list[tuple[Path, int]] = []
        self.closed = False

    def load_checkpoint(self, path, policy_version: int) -> None:
        self.loads.append((Path(path), policy_version))
        self.model_path, self.policy_version = Path(path), policy_version

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def made(monkeypatch):
    engines: list[CountingEngine] = []

    def make_engine(config, path, script=None):
        engines.append(CountingEngine(path, keep_warm=config.engine.kind == "vllm"))
        return engines[-1]

    monkeypatch.setattr(lego.engine.factory, "make_engine", make_engine)
    return engines


def test_a_kept_engine_takes_the_next_policy_in_place(lego_config, made):
    config = with_overrides(lego_config, engine={"kind": "vllm"})
    pool, lines = EnginePool(), []
    with pool.lease(config, "/ckpt/0", 0, lines.append) as first:
        pass
    with pool.lease(config, "/ckpt/1", 1, lines.append) as second:
        assert second is first and second.loads == [(Path("/ckpt/1"), 1)]
    with pool.lease(config, "/ckpt/1", 1, lines.append):  # already loaded: nothing to do
        pass
    assert len(made) == 1 and first.loads == [(Path("/ckpt/1"), 1)] and not first.closed
    assert [line.split(" (")[0] for line in lines] == [
        "started the vllm engine on policy version 0", "policy version 1 loaded into the running vllm engine",
        "the running vllm engine already serves policy version 1"]
    pool.close()
    assert first.closed


def test_other_engine_settings_get_their_own_engine(lego_config, made):
    pool = EnginePool()
    with pool.lease(with_overrides(lego_config, engine={"kind": "vllm", "dtype": "float32"}), "/ckpt/0", 0):
        pass
    with pool.lease(with_overrides(lego_config, engine={"kind": "vllm", "dtype": "bfloat16"}), "/ckpt/0", 0):
        pass
    assert len(made) == 2 and not any(engine.closed for engine in made)
    pool.close()
    assert all(engine.closed for engine in made)


def test_an_engine_that_does_not_keep_warm_is_closed_when_handed_back(lego_config, made):
    pool = EnginePool()
    for version in (0, 1):
        with pool.lease(lego_config, f"/ckpt/{version}", version):
            pass
    assert [engine.closed for engine in made] == [True, True] and all(not engine.loads for engine in made)


def test_a_stage_that_raises_closes_its_engine_and_the_next_starts_another(lego_config, made):
    config = with_overrides(lego_config, engine={"kind": "vllm"})
    pool = EnginePool()
    with pytest.raises(RuntimeError, match="the harness crashed"), pool.lease(config, "/ckpt/0", 0):
        raise RuntimeError("the harness crashed")
    with pool.lease(config, "/ckpt/0", 0) as engine:
        assert engine is made[1]
    assert made[0].closed and not made[1].closed


def test_a_failed_load_closes_the_kept_engine(lego_config, made):
    config = with_overrides(lego_config, engine={"kind": "vllm"})
    pool = EnginePool()
    with pool.lease(config, "/ckpt/0", 0) as engine:
        engine.load_checkpoint = lambda path, version: (_ for _ in ()).throw(OSError("no such checkpoint"))
    with pytest.raises(OSError, match="no such checkpoint"), pool.lease(config, "/ckpt/1", 1):
        pass
    assert made[0].closed
    with pool.lease(config, "/ckpt/1", 1) as engine:
        assert engine is made[1]


def test_leases_at_once_get_engines_of_their_own_and_one_is_kept(lego_config, made):
    config = with_overrides(lego_config, engine={"kind": "vllm"})
    pool = EnginePool()
    both_in, results = threading.Barrier(2), []

    def stage():
        with pool.lease(config, "/ckpt/0", 0) as engine:
            results.append(engine)
            both_in.wait(timeout=10)

    threads = [threading.Thread(target=stage) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(made) == 2 and results[0] is not results[1]
    assert sorted(engine.closed for engine in made) == [False, True]
    pool.close()
    assert all(engine.closed for engine in made)


def test_the_transformers_engine_is_closed_after_its_stage(lego_config, tiny_model_path):
    from lego.engine.transformers_engine import TransformersEngine

    assert lego_config.engine.kind == "transformers"
    pool = EnginePool()
    with pool.lease(lego_config, tiny_model_path, 0) as engine:
        assert isinstance(engine, TransformersEngine)
    assert engine._closed and not pool._idle
