"""Session fixtures for the tiny random-init Qwen3-MoE (import them into a test module to use them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lego.config import TinyModelSpec

# The smallest Qwen3-MoE shape (as TinyModelSpec fields): the copy-pretraining tests train it for a few steps, where
# its rows and its loop matter and what it learns does not.
TINY = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
            num_experts=2, num_experts_per_tok=1, moe_intermediate_size=8, intermediate_size=8)


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
