"""The engine a config names, over a checkpoint.

Apart from the package's `__init__` because every engine module imports the package: choosing among the engines
there made each user of one engine module (the trainer reading a checkpoint) import, and key, all of them
(lego.pipeline.keys: a stage's cache key covers the modules it imports).
"""

from __future__ import annotations

from pathlib import Path

from lego.config import LegoConfig
from lego.engine.base import Engine
from lego.errors import ConfigError


def make_engine(config: LegoConfig, model_path: str | Path, script: list[str] | None = None) -> Engine:
    """The engine named by `config.engine.kind` over the checkpoint at `model_path`.

    `scripted` wraps a transformers engine (the real model scores the scripted texts); `script` is its list of
    response texts.
    """
    settings = config.engine
    if settings.kind in ("transformers", "scripted"):
        from lego.engine.transformers_engine import TransformersEngine

        engine = TransformersEngine(model_path, dtype=settings.dtype, device=settings.device,
                                    max_batch_size=settings.max_batch_size, batch_wait_ms=settings.batch_wait_ms,
                                    max_context=config.model.context_length)
        if settings.kind == "transformers":
            return engine
        from lego.engine.scripted import ScriptedEngine
        from lego.engine.tokenizer import load_tokenizer

        return ScriptedEngine(engine, load_tokenizer(Path(model_path)), script or [])
    if settings.kind == "vllm":
        from lego.engine.vllm_engine import VLLMEngine

        return VLLMEngine(model_path, dtype=settings.dtype, max_context=config.model.context_length)
    raise ConfigError(f"engine.kind={settings.kind!r} is not known; use transformers, vllm or scripted")
