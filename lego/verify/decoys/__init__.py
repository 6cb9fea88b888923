"""Decoy tests: copies of a graded test with one checked expectation changed, so that a correct fix fails them.

Why decoys. The graded code runs in the same process as pytest, and Python gives that process no private memory,
descriptors or threads: whatever the runner observes from inside can be forged from inside. What a forger cannot
forge is knowledge it does not have. Each graded test is graded beside k decoys: the same test with one expectation
(a compared value, an asserted truth, the expected exception, a tolerance check's target, through a helper too)
moved so that a correct implementation fails it. At every grading the real test and its decoys get fresh random
names (`test_<12 hex>`), are written in one random order where the test was, and all are rendered by one printer,
so no name, marker, docstring, comment, formatting, file or position tells them apart. Which of them is real is
kept on the host; the sandbox only sees the group. The perturbation is drawn anew at every grading (the site, the
values, their order), so there are no fixed decoys to learn.

The verdict (lego/verify/judge.py): resolved only when every real test passes and every decoy fails, in the
run of the whole files and in the runs of each FAIL_TO_PASS group alone. A decoy that passes beside its passing
real test is `cheat` (rule `decoy_passed`).

What it costs a forger. A forger that makes tests pass without computing the right answer (forged reports,
replaced test functions, always-equal objects, patched oracles, anything that acts on tests it cannot tell apart)
passes a decoy whenever it passes the real test, unless it can tell which member of the group is real. The members
differ only at one site, and the k+1 values there are exchangeable: numbers form an arithmetic progression with the
real value at a uniformly drawn rank; strings differ in one character at one position, drawn from the same
character class; exceptions are unrelated types. So a blind choice of which member to pass survives with
probability at most 1/(k+1) per graded test, and (1/(k+1))^n over n tests whose decoys are drawn independently.
An honest fix pays nothing: when the real test passes, the checked value equals the expectation, so it differs
from every decoy's (each decoy is validated once to fail under the gold patch, deterministically, in its call
phase; see `plan_candidates` and Verifier.decoy_plan).

Limits, stated plainly:
- A forger that knows the expected value (from the problem statement, or by guessing the natural one among the
  group, e.g. 0 among -2, 0, 2) can special-case it; that is hardcoding the answer, and decoys do not stop it.
- A flipped truth (`assert x` / `assert not x`, `is None` / `is not None`, a `pytest.raises` block dropped)
  allows one decoy, or k from two truths flipped together; it catches a forger that passes every test, not one
  that forces the asserted predicate to one answer, and a reader can bet on the member with no negation written in
  it (or the one that still expects an exception). Sites that change a value or an exception come first wherever a
  test has one.
- A singleton (`x is None` among `is True`, `is False`) or an order (`a == b` among `a < b`, `a > b`; also
  assertEqual/assertLess/assertGreater) gives k decoys that always read as the same three checks, but only where
  every passing run makes the check and nothing of the test catches its failure (reached.py): the real check then
  held, so the others cannot. An order assumes the compared type's order agrees with its equality (no `a == b`
  with `a < b`), as a flipped `>` already assumes that `<=` is its negation.
- A test with no checkable expectation (a bare call, a value it computes itself, an expectation that is also the
  code's input: `assert word == singularize(word)`) gets no decoy, or flipped comparisons; `lego tasks validate`
  names those tests. Its defence is then the in-process evidence alone.
- A string expectation that echoes the test's inputs (`sql_format("select 1") == "SELECT 1"`) leaves few characters
  whose change keeps that likeness: where none is left, a decoy is less like the inputs than the real value, which
  a forger comparing them can read (text_candidates prefers the characters that keep it).
"""


from __future__ import annotations

from lego.verify.decoys.candidates import plan_candidates
from lego.verify.decoys.layout import DecoyLayout, build_layout, mentions_outside, validation_layout
from lego.verify.decoys.model import DECOY_FORMAT, DecoyError, DecoyPlan, DecoysOfTest, NodeId

__all__ = ["DECOY_FORMAT", "DecoyError", "DecoyLayout", "DecoyPlan", "DecoysOfTest", "NodeId", "build_layout",
           "mentions_outside", "plan_candidates", "validation_layout"]
