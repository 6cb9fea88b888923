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
