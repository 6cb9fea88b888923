"""Constraints (lego/engine/constraints.py) applied in an engine's own sampling loop, through xgrammar.

`GrammarMasks` compiles a constraint for the model's vocabulary once (compiled grammars are kept by their exact
text); each constrained generation gets a `GrammarMask`, whose matcher follows the tokens sampled so far and says,
as a bitmask over the vocabulary, which tokens may come next. The engine sets every other logit to -inf before it
samples, so the token sampled, and its log-prob, come from the masked distribution renormalised.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
import xgrammar as xgr

from lego.engine.constraints import Constraint, unenforceable
from lego.errors import ModelError

_BITS = torch.arange(32, dtype=torch.int32)
COMPILED_CACHE = 64  # compiled grammars a process keeps (a harness sends the same few tool sets again and again)


class GrammarMasks:
    """Compiles constraints for one tokenizer and vocabulary (`vocab_size`: the width of the model's logits)."""

    def __init__(self, tokenizer, vocab_size: int, threads: int = 2) -> None:
        self.vocab_size = vocab_size
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        # xgrammar's own cache is off: in 0.2.8 it gives a structural tag the token masks of another one that
        # differs only in the ids of its `token` formats (the mask of a named call of `read` allowed `bash` where
        # the matcher wanted `read`; tests/test_proxy_constraints.py), so compiled grammars are kept here, by their
        # exact text.
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=threads, cache_enabled=False)
        self._compiled: OrderedDict[str, xgr.CompiledGrammar] = OrderedDict()

    def compile(self, constraint: Constraint) -> xgr.CompiledGrammar:
        """Not safe to call from several threads at once (the caller holds a lock)."""
        compiled = self._compiled.get(constraint.structural_tag)
        if compiled is not None:
            self._compiled.move_to_end(constraint.structural_tag)
            return compiled
        try:
            compiled = self.compiler.compile_structural_tag(constraint.structural_tag)
        except RuntimeError as exc:  # xgrammar's InvalidJSONError, InvalidStructuralTagError and schema errors
            raise unenforceable(constraint, str(exc) or type(exc).__name__) from exc
        self._compiled[constraint.structural_tag] = compiled
        if len(self._compiled) > COMPILED_CACHE:
            self._compiled.popitem(last=False)
        return compiled

    def mask(self, compiled: xgr.CompiledGrammar, stop_token_ids: Sequence[int]) -> GrammarMask:
        return GrammarMask(compiled, stop_token_ids, self.vocab_size)


class GrammarMask:
    """One generation's place in its grammar. Once the grammar is complete only `stop_token_ids` are allowed."""

    def __init__(self, compiled: xgr.CompiledGrammar, stop_token_ids: Sequence[int], vocab_size: int) -> None:
        if not stop_token_ids:
            raise ModelError("a constrained generation needs stop token ids (the grammar ends with one)")
        self.matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=list(stop_token_ids))
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self.vocab_size = vocab_size

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """A copy of fp32 `logits` [vocab] with every token the grammar does not allow next at -inf. The bitmask
        (bit j of word i: token 32 i + j) is unpacked with torch: 0.3 ms for Qwen3's vocabulary, where xgrammar's
        own CPU kernel took 7."""
        self.matcher.fill_next_token_bitmask(self.bitmask)
        allowed = ((self.bitmask[0].unsqueeze(-1) >> _BITS) & 1).flatten()[: self.vocab_size].bool()
        return logits.masked_fill(~allowed, float("-inf"))

    def accept(self, token: int) -> None:
        if not self.matcher.accept_token(token):
            raise ModelError(f"token {token} was sampled outside its grammar; the logits mask was not applied")

    @property
    def complete(self) -> bool:
        """The grammar is complete and its stop token was sampled."""
        return self.matcher.is_terminated()
