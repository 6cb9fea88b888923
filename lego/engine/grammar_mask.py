"""Constraints (lego/engine/constraints.py) applied in an engine's own sampling loop, through xgrammar.

`GrammarMasks` compiles a constraint for the model's vocabulary once (xgrammar caches compiled grammars by their
text); each constrained generation gets a `GrammarMask`, whose matcher follows the tokens sampled so far and says,
as a bitmask over the vocabulary, which tokens may come next. The engine sets every other logit to -inf before it
samples, so the token sampled, and its log-prob, come from the masked distribution renormalised.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch
import xgrammar as xgr

from lego.engine.constraints import Constraint, ConstraintError
from lego.errors import ModelError

_NATIVE_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:[0-9]+: ")  # "[08:27:43] /project/cpp/file.cc:4950: " of a C++ error


class GrammarMasks:
    """Compiles constraints for one tokenizer and vocabulary (`vocab_size`: the width of the model's logits)."""

    def __init__(self, tokenizer, vocab_size: int, threads: int = 2) -> None:
        self.vocab_size = vocab_size
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=threads)

    def compile(self, constraint: Constraint) -> xgr.CompiledGrammar:
        try:
            return self.compiler.compile_structural_tag(constraint.structural_tag)
        except RuntimeError as exc:  # xgrammar's InvalidJSONError, InvalidStructuralTagError and schema errors
            reason = _NATIVE_PREFIX.sub("", str(exc).strip().splitlines()[-1]) if str(exc).strip() else type(exc).__name__
            raise ConstraintError(f"'{constraint.param}' asks for {constraint.what}, which the engine cannot "
                                  f"enforce ({reason}); simplify the JSON schema (or leave the constraint out)",
                                  constraint.param) from exc

    def mask(self, compiled: xgr.CompiledGrammar, stop_token_ids: Sequence[int]) -> GrammarMask:
        return GrammarMask(compiled, stop_token_ids, self.vocab_size)


class GrammarMask:
    """One generation's place in its grammar. Once the grammar is complete only `stop_token_ids` are allowed."""

    def __init__(self, compiled: xgr.CompiledGrammar, stop_token_ids: Sequence[int], vocab_size: int) -> None:
        if not stop_token_ids:
            raise ModelError("a constrained generation needs stop token ids (the grammar ends with one)")
        self.matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=list(stop_token_ids))
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """A copy of fp32 `logits` [vocab] with every token the grammar does not allow next at -inf."""
        self.matcher.fill_next_token_bitmask(self.bitmask)
        masked = logits.clone()[None]
        xgr.apply_token_bitmask_inplace(masked, self.bitmask)
        return masked[0]

    def accept(self, token: int) -> None:
        if not self.matcher.accept_token(token):
            raise ModelError(f"token {token} was sampled outside its grammar; the logits mask was not applied")

    @property
    def complete(self) -> bool:
        """The grammar is complete and its stop token was sampled."""
        return self.matcher.is_terminated()
