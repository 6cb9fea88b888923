"""Session fixtures for the tiny random-init Qwen3-MoE (import them into a test module to use them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lego.config import TinyModelSpec


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> Path:
    """A seeded tiny Qwen3-MoE checkpoint with the real Qwen3 tokenizer (policy version 0)."""
    from lego.engine.checkpoint import init_tiny_model

    return init_tiny_model(TinyModelSpec(), tmp_path_factory.mktemp("tiny-moe") / "model", seed=0)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_path):
    from lego.engine.tokenizer import load_tokenizer

    return load_tokenizer(tiny_model_path)


@pytest.fixture(scope="session")
def fp32_engine(tiny_model_path):
    """A float32 TransformersEngine: numerics close enough to a plain forward to compare exactly."""
    from lego.engine.transformers_engine import TransformersEngine

    engine = TransformersEngine(tiny_model_path, dtype="float32", max_batch_size=8, batch_wait_ms=20)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def plain_model(tiny_model_path):
    """The same checkpoint loaded as a plain float32 transformers model (the reference)."""
    from lego.engine.checkpoint import load_model

    return load_model(tiny_model_path, "float32")
