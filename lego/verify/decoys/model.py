"""A decoy plan's records (sites, variants, the plan cached per task), test ids, and how a grading draws a
site's variants."""

from __future__ import annotations

import ast
import random
import re
import threading
from dataclasses import dataclass

from pydantic import BaseModel, Field

from lego.errors import LegoError

_PARSE_LOCK = threading.Lock()


def parse_python(source: str, mode: str = "exec") -> ast.AST:
    """ast.parse, one thread at a time: CPython 3.11's parser keeps its recursion depth per interpreter, and two
    threads parsing at once (gradings run in parallel) fail with "AST constructor recursion depth mismatch"."""
    with _PARSE_LOCK:
        return ast.parse(source, mode=mode)


def literal(text: str):
    """The value of a literal's source (ast.literal_eval of a string parses it: one thread at a time too)."""
    return ast.literal_eval(parse_python(text, mode="eval").body)

DECOY_FORMAT = 18  # bump when site finding, candidates or rendering change: it is part of a plan's cache key
MAX_SITES_PER_TEST = 2
MAX_VARIANTS_PER_SITE = 10  # candidates validated per site: the gold run's size grows with it
NAME_HEX = 12

EQUALITY_CALLS = frozenset({
    "assertEqual", "assertEquals", "assertListEqual", "assertDictEqual", "assertTupleEqual", "assertSetEqual",
    "assertSequenceEqual", "assertCountEqual", "assertMultiLineEqual", "assertAlmostEqual", "assertAlmostEquals",
    "isclose", "allclose", "array_equal", "assert_allclose", "assert_array_equal", "assert_array_almost_equal",
    "assert_almost_equal", "assert_equal", "assert_approx_equal", "approx"})
# An oracle named for equality (`operator.eq`, `more_itertools.all_equal`, `np.array_equal`, `assert_frame_equal`):
# a literal it is given is an expectation, so an oracle forced to say yes passes a decoy that changes it.
EQUALITY_NAME = re.compile(r"(?:^|_)(?:eq|equal|equals|isclose|allclose|close|approx|same)(?:$|_)", re.IGNORECASE)


# An oracle that checks a difference (`assertNotEqual`, `assert_not_equal`): a literal it is given is not what the
# code must produce, and another value there is no decoy (it would pass beside the real check, or fail for a
# different correct answer).
NEGATED_NAME = re.compile(r"(?:^|_)[Nn]ot(?:$|_)|Not[A-Z]|^ne$")


def is_equality_call(name: str) -> bool:
    if NEGATED_NAME.search(name):
        return False
    return name in EQUALITY_CALLS or bool(EQUALITY_NAME.search(name)) or name.startswith("assert") and "Equal" in name


# A comparison and its complement: when the real one holds, the complement does not.
COMPLEMENTS = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt,
               ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
# unittest's checks and their complements: when the real one passes, the other fails (the same arguments).
FLIP_CALLS = {"assertTrue": "assertFalse", "assertFalse": "assertTrue", "assertIsNone": "assertIsNotNone",
              "assertIsNotNone": "assertIsNone", "assertIs": "assertIsNot", "assertIsNot": "assertIs",
              "assertIn": "assertNotIn", "assertNotIn": "assertIn", "assertIsInstance": "assertNotIsInstance",
              "assertNotIsInstance": "assertIsInstance", "assertEqual": "assertNotEqual",
              "assertNotEqual": "assertEqual", "assertAlmostEqual": "assertNotAlmostEqual",
              "assertNotAlmostEqual": "assertAlmostEqual", "assertRegex": "assertNotRegex",
              "assertNotRegex": "assertRegex", "assertGreater": "assertLessEqual", "assertLessEqual": "assertGreater",
              "assertLess": "assertGreaterEqual", "assertGreaterEqual": "assertLess"}
# Of <, == and >, one holds at most (in an order that agrees with its equality): where the real check asserts one,
# each decoy asserts one of the other two, so the group always reads as the same three comparisons.
ORDER_OPS: dict[type, tuple[type, type]] = {ast.Eq: (ast.Lt, ast.Gt), ast.Lt: (ast.Eq, ast.Gt),
                                            ast.Gt: (ast.Lt, ast.Eq)}
ORDER_SYMBOLS: dict[str, type] = {"<": ast.Lt, "==": ast.Eq, ">": ast.Gt}
ORDER_CALLS = {"assertEqual": ("assertLess", "assertGreater"), "assertLess": ("assertEqual", "assertGreater"),
               "assertGreater": ("assertLess", "assertEqual")}
SINGLETONS = (None, True, False)  # `x is None` holds: `x is True` and `x is False` cannot
RAISES_CALLS = frozenset({"raises", "assertRaises", "assertRaisesRegex", "assertRaisesRegexp"})
# Exceptions that pytest does not report as a failure when they escape a test (a skip, an exit, an interrupt): a
# decoy that lets one escape would not fail. Matched against every name in the expected-exception expression.
NOT_FAILURES = frozenset({"BaseException", "SystemExit", "KeyboardInterrupt", "GeneratorExit", "SkipTest",
                          "Skipped", "XFailed", "Exit", "OutcomeException"})
# Builtin exceptions a decoy may expect instead; one related to the real type by inheritance is never drawn.
EXCEPTIONS = ("ValueError", "TypeError", "KeyError", "IndexError", "AttributeError", "RuntimeError",
              "ZeroDivisionError", "NotImplementedError", "UnicodeDecodeError", "OverflowError", "FileNotFoundError",
              "RecursionError")


class DecoyError(LegoError):
    """Decoys could not be made for a test file (it does not parse, or a graded test is not in it)."""


class Variant(BaseModel):
    """One way to change a site: the value a decoy expects there (as Python source), or a flip."""

    replacement: str = ""  # a literal's source (value), an exception name (exception); empty for flips
    family: str  # variants drawn together share a family: a step of a progression, a character position
    offset: int = 0  # a number's offset in steps from the real value (progressions only)
    # A parametrize table's variant: each case's id as the real test has it -> as pytest names the case here (an id
    # made from a value changes with it; the decoy's ids are its own, as the real test's are).
    ids: dict[str, str] = Field(default_factory=dict)
    # A pair of truth checks' variant: the checks it flips, each as (its index in ast.walk order, its flip kind).
    flips: list[tuple[int, str]] = Field(default_factory=list)
    # An accepted set's variant: every member's changed literal, as (its index in ast.walk order, its source).
    also: list[tuple[int, str]] = Field(default_factory=list)


class SitePool(BaseModel):
    """A checked expectation of one test and the variants that fail under the gold patch."""

    site: int  # the node's index in ast.walk order over the test function
    # value | param | bits | accepted | exception | singleton | order | flip_assert | flip_is | flip_compare | flip_call |
    # flip_raises | flip_pair
    kind: str
    variants: list[Variant]
    # On a line the test patch wrote. A site on a line the repository already had can be read off its pristine copy
    # (git, the snapshot) by the graded code: the member that agrees with it is the real one.
    written: bool = True
    # How the real test is written beside these variants, where that differs from the file (a parametrize table:
    # its rows and ids written out, as each variant has them); empty: the real test as it is.
    real: str = ""


class DecoysOfTest(BaseModel):
    test: str
    pools: list[SitePool] = Field(default_factory=list)
    reason: str = ""  # why no decoy can be made, when none can

    def available(self, k: int) -> int:
        """How many decoys a grading can draw for this test (at one site: k, or fewer where the site allows)."""
        return max((len(draw_variants(pool, k, random.Random(0))) for pool in self.pools), default=0)


class DecoyPlan(BaseModel):
    """A task's validated decoy sites: made once (lego tasks validate, or the first grading) and cached."""

    format: int = DECOY_FORMAT
    tests: dict[str, DecoysOfTest] = Field(default_factory=dict)
    reason: str = ""  # why the task has no plan at all (no gold patch)
    # Test files graded as they are, under their own names, with no decoys: rewriting them changed what their tests
    # do under the gold patch (a test that reads its own name, state shared with a decoy that stopped half-way).
    untouched: dict[str, str] = Field(default_factory=dict)

    def coverage(self, tests: list[str], k: int) -> dict[str, int]:
        return {test: (self.tests[test].available(k) if test in self.tests else 0) for test in tests}


@dataclass(frozen=True)
class NodeId:
    """`path::[Class::]name[params]`, split."""

    path: str
    owner: str | None
    name: str
    params: str = ""

    @classmethod
    def parse(cls, test_id: str) -> NodeId:
        path, _, rest = test_id.partition("::")
        params = ""
        if "[" in rest and rest.endswith("]"):
            rest, params = rest[:rest.index("[")], rest[rest.index("["):]
        parts = rest.split("::")
        owner = "::".join(parts[:-1]) or None
        return cls(path, owner, parts[-1], params)

    @property
    def function(self) -> tuple[str, str | None, str]:
        return (self.path, self.owner, self.name)

    def renamed(self, name: str) -> str:
        owner = f"{self.owner}::" if self.owner else ""
        return f"{self.path}::{owner}{name}{self.params}"


def find_function(module: ast.Module, owner: str | None, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    body = module.body
    if owner:
        classes = [node for node in module.body if isinstance(node, ast.ClassDef) and node.name == owner]
        if not classes:
            return None
        body = classes[-1].body
    functions = [node for node in body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                 and node.name == name]
    return functions[-1] if functions else None  # the last definition is the one Python keeps


def defining_class(module: ast.Module, owner: str, name: str) -> str | None:
    """The class of the module whose body defines the test method `owner::name`: `owner` itself, or the one class of
    the module that `owner` inherits it from. None when no class of the module defines it, when two might, or when a
    base class from elsewhere (other than `object` and unittest's TestCase) might come first in the method order."""
    classes = {node.name: node for node in module.body if isinstance(node, ast.ClassDef)}
    if owner not in classes:
        return None
    found, queue, seen = set(), [owner], set()
    while queue:
        current = queue.pop()
        if current in seen:
            continue
        seen.add(current)
        if find_function(module, current, name) is not None:
            found.add(current)
            continue
        for base in classes[current].bases:
            base_name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
            if isinstance(base, ast.Name) and base.id in classes:
                queue.append(base.id)
            elif base_name not in ("object", "TestCase"):
                return None
    return found.pop() if len(found) == 1 else None


def home_function(module: ast.Module | None, function: tuple[str, str | None, str]) -> tuple[str, str | None, str]:
    """(path, class, name) of where a test's function is written: a method a class inherits is written in the class
    it inherits it from (`defining_class`); anything else, or what cannot be resolved, as the test id names it."""
    path, owner, name = function
    if module is None or owner is None or "::" in owner:
        return function
    return (path, defining_class(module, owner, name) or owner, name)


def draw_variants(pool: SitePool, k: int, rng: random.Random) -> list[Variant]:
    """k variants of one site that together with the real value are exchangeable (see the module docstring)."""
    families: dict[str, list[Variant]] = {}
    for variant in pool.variants:
        families.setdefault(variant.family, []).append(variant)
    if pool.kind == "value" and len(families.get("module", [])) >= k:
        return rng.sample(families["module"], k)
    if pool.kind == "exception":
        # Types the module names first: a builtin beside the module's own error types would stand out.
        return rng.sample(pool.variants[:max(k, min(len(pool.variants), 2 * k))], min(k, len(pool.variants)))
    if pool.kind != "value" or not any(f.startswith("step:") for f in families):
        choices = [vs for vs in families.values() if len(vs) >= min(k, max(map(len, families.values())))]
        if not choices:
            return []
        chosen = rng.choice(choices)
        return rng.sample(chosen, min(k, len(chosen)))
    # Progressions: k+1 consecutive terms with the real one at a uniformly drawn rank.
    options = []
    for variants in families.values():
        offsets = {v.offset: v for v in variants}
        for rank in range(k + 1):
            needed = [i - rank for i in range(k + 1) if i != rank]
            if all(offset in offsets for offset in needed):
                options.append([offsets[offset] for offset in needed])
    if options:
        # A step is drawn first, then a rank among those the step's validated terms allow.
        by_family: dict[str, list[list[Variant]]] = {}
        for option in options:
            by_family.setdefault(option[0].family, []).append(option)
        full = [f for f, opts in by_family.items() if len(opts) == k + 1] or list(by_family)
        return list(rng.choice(by_family[rng.choice(sorted(full))]))
    best = max(families.values(), key=len)
    return rng.sample(best, min(k, len(best)))
