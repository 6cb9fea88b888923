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

The verdict (lego/verify/grader.py): resolved only when every real test passes and every decoy fails, in the
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
- A flipped truth (`assert x` / `assert not x`, `is None` / `is not None`) allows one decoy only (1/2 per test).
- A test with no checkable expectation (`assert` on a parametrized `expected`, a bare call) gets no decoy; `lego
  tasks validate` names those tests. Its defence is then the in-process evidence alone.
"""

from __future__ import annotations

import ast
import copy
import math
import random
import secrets
import string
from collections import Counter
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from lego.errors import LegoError

DECOY_FORMAT = 2  # bump when site finding, candidates or rendering change: it is part of a plan's cache key
MAX_SITES_PER_TEST = 3
MAX_VARIANTS_PER_SITE = 12  # candidates validated per site: the gold run's size grows with it
NAME_HEX = 12

EQUALITY_CALLS = frozenset({
    "assertEqual", "assertEquals", "assertListEqual", "assertDictEqual", "assertTupleEqual", "assertSetEqual",
    "assertSequenceEqual", "assertCountEqual", "assertMultiLineEqual", "assertAlmostEqual", "assertAlmostEquals",
    "isclose", "allclose", "array_equal", "assert_allclose", "assert_array_equal", "assert_array_almost_equal",
    "assert_almost_equal", "assert_equal", "assert_approx_equal", "approx"})
FLIP_CALLS = {"assertTrue": "assertFalse", "assertFalse": "assertTrue", "assertIsNone": "assertIsNotNone",
              "assertIsNotNone": "assertIsNone"}
RAISES_CALLS = frozenset({"raises", "assertRaises", "assertRaisesRegex", "assertRaisesRegexp"})
# Builtin exceptions a decoy may expect instead; one related to the real type by inheritance is never drawn.
EXCEPTIONS = ("ValueError", "TypeError", "KeyError", "IndexError", "AttributeError", "RuntimeError",
              "ZeroDivisionError", "NotImplementedError", "UnicodeDecodeError", "OverflowError", "FileNotFoundError",
              "RecursionError")


class DecoyError(LegoError):
    """Decoys could not be made for a test file (it does not parse, or a graded test is not in it)."""


# ---------------------------------------------------------------------------------------------- records


class Variant(BaseModel):
    """One way to change a site: the value a decoy expects there (as Python source), or a flip."""

    replacement: str = ""  # a literal's source (value), an exception name (exception); empty for flips
    family: str  # variants drawn together share a family: a step of a progression, a character position
    offset: int = 0  # a number's offset in steps from the real value (progressions only)


class SitePool(BaseModel):
    """A checked expectation of one test and the variants that fail under the gold patch."""

    site: int  # the node's index in ast.walk order over the test function
    kind: str  # value | flip_assert | flip_is | flip_call | exception
    variants: list[Variant]
    # On a line the test patch wrote. A site on a line the repository already had can be read off its pristine copy
    # (git, the snapshot) by the graded code: the member that agrees with it is the real one.
    written: bool = True


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


# ---------------------------------------------------------------------------------------------- test ids


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


# ---------------------------------------------------------------------------------------------- sites


def _is_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value is not Ellipsis
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        return isinstance(node.operand, ast.Constant) and type(node.operand.value) in (int, float)
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return all(_is_literal(element) for element in node.elts)
    if isinstance(node, ast.Dict):
        return all(key is not None and _is_literal(key) for key in node.keys) and all(map(_is_literal, node.values))
    return False


def _literal_leaves(node: ast.AST) -> list[ast.AST]:
    """The perturbable scalars of a literal: numbers (a negative one as its unary minus), strings, bytes."""
    if isinstance(node, ast.UnaryOp):
        return [node]
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or value is None:
            return []
        if isinstance(value, int | float) and not (isinstance(value, float) and not math.isfinite(value)):
            return [node]
        if isinstance(value, str | bytes) and any(chr(c).isalnum() if isinstance(value, bytes) else c.isalnum()
                                                  for c in value):
            return [node]
        return []
    if isinstance(node, ast.Dict):
        return [leaf for value in node.values for leaf in _literal_leaves(value)]  # keys select, values are checked
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [leaf for element in node.elts for leaf in _literal_leaves(element)]
    return []


def _call_name(node: ast.AST) -> str:
    func = node.func if isinstance(node, ast.Call) else None
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def _literal_value(node: ast.AST):
    return ast.literal_eval(node)


@dataclass
class Site:
    node: ast.AST
    kind: str


@dataclass
class _Finder:
    """Expectation sites of one test function, with the helpers of its module that check a parameter."""

    function: ast.FunctionDef | ast.AsyncFunctionDef
    helpers: dict[str, dict[int | str, bool]] = field(default_factory=dict)  # name -> positions/keywords checked
    sites: list[Site] = field(default_factory=list)

    def expected_sides(self, compare: ast.Compare) -> list[ast.AST]:
        if len(compare.ops) != 1 or not isinstance(compare.ops[0], ast.Eq):
            return []
        left, right = compare.left, compare.comparators[0]
        sides = []
        for mine, other in ((left, right), (right, left)):
            if _is_literal(mine) and not _is_literal(other):
                sides.append(mine)
            elif isinstance(other, ast.Call) and _call_name(other) == "approx" and other.args \
                    and _is_literal(other.args[0]) and not _is_literal(mine):
                sides.append(other.args[0])
        return sides

    def add_values(self, node: ast.AST) -> None:
        for leaf in _literal_leaves(node):
            self.sites.append(Site(leaf, "value"))

    def visit(self) -> list[Site]:
        assigned: dict[str, list[ast.AST]] = {}
        for node in ast.walk(self.function):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                assigned.setdefault(node.targets[0].id, []).append(node.value)
        for node in ast.walk(self.function):
            if isinstance(node, ast.Assert):
                self.visit_assert(node, assigned)
            elif isinstance(node, ast.Call):
                self.visit_call(node, assigned)
        seen: set[int] = set()
        unique = []
        for site in self.sites:
            if id(site.node) not in seen:
                seen.add(id(site.node))
                unique.append(site)
        return unique

    def expected_name(self, node: ast.AST, assigned: dict[str, list[ast.AST]]) -> None:
        """`expected = <literal>` once, then compared: the literal is the expectation."""
        if isinstance(node, ast.Name) and len(assigned.get(node.id, [])) == 1 and _is_literal(assigned[node.id][0]):
            self.add_values(assigned[node.id][0])

    def visit_assert(self, node: ast.Assert, assigned: dict[str, list[ast.AST]]) -> None:
        test = node.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            op, right = test.ops[0], test.comparators[0]
            if isinstance(op, ast.Eq):
                for side in self.expected_sides(test):
                    self.add_values(side)
                for mine, other in ((test.left, right), (right, test.left)):
                    if not _is_literal(other):
                        self.expected_name(mine, assigned)
                return
            if isinstance(op, ast.Is | ast.IsNot) and isinstance(right, ast.Constant) and right.value in (None, True, False) \
                    and not (isinstance(test.left, ast.Constant)):
                self.sites.append(Site(test, "flip_is"))
                return
            if isinstance(op, ast.Eq | ast.NotEq | ast.Lt | ast.LtE | ast.Gt | ast.GtE | ast.In | ast.NotIn):
                return  # an inequality or a membership pins no value: changing its operand proves nothing
        if isinstance(test, ast.Call) and _call_name(test) in EQUALITY_CALLS:
            return  # handled as a call (isclose, allclose inside an assert)
        if not _is_literal(test):
            self.sites.append(Site(node, "flip_assert"))

    def visit_call(self, node: ast.Call, assigned: dict[str, list[ast.AST]]) -> None:
        name = _call_name(node)
        if name in EQUALITY_CALLS and name != "approx":
            literal = [arg for arg in node.args[:2] if _is_literal(arg)]
            if len(literal) == 1 and len(node.args) >= 2:
                self.add_values(literal[0])
            elif not literal:
                for arg in node.args[:2]:
                    self.expected_name(arg, assigned)
        elif name in FLIP_CALLS and isinstance(node.func, ast.Attribute):
            self.sites.append(Site(node, "flip_call"))
        elif name in RAISES_CALLS and node.args and isinstance(node.args[0], ast.Name | ast.Attribute):
            self.sites.append(Site(node.args[0], "exception"))
        elif name in self.helpers:
            checked = self.helpers[name]
            for position, arg in enumerate(node.args):
                if checked.get(position) and _is_literal(arg):
                    self.add_values(arg)
            for keyword in node.keywords:
                if keyword.arg and checked.get(keyword.arg) and _is_literal(keyword.value):
                    self.add_values(keyword.value)


def checking_helpers(module: ast.Module, owner: ast.ClassDef | None) -> dict[str, dict[int | str, bool]]:
    """Functions of the module (and methods of the test's class) that compare a parameter for equality in an
    assert or an equality call: a literal passed there by a test is an expectation, checked inside the helper."""
    candidates: list[tuple[ast.FunctionDef, bool]] = [
        (node, False) for node in module.body if isinstance(node, ast.FunctionDef) and not node.name.startswith("test")]
    if owner is not None:
        candidates += [(node, True) for node in owner.body
                       if isinstance(node, ast.FunctionDef) and not node.name.startswith("test")]
    helpers: dict[str, dict[int | str, bool]] = {}
    for function, is_method in candidates:
        params = [arg.arg for arg in function.args.args]
        if is_method and params:
            params = params[1:]
        compared: set[str] = set()
        for node in ast.walk(function):
            pairs: list[tuple[ast.AST, ast.AST]] = []
            if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1 \
                    and isinstance(node.test.ops[0], ast.Eq):
                pairs.append((node.test.left, node.test.comparators[0]))
            elif isinstance(node, ast.Call) and _call_name(node) in EQUALITY_CALLS and len(node.args) >= 2:
                pairs.append((node.args[0], node.args[1]))
            for a, b in pairs:
                for mine, other in ((a, b), (b, a)):
                    if isinstance(mine, ast.Name) and mine.id in params and not (
                            isinstance(other, ast.Name) and other.id in params):
                        compared.add(mine.id)
        if compared:
            checked: dict[int | str, bool] = {}
            for position, param in enumerate(params):
                if param in compared:
                    checked[position] = True
                    checked[param] = True
            helpers[function.name] = checked
    return helpers


def find_sites(module: ast.Module, ref: NodeId) -> list[tuple[int, str]]:
    """(index in ast.walk order, kind) of each expectation site of a test, in a stable order."""
    function = find_function(module, ref.owner, ref.name)
    if function is None:
        return []
    owner = next((node for node in module.body if isinstance(node, ast.ClassDef) and node.name == ref.owner), None)
    finder = _Finder(function, checking_helpers(module, owner))
    sites = finder.visit()
    index = {id(node): position for position, node in enumerate(ast.walk(function))}
    # Value sites first (they give k decoys), then exception swaps, then flips (one decoy each).
    order = {"value": 0, "exception": 1, "flip_is": 2, "flip_call": 2, "flip_assert": 3}
    found = sorted({(index[id(site.node)], site.kind) for site in sites if id(site.node) in index},
                   key=lambda item: (order[item[1]], item[0]))
    return found


# ---------------------------------------------------------------------------------------------- candidates


def _decimals(value: float) -> int:
    text = repr(value)
    if "e" in text or "E" in text:
        return 12
    return len(text.split(".")[1]) if "." in text else 0


def number_candidates(value: int | float, k: int, rng: random.Random) -> list[Variant]:
    """A progression around the real value, several steps: a grading takes k+1 consecutive terms containing it."""
    if isinstance(value, int):
        steps = sorted({1, rng.choice([2, 3, 5])} | ({max(1, abs(value) // 10)} if abs(value) >= 20 else set()))[:2]
        variants = [Variant(replacement=repr(value + step * j), family=f"step:{step}", offset=j)
                    for step in steps for j in range(-k, k + 1) if j]
        return variants
    magnitude = 10.0 ** math.floor(math.log10(abs(value))) if value else 1.0
    decimals = _decimals(value)
    out = []
    for factor in (1, rng.choice([2, 5])):
        step = magnitude * factor
        places = max(decimals, _decimals(step))
        for j in range(-k, k + 1):
            if j:
                shifted = round(value + step * j, places)
                if shifted != value:
                    out.append(Variant(replacement=repr(float(shifted)), family=f"step:{factor}", offset=j))
    return out


def _same_class(char: str) -> str:
    if char.isdigit():
        return string.digits
    if char.isupper():
        return string.ascii_uppercase
    return string.ascii_lowercase


def text_candidates(value: str | bytes, k: int, rng: random.Random, positions: int = 2) -> list[Variant]:
    """One character changed, at one position, to others of its class (never a case change: a case-insensitive
    comparison must not pass a decoy). All of a grading's decoys change the same position."""
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    eligible = [i for i, char in enumerate(text) if char.isascii() and char.isalnum()]
    out = []
    for position in rng.sample(eligible, min(positions, len(eligible))):
        char = text[position]
        pool = [c for c in _same_class(char) if c.lower() != char.lower()]
        for new in rng.sample(pool, min(len(pool), max(k + 2, 4))):
            changed = text[:position] + new + text[position + 1:]
            literal = changed.encode("latin-1") if isinstance(value, bytes) else changed
            out.append(Variant(replacement=repr(literal), family=f"pos:{position}"))
    return out


def module_vocabulary(module: ast.Module) -> tuple[list, list[str]]:
    """The literals and the exception names a test module itself uses: decoy values drawn from them look as much
    at home in the file as the real one (a perturbed 'client' next to a fixture that says 'client' would not)."""
    docstrings = {id(node.body[0].value) for node in ast.walk(module)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    literals, exceptions = [], []
    for node in ast.walk(module):
        if isinstance(node, ast.Constant) and id(node) not in docstrings and not isinstance(node.value, bool) \
                and isinstance(node.value, int | float | str | bytes):
            literals.append(node.value)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
                and type(node.operand.value) in (int, float):
            literals.append(-node.operand.value)
        elif isinstance(node, ast.Name) and node.id.endswith(("Error", "Exception")):
            exceptions.append(node.id)
        elif isinstance(node, ast.alias) and (node.asname or node.name).endswith(("Error", "Exception")):
            exceptions.append(node.asname or node.name)
    return list(dict.fromkeys(literals)), list(dict.fromkeys(exceptions))


def _same_shape(value, other) -> bool:
    if type(value) is not type(other) or value == other:
        return False
    if isinstance(value, str | bytes):
        newline = "\n" if isinstance(value, str) else b"\n"
        return (newline in value) == (newline in other) and len(value) // 2 <= len(other) <= 2 * len(value) + 2
    return True


def vocabulary_candidates(value, literals: list, k: int, rng: random.Random) -> list[Variant]:
    """Other literals of the module, of the value's type and shape."""
    fits = [other for other in literals if _same_shape(value, other)]
    chosen = rng.sample(fits, min(len(fits), max(2 * k, 4)))
    return [Variant(replacement=repr(other), family="module") for other in chosen] if len(chosen) >= k else []


def exception_candidates(original: str, in_module: list[str], k: int, rng: random.Random) -> list[Variant]:
    """Exception types the module itself names first, then builtins; none related to a builtin real type by
    inheritance (a custom type's relations are unknown here: the gold run drops a related one)."""
    import builtins

    real = getattr(builtins, original, None)

    def unrelated(name: str) -> bool:
        candidate = getattr(builtins, name, None)
        if name == original.rsplit(".", 1)[-1]:
            return False
        if isinstance(real, type) and isinstance(candidate, type) and issubclass(candidate, BaseException):
            return not (issubclass(real, candidate) or issubclass(candidate, real))
        return True

    local = [name for name in in_module if unrelated(name)]
    common = [name for name in EXCEPTIONS if unrelated(name) and name not in local]
    chosen = rng.sample(local, min(len(local), 2 * k)) + rng.sample(common, min(len(common), max(2 * k, 6)))
    return [Variant(replacement=name, family="swap") for name in chosen]


def plan_candidates(source: str, tests: list[str], k: int, rng: random.Random | None = None,
                    written_lines: set[int] | None = None) -> dict[str, DecoysOfTest]:
    """Every candidate variant of every site of `tests` (ids in this one file), before validation. With
    `written_lines` (the lines of this file the test patch wrote), sites on those lines come first."""
    rng = rng or random.Random(secrets.randbits(64))
    module = ast.parse(source)
    plans: dict[str, DecoysOfTest] = {}
    for test in tests:
        ref = NodeId.parse(test)
        function = find_function(module, ref.owner, ref.name)
        if function is None:
            plans[test] = DecoysOfTest(test=test, reason="the test function is not defined in its file")
            continue
        nodes = list(ast.walk(function))
        literals, exceptions = module_vocabulary(module)
        pools = []
        sites = find_sites(module, ref)
        if written_lines is not None:
            sites.sort(key=lambda site: getattr(nodes[site[0]], "lineno", 0) not in written_lines)  # stable
        for index, kind in sites[:MAX_SITES_PER_TEST * 3]:
            node = nodes[index]
            if kind == "value":
                value = _literal_value(node)
                if isinstance(value, bool):
                    continue
                variants = vocabulary_candidates(value, literals, k, rng) + (
                    number_candidates(value, k, rng) if isinstance(value, int | float)
                    else text_candidates(value, k, rng))
            elif kind == "exception":
                original = node.id if isinstance(node, ast.Name) else ast.unparse(node)
                variants = exception_candidates(original, exceptions, k, rng)
            else:
                variants = [Variant(family="flip")]
            if variants:
                written = written_lines is None or getattr(node, "lineno", 0) in written_lines
                pools.append(SitePool(site=index, kind=kind, variants=variants[:MAX_VARIANTS_PER_SITE],
                                      written=written))
            if len(pools) >= MAX_SITES_PER_TEST:
                break
        reason = "" if pools else ("no checked expectation to change: the test compares no literal, asserts no "
                                   "truth and expects no exception in its own body or a helper of its module")
        plans[test] = DecoysOfTest(test=test, pools=pools, reason=reason)
    return plans


# ---------------------------------------------------------------------------------------------- drawing


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


# ---------------------------------------------------------------------------------------------- rendering


class _Rewrite(ast.NodeTransformer):
    def __init__(self, target: ast.AST, kind: str, variant: Variant | None):
        self.target, self.kind, self.variant = target, kind, variant

    def visit(self, node):
        if node is not self.target or self.variant is None:
            return self.generic_visit(node)
        if self.kind == "value":
            return ast.copy_location(ast.Constant(value=ast.literal_eval(self.variant.replacement)), node)
        if self.kind == "exception":
            return ast.copy_location(ast.Name(id=self.variant.replacement, ctx=ast.Load()), node)
        if self.kind == "flip_assert":
            test = node.test
            flipped = test.operand if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) \
                else ast.UnaryOp(op=ast.Not(), operand=test)
            return ast.copy_location(ast.Assert(test=flipped, msg=node.msg), node)
        if self.kind == "flip_is":
            constant = node.comparators[0].value
            if constant is None:
                op = ast.IsNot() if isinstance(node.ops[0], ast.Is) else ast.Is()
                return ast.copy_location(ast.Compare(left=node.left, ops=[op], comparators=node.comparators), node)
            return ast.copy_location(ast.Compare(left=node.left, ops=node.ops,
                                                 comparators=[ast.Constant(value=not constant)]), node)
        if self.kind == "flip_call":
            func = copy.copy(node.func)
            func.attr = FLIP_CALLS[func.attr]
            return ast.copy_location(ast.Call(func=func, args=node.args, keywords=node.keywords), node)
        raise DecoyError(f"unknown decoy site kind {self.kind!r}")


def render_function(function: ast.FunctionDef | ast.AsyncFunctionDef, member: Member, indent: int) -> str:
    """The function under the member's name, with its site changed to its variant (the real test: unchanged)."""
    clone = copy.deepcopy(function)
    if member.variant is not None and member.site is not None:
        target = list(ast.walk(clone))[member.site]
        if target is clone:
            raise DecoyError("a decoy site cannot be the test function itself")
        clone = _Rewrite(target, member.kind, member.variant).visit(clone)
    clone.name = member.name
    ast.fix_missing_locations(clone)
    text = ast.unparse(clone)
    pad = " " * indent
    return "\n".join(pad + line if line else line for line in text.splitlines())


@dataclass
class Member:
    """One function of a group as it is written into the sandbox."""

    name: str
    role: str  # real | decoy
    site: int | None = None
    kind: str = ""
    variant: Variant | None = None


@dataclass
class Group:
    """A graded test function and its decoys, in the order they are written where the function stood."""

    ref: NodeId
    members: list[Member]


def random_name() -> str:
    return "test_" + secrets.token_hex(NAME_HEX // 2)


def rewrite_module(source: str, groups: list[Group]) -> str:
    """The module with each group's function replaced, where it stood, by its members in their order."""
    module = ast.parse(source)
    lines = source.splitlines(keepends=True)
    spans = []
    for group in groups:
        function = find_function(module, group.ref.owner, group.ref.name)
        if function is None:
            raise DecoyError(f"{group.ref.path}: no function {group.ref.name} to rewrite")
        start = min([function.lineno, *(d.lineno for d in function.decorator_list)])
        blocks = [render_function(function, member, function.col_offset) for member in group.members]
        gap = "\n\n" if function.col_offset else "\n\n\n"
        spans.append((start, function.end_lineno, gap.join(blocks) + "\n"))
    for start, end, text in sorted(spans, reverse=True):
        lines[start - 1:end] = [text]
    return "".join(lines)


@dataclass
class DecoyLayout:
    """One grading's decoys: what is written into the sandbox, and (host side only) who is who."""

    files: dict[str, str] = field(default_factory=dict)  # path -> rewritten source
    real: dict[str, str] = field(default_factory=dict)  # original test id -> its id in this grading
    decoys: dict[str, str] = field(default_factory=dict)  # decoy id -> the original test id it shadows
    groups: list[list[str]] = field(default_factory=list)  # each graded function's ids (real and decoys), shuffled
    alone: list[int] = field(default_factory=list)  # the groups run alone (FAIL_TO_PASS tests' groups)
    drawn: dict[str, dict] = field(default_factory=dict)  # original test id -> the site and values drawn (evidence)
    unrewritable: dict[str, str] = field(default_factory=dict)  # a test file left as it was, and why
    members: dict[str, Member] = field(default_factory=dict)  # every graded id -> the function written for it

    @classmethod
    def identity(cls, tests: list[str], alone: list[str]) -> DecoyLayout:
        """Every test under its own name and no decoy (the tests as the task wrote them)."""
        groups = [[test] for test in dict.fromkeys(tests)]
        return cls(real={test: test for test in tests}, groups=groups,
                   alone=[index for index, group in enumerate(groups) if group[0] in set(alone)])

    @property
    def graded(self) -> list[str]:
        return [*self.real.values(), *self.decoys]

    def decoys_of(self, test: str) -> list[str]:
        return [decoy for decoy, original in self.decoys.items() if original == test]




def mentions_outside(module: ast.Module, inside: set[int]) -> Counter:
    """How often each literal and name (imported names included) appears in the module outside the nodes `inside`."""
    counts: Counter = Counter()
    for node in ast.walk(module):
        if id(node) in inside:
            continue
        if isinstance(node, ast.Constant | ast.Name):
            counts[ast.unparse(node)] += 1
        elif isinstance(node, ast.alias):
            counts[node.asname or node.name.rsplit(".", 1)[-1]] += 1
    return counts


@dataclass
class _Context:
    """What a forger can read beside a group: the rest of its module. A decoy value must look like the real one
    there: mentioned elsewhere in the module or not, found inside the module's other text or not, of the same
    length. Otherwise "the value the fixture mentions" or "the one no other test uses" would pick the real test."""

    function: ast.FunctionDef | ast.AsyncFunctionDef
    rest_text: str
    rest_literals: Counter

    @classmethod
    def of(cls, source: str | None, ref: NodeId) -> _Context | None:
        if source is None:
            return None
        try:
            module = ast.parse(source)
        except SyntaxError:
            return None
        function = find_function(module, ref.owner, ref.name)
        if function is None:
            return None
        start = min([function.lineno, *(d.lineno for d in function.decorator_list)])
        lines = source.splitlines()
        rest_text = "\n".join(lines[:start - 1] + lines[function.end_lineno:])
        return cls(function, rest_text, mentions_outside(module, {id(node) for node in ast.walk(function)}))

    def profile(self, text: str, kind: str) -> tuple:
        if kind == "exception":
            return (self.rest_literals[text] > 0, len(text) // 5)
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return ()
        content = value.decode("latin-1") if isinstance(value, bytes) else value if isinstance(value, str) \
            else repr(value)
        length = len(text) if len(text) <= 6 else len(text) // 4 + 100
        return (self.rest_literals[text] > 0, bool(content) and content in self.rest_text, length)

    def matching(self, pool: SitePool) -> tuple[SitePool, int]:
        """The pool's variants whose profile is the real value's, and how many features of it they share: all of
        them when any variant does, else relaxed one feature at a time (length first)."""
        if pool.kind not in ("value", "exception"):
            return pool, 0
        nodes = list(ast.walk(self.function))
        if pool.site >= len(nodes):
            return pool, 0
        real = self.profile(ast.unparse(nodes[pool.site]), pool.kind)
        for width in range(len(real), -1, -1):
            kept = [v for v in pool.variants if self.profile(v.replacement, pool.kind)[:width] == real[:width]]
            if kept:
                return pool.model_copy(update={"variants": kept}), width - len(real)
        return pool, -len(real)


def build_layout(sources: dict[str, str], plan: DecoyPlan, fail_to_pass: list[str], pass_to_pass: list[str], *,
                 k: int, pass_to_pass_sample: int, rng: random.Random | None = None) -> DecoyLayout:
    """Rename every graded test, add up to k decoys drawn from `plan` to every FAIL_TO_PASS test and to a random
    sample of PASS_TO_PASS tests, and shuffle each group where its function stood."""
    rng = rng or random.SystemRandom()
    with_decoys = set(fail_to_pass)
    sampled = [t for t in pass_to_pass if t in plan.tests and plan.tests[t].pools]
    with_decoys.update(rng.sample(sampled, min(pass_to_pass_sample, len(sampled))))

    contexts: dict[tuple[str, str | None, str], _Context | None] = {}

    def members_of(tests: list[str]) -> list[Member]:
        members = [Member(random_name(), "real")]
        pools = plan.tests[tests[0]].pools if tests[0] in plan.tests else []
        if pools and any(test in with_decoys for test in tests):
            ref = NodeId.parse(tests[0])
            if ref.function not in contexts:
                contexts[ref.function] = _Context.of(sources.get(ref.path), ref)
            context = contexts[ref.function]
            # Each site ranked by: on a line the test patch wrote; its kind (a changed value hides best, then a
            # swapped exception, then a flipped truth: lego bench decoys measures each); its decoys matching the
            # real value on every feature a forger can read beside them; how many decoys it gives. All decoys
            # change the one site.
            ranked = []
            for pool in pools:
                matched, fit = context.matching(pool) if context is not None else (pool, 0)
                strength = {"value": 2, "exception": 1}.get(pool.kind, 0)
                size = len(draw_variants(matched, k, random.Random(0)))
                ranked.append(((matched.written, strength, fit, size), matched))
            best = max(rank for rank, _ in ranked)
            pool = rng.choice([matched for rank, matched in ranked if rank == best])
            members += [Member(random_name(), "decoy", pool.site, pool.kind, variant)
                        for variant in draw_variants(pool, k, rng)]
        rng.shuffle(members)
        return members

    return _layout(sources, fail_to_pass, pass_to_pass, members_of, rng, untouched=plan.untouched)


def validation_layout(sources: dict[str, str], candidates: dict[str, DecoysOfTest], fail_to_pass: list[str],
                      pass_to_pass: list[str]) -> DecoyLayout:
    """Every candidate variant of every site as a decoy of its own: what runs under the gold patch to find the
    variants that fail there (Verifier.decoy_plan)."""
    def members_of(tests: list[str]) -> list[Member]:
        found = candidates.get(tests[0])
        members = [Member(random_name(), "real")] + [
            Member(random_name(), "decoy", pool.site, pool.kind, variant)
            for pool in (found.pools if found else []) for variant in pool.variants]
        rng.shuffle(members)  # decoys before the real test too, as at a grading
        return members

    rng = random.SystemRandom()
    return _layout(sources, fail_to_pass, pass_to_pass, members_of, rng)


def _layout(sources: dict[str, str], fail_to_pass: list[str], pass_to_pass: list[str], members_of,
            rng: random.Random, untouched: dict[str, str] | None = None) -> DecoyLayout:
    layout = DecoyLayout()
    by_function: dict[tuple[str, str | None, str], list[str]] = {}
    for test in dict.fromkeys([*fail_to_pass, *pass_to_pass]):
        by_function.setdefault(NodeId.parse(test).function, []).append(test)
    per_file: dict[str, list[Group]] = {}
    ids_of: dict[tuple[str, str | None, str], list[str]] = {}
    for function, tests in by_function.items():
        members = members_of(tests)
        per_file.setdefault(function[0], []).append(Group(NodeId.parse(tests[0]), members))
        ids_of[function] = []
        for test in tests:
            ref = NodeId.parse(test)
            for member in members:
                renamed = ref.renamed(member.name)
                ids_of[function].append(renamed)
                layout.members[renamed] = member
                if member.role == "real":
                    layout.real[test] = renamed
                else:
                    layout.decoys[renamed] = test
                    layout.drawn.setdefault(test, {"site": member.site, "kind": member.kind, "values": []})[
                        "values"].append(member.variant.replacement if member.variant else "flip")
    for path, groups in per_file.items():
        try:
            if path not in sources:
                raise DecoyError("the file is not in the repository after the test patch")
            if untouched and path in untouched:
                raise DecoyError(untouched[path])
            layout.files[path] = rewrite_module(sources[path], groups)
        except (SyntaxError, ValueError, DecoyError) as exc:
            # A file this interpreter cannot parse or print (or one that is missing: its tests will be missing too)
            # is graded as it is, under its own names; the evidence says so.
            layout.unrewritable[path] = f"{type(exc).__name__}: {exc}"[:300]
            for group in groups:
                tests = [test for test in layout.real if NodeId.parse(test).function == group.ref.function]
                for test in tests:
                    layout.real[test] = test
                    layout.drawn.pop(test, None)
                    for decoy in layout.decoys_of(test):
                        del layout.decoys[decoy]
                        layout.members.pop(decoy, None)
                ids_of[group.ref.function] = tests
    alone = set(dict.fromkeys(NodeId.parse(test).function for test in fail_to_pass))
    for function, ids in ids_of.items():
        ids = list(ids)
        rng.shuffle(ids)
        if function in alone:
            layout.alone.append(len(layout.groups))
        layout.groups.append(ids)
    return layout
