"""Engines: token ids in, token ids + log-probs + routed experts out. lego.engine.factory.make_engine picks one by
config."""

from __future__ import annotations

from lego.engine.base import Engine, GenerateResult, SamplingParams

__all__ = ["Engine", "GenerateResult", "SamplingParams"]
