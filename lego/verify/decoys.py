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
- A flipped truth (`assert x` / `assert not x`, `is None` / `is not None`) allows one decoy only, and it catches a
  forger that passes every test, not one that forces the asserted predicate to one answer: sites that change a
  value or an exception come first wherever a test has one.
- A test with no checkable expectation (a bare call, a value it computes itself, an expectation that is also the
  code's input: `assert word == singularize(word)`) gets no decoy, or one flipped comparison; `lego tasks validate`
  names those tests. Its defence is then the in-process evidence alone.
- A string expectation that echoes the test's inputs (`sql_format("select 1") == "SELECT 1"`) leaves few characters
  whose change keeps that likeness: where none is left, a decoy is less like the inputs than the real value, which
  a forger comparing them can read (text_candidates prefers the characters that keep it).
"""

from __future__ import annotations

import ast
import copy
import math
import random
import re
import secrets
import string
import threading
from collections import Counter
from dataclasses import dataclass, field

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

DECOY_FORMAT = 9  # bump when site finding, candidates or rendering change: it is part of a plan's cache key
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


def is_equality_call(name: str) -> bool:
    return name in EQUALITY_CALLS or bool(EQUALITY_NAME.search(name)) or name.startswith("assert") and "Equal" in name


# A comparison and its complement: when the real one holds, the complement does not.
COMPLEMENTS = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt,
               ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
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
    # A parametrize table's variant: each case's id as the real test has it -> as pytest names the case here (an id
    # made from a value changes with it; the decoy's ids are its own, as the real test's are).
    ids: dict[str, str] = Field(default_factory=dict)
    # A pair of truth checks' variant: the checks it flips, each as (its index in ast.walk order, its flip kind).
    flips: list[tuple[int, str]] = Field(default_factory=list)


class SitePool(BaseModel):
    """A checked expectation of one test and the variants that fail under the gold patch."""

    site: int  # the node's index in ast.walk order over the test function
    kind: str  # value | param | bits | flip_assert | flip_is | flip_compare | flip_call | flip_pair | exception
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
        if isinstance(value, str | bytes) and _text_positions(
                value.decode("latin-1") if isinstance(value, bytes) else value):
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


# Callables whose result is a value built from their arguments alone (builtins, stdlib and numpy value types): an
# expression of literals through them is an expectation, as a literal is. A capitalized name (a class, a classmethod
# of one: `Quantity(3, "kg")`, `Interval.closed(0, 1)`) is taken for a constructor too; any other call is the code
# under test, and an expression holding one is never perturbed (its arguments are inputs).
VALUE_CALLS = frozenset({
    "str", "int", "float", "complex", "bool", "bytes", "bytearray", "list", "tuple", "dict", "set", "frozenset",
    "range", "sorted", "hash", "abs", "round", "approx", "date", "datetime", "time", "timedelta", "timezone", "deque",
    "array", "asarray", "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
    "uint32", "uint64", "complex64", "complex128", "bool_", "str_", "datetime64", "timedelta64"})
STR_METHODS = frozenset(name for name in dir(str) if not name.startswith("_"))
# Keywords that set how a comparison is made or a value is built, not what is expected: never a site.
SETTING_KEYWORDS = frozenset({"rel", "abs", "rtol", "atol", "places", "delta", "decimal", "msg", "err_msg",
                              "equal_nan", "verbose", "strict", "dtype", "encoding", "errors", "base"})
FIRST_ARGUMENT_ONLY = frozenset({"str", "bytes", "bytearray", "int"})  # str(b, "utf-8"), int("ff", 16): a setting


def _dotted(node: ast.AST) -> bool:
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def _root_name(node: ast.AST) -> str:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def _value_call(func: ast.AST, imported: frozenset[str] = frozenset()) -> bool:
    """A callable that builds a value from its arguments (see VALUE_CALLS). `imported`: the module's imported names
    (`shlex.split` is a module's function, `plural.split` a string's method)."""
    if isinstance(func, ast.Name):
        return func.id in VALUE_CALLS or func.id[:1].isupper()
    if not isinstance(func, ast.Attribute):
        return False
    if isinstance(func.value, ast.Constant) and isinstance(func.value.value, str | bytes):
        return True  # "\n".join([...]), "{} kg".format(x)
    if not _dotted(func.value):
        return False  # a method of a computed object: the code under test
    if func.attr in VALUE_CALLS or func.attr[:1].isupper() or _root_name(func)[:1].isupper():
        return True  # np.array, datetime.date, decimal.Decimal, Interval.closed
    return isinstance(func.value, ast.Name) and func.value.id not in imported and func.attr in STR_METHODS


def _shaped(node: ast.AST, imported: frozenset[str] = frozenset()) -> bool:
    """Whether an expression is built from literals and names by value constructors only (an expectation's shape)."""
    if isinstance(node, ast.Constant):
        return node.value is not Ellipsis
    if isinstance(node, ast.Name):
        return True
    if isinstance(node, ast.Attribute):
        return _dotted(node)
    if isinstance(node, ast.Starred):
        return _shaped(node.value, imported)
    if isinstance(node, ast.UnaryOp):
        return _shaped(node.operand, imported)
    if isinstance(node, ast.BinOp):
        return _shaped(node.left, imported) and _shaped(node.right, imported)
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return all(_shaped(element, imported) for element in node.elts)
    if isinstance(node, ast.Dict):
        return all(key is not None and _shaped(key, imported) for key in node.keys) \
            and all(_shaped(value, imported) for value in node.values)
    if isinstance(node, ast.JoinedStr):
        return all(isinstance(value, ast.Constant)
                   or (isinstance(value, ast.FormattedValue) and _shaped(value.value, imported))
                   for value in node.values)
    if isinstance(node, ast.Call):
        return (_value_call(node.func, imported) and all(_shaped(arg, imported) for arg in node.args)
                and all(_shaped(keyword.value, imported) for keyword in node.keywords))
    return False


def _leaves(node: ast.AST) -> list[ast.AST]:
    """The perturbable scalars of an expectation-shaped expression (dict keys select and tolerances are settings:
    neither is one)."""
    if isinstance(node, ast.Constant | ast.UnaryOp) and _is_literal(node):
        return _literal_leaves(node)
    if isinstance(node, ast.UnaryOp):
        return _leaves(node.operand)
    if isinstance(node, ast.BinOp):
        return _leaves(node.left) + _leaves(node.right)
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [leaf for element in node.elts for leaf in _leaves(element)]
    if isinstance(node, ast.Dict):
        # The values are checked; the keys only select them, unless no value holds anything to change.
        return [leaf for value in node.values for leaf in _leaves(value)] \
            or [leaf for key in node.keys if key is not None for leaf in _leaves(key)]
    if isinstance(node, ast.JoinedStr):
        return [leaf for value in node.values if isinstance(value, ast.Constant) for leaf in _literal_leaves(value)]
    if isinstance(node, ast.Starred):
        return _leaves(node.value)
    if isinstance(node, ast.Call):
        receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
        own = _literal_leaves(receiver) if isinstance(receiver, ast.Constant) else []
        args = node.args[:1] if isinstance(node.func, ast.Name) and node.func.id in FIRST_ARGUMENT_ONLY else node.args
        return own + [leaf for arg in args for leaf in _leaves(arg)] + [
            leaf for keyword in node.keywords if keyword.arg not in SETTING_KEYWORDS for leaf in _leaves(keyword.value)]
    return []


def _bool_rows(node: ast.AST) -> list[ast.AST]:
    """The lists and tuples of an expectation holding two truth values or more (`[True, False, True]`): a bool has
    one other value only, so a pair of them, changed together, is the site (three other combinations)."""
    found = []
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, ast.List | ast.Tuple) and sum(
                isinstance(e, ast.Constant) and isinstance(e.value, bool) for e in current.elts) >= 2:
            found.append(current)
        if isinstance(current, ast.Call):
            stack.extend([*current.args, *(keyword.value for keyword in current.keywords)])
        elif isinstance(current, ast.List | ast.Tuple | ast.Set):
            stack.extend(current.elts)
        elif isinstance(current, ast.Dict):
            stack.extend(current.values)
        elif isinstance(current, ast.BinOp):
            stack.extend([current.left, current.right])
    return found


def bits_candidates(node: ast.List | ast.Tuple, rng: random.Random, families: int = 3) -> list[Variant]:
    """Two truth values of a list changed together: the three other combinations of the pair, one family per pair
    (k of the three are drawn: together with the real one they are any three of the four, each as likely)."""
    positions = [i for i, e in enumerate(node.elts) if isinstance(e, ast.Constant) and isinstance(e.value, bool)]
    pairs = [(i, j) for index, i in enumerate(positions) for j in positions[index + 1:]]
    variants = []
    for i, j in rng.sample(pairs, min(families, len(pairs))):
        real = (node.elts[i].value, node.elts[j].value)
        for combination in ((a, b) for a in (False, True) for b in (False, True)):
            if combination == real:
                continue
            clone = copy.deepcopy(node)
            clone.elts[i], clone.elts[j] = ast.Constant(value=combination[0]), ast.Constant(value=combination[1])
            variants.append(Variant(replacement=ast.unparse(clone), family=f"bits:{i},{j}"))
    return variants


def _names(node: ast.AST) -> set[str]:
    return {child.id for child in ast.walk(node) if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load)}


def _argnames(node: ast.AST) -> list[str] | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        names = [name.strip() for name in node.value.split(",") if name.strip()]
    elif isinstance(node, ast.List | ast.Tuple) and all(
            isinstance(element, ast.Constant) and isinstance(element.value, str) for element in node.elts):
        names = [element.value.strip() for element in node.elts]
    else:
        return None
    return names if names and all(name.isidentifier() for name in names) else None


def _id_part(node: ast.AST, argname: str, index: int) -> str | None:
    """What pytest makes of one parameter value in a test id, before it escapes the id (`pytest_id`); None where it
    cannot be told from the source (a name, an empty string)."""
    if isinstance(node, ast.Constant | ast.UnaryOp) and _is_literal(node):
        value = ast.literal_eval(node)
        if isinstance(value, str):
            return value or None
        if isinstance(value, bytes):
            return value.decode("ascii") if value and all(32 <= byte < 127 and byte != 92 for byte in value) else None
        if isinstance(value, bool | int | float | complex) or value is None:
            return str(value)
    if isinstance(node, ast.List | ast.Tuple | ast.Set | ast.Dict) or (
            isinstance(node, ast.Call) and _value_call(node.func)):
        return f"{argname}{index}"  # an object without a name of its own: pytest writes the argument and its index
    return None


def pytest_id(raw: str) -> str:
    """An id as pytest shows it: non-ASCII and non-printable characters escaped (explicit ids too)."""
    return raw.encode("unicode_escape").decode("ascii")


@dataclass
class ParamTable:
    """A test's one `parametrize` table, its rows read from the decorator or from a module constant it names, and
    the id pytest gives each row (checked against the ids of the tests graded)."""

    decorator: ast.Call
    argnames: list[str]
    rows: list[ast.AST]  # each row as written: a tuple, a single value, or a pytest.param(...)
    values: list[list[ast.AST]]  # each row's value for each argname
    explicit: list[str | None]  # each row's id where the source gives it (ids=..., pytest.param(id=...))
    ids: list[str]  # each row's id as pytest shows it

    def ids_with(self, changed: dict[int, ast.AST]) -> list[str] | None:
        """The rows' ids with some leaves changed (None where one cannot be told, or two collide)."""
        ids = []
        for index, cells in enumerate(self.values):
            if self.explicit[index] is not None:
                ids.append(pytest_id(self.explicit[index]))
                continue
            parts = [_id_part(changed.get(id(cell), cell), name, index)
                     for cell, name in zip(cells, self.argnames, strict=True)]
            if None in parts:
                return None
            ids.append(pytest_id("-".join(parts)))
        return ids if len(set(ids)) == len(ids) else None  # pytest numbers duplicates, differently by version


def param_table(module: ast.Module, function: ast.FunctionDef | ast.AsyncFunctionDef,
                known: list[str]) -> ParamTable | None:
    """The function's parametrize table when every row can be rewritten and every known test id found in it."""
    decorators = [node for node in function.decorator_list
                  if isinstance(node, ast.Call) and _call_name(node) == "parametrize"]
    if len(decorators) != 1:
        return None
    decorator = decorators[0]
    keywords = {keyword.arg: keyword.value for keyword in decorator.keywords}
    if len(decorator.args) != 2 or None in keywords or {"argnames", "argvalues", "indirect"} & set(keywords):
        return None
    argnames = _argnames(decorator.args[0])
    table = decorator.args[1]
    if isinstance(table, ast.Name):
        bound = [node for node in module.body if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign)
                 and any(isinstance(target, ast.Name) and target.id == table.id
                         for target in (node.targets if isinstance(node, ast.Assign) else [node.target]))]
        if len(bound) != 1 or not isinstance(bound[0], ast.Assign) or len(bound[0].targets) != 1:
            return None
        table = bound[0].value
    if argnames is None or not isinstance(table, ast.List | ast.Tuple) or not table.elts:
        return None
    rows, values, explicit = list(table.elts), [], []
    given = keywords.get("ids")
    if given is not None and not (isinstance(given, ast.List | ast.Tuple) and len(given.elts) == len(rows) and all(
            isinstance(element, ast.Constant) and (element.value is None or isinstance(element.value, str))
            for element in given.elts)):
        return None
    for index, row in enumerate(rows):
        row_id = given.elts[index].value if given is not None else None
        if isinstance(row, ast.Call) and _call_name(row) == "param":
            row_keywords = {keyword.arg: keyword.value for keyword in row.keywords}
            if set(row_keywords) - {"id", "marks"} or any(isinstance(arg, ast.Starred) for arg in row.args):
                return None
            cells = list(row.args)
            if "id" in row_keywords:
                if not (isinstance(row_keywords["id"], ast.Constant) and isinstance(row_keywords["id"].value, str)):
                    return None
                row_id = row_keywords["id"].value
        elif len(argnames) == 1:
            cells = [row]
        elif isinstance(row, ast.List | ast.Tuple) and not any(isinstance(e, ast.Starred) for e in row.elts):
            cells = list(row.elts)
        else:
            return None
        if len(cells) != len(argnames):
            return None
        values.append(cells)
        explicit.append(row_id)
    found = ParamTable(decorator, argnames, rows, values, explicit, [])
    ids = found.ids_with({})
    if ids is None:
        return None
    found.ids = ids
    if not known or any(NodeId.parse(test).params[1:-1] not in set(ids) for test in known):
        return None  # a fixture's params, stacked tables or ids this reading does not reproduce
    return found


def render_param(table: ParamTable, changed: dict[int, ast.AST] | None = None) -> str:
    """The parametrize decorator with its rows written in it (a table named from the module copied in), changed
    leaves replaced."""
    changed = changed or {}
    rows = []
    for row in table.rows:
        memo: dict = {}
        clone = copy.deepcopy(row, memo)
        for original, replacement in changed.items():
            if original in memo:
                target = memo[original]
                clone = _Replace(target, replacement).visit(clone)
        rows.append(clone)
    decorator = ast.Call(func=copy.deepcopy(table.decorator.func),
                         args=[copy.deepcopy(table.decorator.args[0]), ast.List(elts=rows, ctx=ast.Load())],
                         keywords=copy.deepcopy(table.decorator.keywords))
    return ast.unparse(ast.fix_missing_locations(decorator))


class _Replace(ast.NodeTransformer):
    def __init__(self, target: ast.AST, replacement: ast.AST):
        self.target, self.replacement = target, replacement

    def visit(self, node):
        if node is self.target:
            return ast.copy_location(self.replacement, node)
        return self.generic_visit(node)


@dataclass
class _Finder:
    """Expectation sites of one test function, with the helpers of its module that check a parameter.

    An equality check's expectation is its literal side, else the one side built from literals and names by value
    constructors only (VALUE_CALLS) that holds a literal or a name carrying one. A name carries one when it is bound
    only to such expressions (`expected = "\\n".join([...])`), by a `for` over a table written in the test, or by
    the test's parametrize table, and is used only where an expectation is (or printed): a name the code under
    test also receives is an input, and is never changed."""

    function: ast.FunctionDef | ast.AsyncFunctionDef
    helpers: dict[str, dict[int | str, bool]] = field(default_factory=dict)  # name -> positions/keywords checked
    param: ParamTable | None = None
    imported: frozenset[str] = frozenset()
    sites: list[Site] = field(default_factory=list)
    param_names: set[str] = field(default_factory=set)  # the parametrize arguments that carry an expectation

    def __post_init__(self) -> None:
        self.parent: dict[int, ast.AST] = {}
        for node in ast.walk(self.function):
            for child in ast.iter_child_nodes(node):
                self.parent[id(child)] = node
        # The nodes of its body, nested functions and lambdas included: a name bound or used there counts (a
        # stricter reading than Python's scopes, never a looser one).
        self.own: list[ast.AST] = [node for statement in self.function.body for node in ast.walk(statement)]
        arguments = self.function.args
        self.arguments = {arg.arg for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}
        self.assigned: dict[str, list[ast.AST]] = {}
        self.bound: Counter = Counter()  # how many times each name is bound in the function, by any statement
        for node in self.own:
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
                self.bound[node.id] += 1
            elif isinstance(node, ast.arg):
                self.bound[node.arg] += 2  # a nested function's or a lambda's parameter
            elif isinstance(node, ast.alias):
                self.bound[(node.asname or node.name).split(".")[0]] += 2  # bound otherwise: never a carrier
            elif isinstance(node, ast.ExceptHandler | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) \
                    and node.name:
                self.bound[node.name] += 2
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.assigned.setdefault(node.targets[0].id, []).append(node.value)
        self.tables: dict[str, list[ast.AST]] = {}  # a for-loop name -> the table cells it takes, row by row
        for node in self.own:
            if isinstance(node, ast.For):
                self.for_table(node)

    def shaped(self, node: ast.AST) -> bool:
        return _shaped(node, self.imported)

    def for_table(self, loop: ast.For) -> None:
        """`for x, expected in [(1, "a"), ...]` (or a name bound once to such a table and used only there): each
        row's cells are taken by the loop's names."""
        rows = loop.iter
        if isinstance(rows, ast.Name):
            if self.bound[rows.id] != 1 or len(self.assigned.get(rows.id, [])) != 1 or len(self.uses(rows.id)) != 1:
                return
            rows = self.assigned[rows.id][0]
        if not isinstance(rows, ast.List | ast.Tuple) or not rows.elts:
            return
        if isinstance(loop.target, ast.Name):
            self.tables[loop.target.id] = list(rows.elts)
        elif isinstance(loop.target, ast.Tuple) and all(isinstance(e, ast.Name) for e in loop.target.elts):
            width = len(loop.target.elts)
            if not all(isinstance(row, ast.Tuple | ast.List) and len(row.elts) == width
                       and not any(isinstance(e, ast.Starred) for e in row.elts) for row in rows.elts):
                return
            for position, target in enumerate(loop.target.elts):
                self.tables[target.id] = [row.elts[position] for row in rows.elts]

    # -- which names carry an expectation

    def candidates(self) -> set[str]:
        names = set()
        for name, values in self.assigned.items():
            if self.bound[name] == len(values) and name not in self.arguments and all(map(self.shaped, values)):
                names.add(name)
        for name, cells in self.tables.items():
            if self.bound[name] == 1 and name not in self.assigned and name not in self.arguments \
                    and any(self.shaped(cell) and _leaves(cell) for cell in cells):
                names.add(name)  # the cells built otherwise (a comprehension) are left as they are
        if self.param is not None:
            names.update(name for name in self.param.argnames if name in self.arguments and not self.bound[name])
        return names

    def anchored(self, node: ast.AST, carriers: set[str]) -> bool:
        return self.shaped(node) and bool(_leaves(node) or _names(node) & carriers)

    def designate(self, a: ast.AST, b: ast.AST, carriers: set[str]) -> ast.AST | None:
        """Which of two compared expressions is the expectation, if one plainly is."""
        if _is_literal(a) != _is_literal(b):
            return a if _is_literal(a) else b
        if _is_literal(a):
            return None
        mine, other = self.anchored(a, carriers), self.anchored(b, carriers)
        if mine != other:
            return a if mine else b
        return None

    def expectations(self, carriers: set[str]) -> list[ast.AST]:
        """The expectation side of every equality check of the test: asserted (alone or in an `and`), through an
        equality call made as a statement or asserted, or passed where a helper of the module compares it."""
        sides: list[ast.AST] = []

        def asserted(test: ast.AST) -> None:
            if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
                for value in test.values:
                    asserted(value)
            elif isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
                side = self.designate(test.left, test.comparators[0], carriers)
                if side is not None:
                    sides.append(side)
            elif isinstance(test, ast.Call):
                called(test)

        def called(node: ast.Call) -> None:
            name = _call_name(node)
            if is_equality_call(name) and name != "approx":
                if len(node.args) >= 2 and not any(isinstance(arg, ast.Starred) for arg in node.args[:2]):
                    side = self.designate(node.args[0], node.args[1], carriers)
                    if side is not None:
                        sides.append(side)
                elif len(node.args) == 1 and isinstance(node.args[0], ast.List | ast.Tuple):
                    # all_equal([computed, 5]): the literal members are what the computed ones must equal.
                    elements = node.args[0].elts
                    fixed = [element for element in elements if _is_literal(element)]
                    if fixed and len(fixed) < len(elements):
                        sides.extend(fixed)
            elif name in self.helpers and (isinstance(node.func, ast.Name) or (
                    isinstance(node.func.value, ast.Name) and node.func.value.id in ("self", "cls"))):
                checked = self.helpers[name]
                for position, arg in enumerate(node.args):
                    if checked.get(position) and not isinstance(arg, ast.Starred) and self.anchored(arg, carriers):
                        sides.append(arg)
                for keyword in node.keywords:
                    if keyword.arg and checked.get(keyword.arg) and self.anchored(keyword.value, carriers):
                        sides.append(keyword.value)

        for node in self.own:
            if isinstance(node, ast.Assert):
                asserted(node.test)
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                called(node.value)  # a check made as a statement (an equality call's result unused is no check)
        return sides

    def carriers(self) -> tuple[set[str], list[ast.AST]]:
        """The names that carry an expectation, and the expectation sides, at their fixed point: a name stays when
        every use of it is in an expectation, printed, or in the value of another name that stays, and an
        expectation reaches it."""
        names = self.candidates()
        for _ in range(8):
            sides = self.expectations(names)
            inside = {id(node) for side in sides for node in ast.walk(side)}
            feeds: dict[str, set[str]] = {}  # name -> the names whose value it is used in
            kept = set()
            for name in names:
                allowed = True
                for use in self.uses(name):
                    if id(use) in inside or self.printed(use):
                        continue
                    target = self.assigned_to(use)
                    if target is None or target not in names:
                        allowed = False
                        break
                    feeds.setdefault(name, set()).add(target)
                if allowed:
                    kept.add(name)
            reached = kept & set().union(*map(_names, sides))
            while more := {name for name in kept - reached if feeds.get(name, set()) & reached}:
                reached |= more
            if reached == names:
                return names, sides
            names = reached
        return names, self.expectations(names)

    def uses(self, name: str) -> list[ast.Name]:
        return [node for node in self.own if isinstance(node, ast.Name) and node.id == name
                and isinstance(node.ctx, ast.Load)]

    def printed(self, use: ast.AST) -> bool:
        """In a `print(...)` or an assert's message."""
        node = use
        while id(node) in self.parent:
            parent = self.parent[id(node)]
            if isinstance(parent, ast.Call) and _call_name(parent) == "print" and isinstance(parent.func, ast.Name):
                return True
            if isinstance(parent, ast.Assert) and parent.msg is node:
                return True
            if isinstance(parent, ast.stmt):
                return False
            node = parent
        return False

    def assigned_to(self, use: ast.AST) -> str | None:
        """The name whose plain assignment's value holds this use."""
        node = use
        while id(node) in self.parent:
            parent = self.parent[id(node)]
            if isinstance(parent, ast.Assign):
                target = parent.targets[0]
                return target.id if parent.value is node and len(parent.targets) == 1 \
                    and isinstance(target, ast.Name) else None
            if isinstance(parent, ast.stmt):
                return None
            node = parent
        return None

    # -- sites

    def add_values(self, node: ast.AST) -> None:
        for leaf in _leaves(node):
            self.sites.append(Site(leaf, "value"))
        for container in _bool_rows(node):
            self.sites.append(Site(container, "bits"))

    def visit(self) -> list[Site]:
        names, sides = self.carriers()
        for side in sides:
            self.add_values(side)
        for name in sorted(names, key=lambda name: min((use.lineno for use in self.uses(name)), default=0)):
            for value in self.assigned.get(name, []):
                self.add_values(value)
            for cell in self.tables.get(name, []):
                if self.shaped(cell):
                    self.add_values(cell)
        if self.param is not None:
            self.param_names = names & set(self.param.argnames)
            if self.param_names:
                self.sites.append(Site(self.param.decorator, "param"))
        for node in self.own:
            if isinstance(node, ast.Assert):
                self.visit_assert(node)
            elif isinstance(node, ast.Call):
                self.visit_call(node)
        seen: set[int] = set()
        unique = []
        for site in self.sites:
            if id(site.node) not in seen:
                seen.add(id(site.node))
                unique.append(site)
        return unique

    def visit_assert(self, node: ast.Assert) -> None:
        test = node.test
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            op, right = test.ops[0], test.comparators[0]
            if isinstance(op, ast.Is | ast.IsNot) and isinstance(right, ast.Constant) \
                    and right.value in (None, True, False) and not isinstance(test.left, ast.Constant):
                self.sites.append(Site(test, "flip_is"))
                return
            if type(op) in COMPLEMENTS:
                # Its operands pin no value to change (an equality's expectation is a site of its own), but the
                # comparison's answer is checked: the complementary operator, written as plainly, must fail.
                self.sites.append(Site(test, "flip_compare"))
                return
        if isinstance(test, ast.Call) and is_equality_call(_call_name(test)):
            return  # handled as a call (isclose, allclose inside an assert)
        if not _is_literal(test):
            self.sites.append(Site(node, "flip_assert"))

    def visit_call(self, node: ast.Call) -> None:
        name = _call_name(node)
        if name in FLIP_CALLS and isinstance(node.func, ast.Attribute):
            self.sites.append(Site(node, "flip_call"))
        elif name in RAISES_CALLS and node.args and isinstance(node.args[0], ast.Name | ast.Attribute):
            self.sites.append(Site(node.args[0], "exception"))


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
            elif isinstance(node, ast.Call) and is_equality_call(_call_name(node)) and len(node.args) >= 2:
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


def _find(module: ast.Module, ref: NodeId, known: list[str] | None = None) -> tuple[list[tuple[int, str]], _Finder | None]:
    function = find_function(module, ref.owner, ref.name)
    if function is None:
        return [], None
    owner = next((node for node in module.body if isinstance(node, ast.ClassDef) and node.name == ref.owner), None)
    known = known if known is not None else ([ref.path + "::" + (f"{ref.owner}::" if ref.owner else "") + ref.name
                                               + ref.params] if ref.params else [])
    helpers = {**checking_helpers(module, owner), **checking_helpers(ast.Module(body=function.body, type_ignores=[]),
                                                                     None)}  # functions the test defines too
    finder = _Finder(function, helpers, param_table(module, function, known),
                     imported=imported_names(module))
    sites = finder.visit()
    index = {id(node): position for position, node in enumerate(ast.walk(function))}
    # Value sites first (they give k decoys), then exception swaps, then flips (one decoy each).
    order = {"value": 0, "param": 0, "bits": 0, "exception": 1, "flip_is": 2, "flip_compare": 2, "flip_call": 2,
             "flip_assert": 3}
    found = sorted({(index[id(site.node)], site.kind) for site in sites if id(site.node) in index},
                   key=lambda item: (order[item[1]], item[0]))
    return found, finder


def find_sites(module: ast.Module, ref: NodeId, known: list[str] | None = None) -> list[tuple[int, str]]:
    """(index in ast.walk order, kind) of each expectation site of a test, in a stable order. `known`: the test
    ids of this function that are graded (a parametrize table is a site only when each of them is found in it)."""
    return _find(module, ref, known)[0]


def imported_names(module: ast.Module) -> frozenset[str]:
    return frozenset((alias.asname or alias.name).split(".")[0] for node in ast.walk(module)
                     if isinstance(node, ast.Import | ast.ImportFrom) for alias in node.names)


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


# Punctuation a string made of punctuation only (a regex, a rule) may take instead of one of its own: quotes and
# backslashes are left out (a decoy spelling escapes the real value never needs would stand out).
PUNCTUATION = "".join(c for c in string.punctuation if c not in "\\'\"`")


def _text_positions(text: str) -> list[int]:
    """The positions of a string a decoy may change: its letters and digits; in a string without any, its
    punctuation where it mixes three marks or more, outside runs of one (`(.+?)`, not `+---+` or `=====`: a rule
    of one or two marks is read at a glance, and a changed bracket or separator among words would read as a typo)."""
    found = [i for i, char in enumerate(text) if char.isascii() and char.isalnum()]
    if found or len({char for char in text if char in PUNCTUATION}) < 3:
        return found
    return [i for i, char in enumerate(text) if char in PUNCTUATION
            and char not in text[max(0, i - 1):i] + text[i + 1:i + 2]]


def _same_class(char: str) -> str:
    if char in PUNCTUATION:
        return PUNCTUATION
    if char.isdigit():
        return string.digits
    if char.isupper():
        return string.ascii_uppercase
    return string.ascii_lowercase


def _tokens(inputs: str) -> list[str]:
    return [token for token in re.split(r"[^0-9A-Za-z]+", inputs) if token]


def _shared(text: str, position: int, inputs: str, tokens: list[str]) -> bool:
    """Whether the character at `position` is part of a likeness between `text` and `inputs` (a two-character
    window they share, a one-character word, the first or last character of a word): changing it would make the
    decoy look less like the test's other text than the real value does, which a forger can read."""
    char = text[position]
    before, after = text[max(0, position - 1):position], text[position + 1:position + 2]
    return bool(before and before + char in inputs or after and char + after in inputs or char in tokens
                or position == 0 and any(token.startswith(char) for token in tokens)
                or position == len(text) - 1 and any(token.endswith(char) for token in tokens))


def _fresh(text: str, position: int, inputs: str) -> list[str]:
    """The characters of the same class that may replace the one at `position` without making a window the inputs
    have (a likeness the real value lacks)."""
    char = text[position]
    before, after = text[max(0, position - 1):position], text[position + 1:position + 2]
    return [c for c in _same_class(char) if c.lower() != char.lower()
            and not (before and before + c in inputs) and not (after and c + after in inputs)]


def text_candidates(value: str | bytes, k: int, rng: random.Random, positions: int = 2,
                    inputs: str = "") -> list[Variant]:
    """One character changed, at one position, to others of its class (never a case change: a case-insensitive
    comparison must not pass a decoy). All of a grading's decoys change the same position. With `inputs` (the
    test's other text), positions and characters that keep its likeness to that text are preferred (`_shared`)."""
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    eligible = _text_positions(text)
    tokens = _tokens(inputs)
    eligible = [i for i in eligible if not _shared(text, i, inputs, tokens)] or eligible
    out = []
    for position in rng.sample(eligible, min(positions, len(eligible))):
        char = text[position]
        pool = _fresh(text, position, inputs)
        pool = pool if len(pool) >= k else [c for c in _same_class(char) if c.lower() != char.lower()]
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


def _text_of(node: ast.AST) -> str:
    return " ".join(str(_literal_value(leaf)) for leaf in _leaves(node)) if _shaped(node) else ast.unparse(node)


def _row_move(leaves: list[ast.AST], inputs: str, k: int, rng: random.Random) -> tuple | None:
    """How one row's expectation moves in every variant of a family: a leaf, and for a number its step, for a
    string one position and the 2k characters it takes. Nothing the row's inputs share with its expectation is
    moved (a decoy that breaks a likeness with the inputs, `fish` -> `fish` made `fizh`, would show the real one):
    a string moves at a character no two-character window of the inputs has, to one that makes no such window; a
    number moves only when the inputs do not spell it. None: the row cannot move (its case fails no decoy)."""
    options = []
    for leaf in leaves:
        value = _literal_value(leaf)
        if isinstance(value, int | float):
            if repr(value) not in inputs and str(abs(value)) not in inputs:
                step = 1 if isinstance(value, int) else (10.0 ** math.floor(math.log10(abs(value))) if value else 1.0)
                options.append((leaf, value, step, 0, ""))
            continue
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        tokens = _tokens(inputs)
        for position, char in enumerate(text):
            if not (char.isascii() and char.isalnum()) or _shared(text, position, inputs, tokens):
                continue
            pool = _fresh(text, position, inputs)
            if len(pool) >= 2 * k:
                options.append((leaf, value, 0, position, "".join(rng.sample(pool, 2 * k))))
    return rng.choice(options) if options else None


def param_candidates(table: ParamTable, names: set[str], k: int, rng: random.Random) -> tuple[str, list[Variant]]:
    """The parametrize decorator as the real test is written at a grading (its rows in it), and variants of it in
    which every row's expectation is moved: one leaf of the row's expected values, by the same offset in every row
    (numbers: a step of the leaf's magnitude; strings: one character at one position, drawn once per row from the
    same class; see `_row_move`). Every case of the test fails in each variant, whichever cases are graded; each
    variant names its cases from its own values (Variant.ids)."""
    positions = [index for index, name in enumerate(table.argnames) if name in names]
    variants = []
    for family in range(2):
        moves = []
        for cells in table.values:
            leaves = [leaf for position in positions if _shaped(cells[position]) for leaf in _leaves(cells[position])]
            inputs = " ".join(_text_of(cell) for index, cell in enumerate(cells) if index not in positions)
            move = _row_move(leaves, inputs, k, rng)
            if move is not None:
                moves.append(move)
        if not moves:
            return "", []
        for rank, offset in enumerate(j for j in range(-k, k + 1) if j):
            changed: dict[int, ast.AST] = {}
            for leaf, value, step, position, chars in moves:
                if step:
                    places = max(_decimals(value), _decimals(step)) if isinstance(value, float) else 0
                    new = value + step * offset if isinstance(value, int) else round(value + step * offset, places)
                else:
                    text = value.decode("latin-1") if isinstance(value, bytes) else value
                    new = text[:position] + chars[rank] + text[position + 1:]
                    new = new.encode("latin-1") if isinstance(value, bytes) else new
                changed[id(leaf)] = ast.Constant(value=new)
            ids = table.ids_with(changed)
            if ids is None:
                continue
            variants.append(Variant(replacement=render_param(table, changed), family=f"step:table{family}",
                                    offset=offset, ids=dict(zip(table.ids, ids, strict=True))))
    return render_param(table), variants


def flip_pair_candidates(nodes: list[ast.AST], flips: list[tuple[int, str]], rng: random.Random,
                         families: int = 3) -> list[Variant]:
    """Two truth checks of a test flipped together, as `bits_candidates` changes two truth values: the three other
    combinations of the pair, one family per pair (k of the three are drawn: with the real one, any three of the
    four, each as likely). A test whose only checks are truths gets k decoys this way, not one. Checks nested in
    one another are never paired (flipping the outer one rewrites the inner)."""
    inside = {index: {id(node) for node in ast.walk(nodes[index])} for index, _ in flips}
    pairs = [(a, b) for position, a in enumerate(flips) for b in flips[position + 1:]
             if id(nodes[b[0]]) not in inside[a[0]] and id(nodes[a[0]]) not in inside[b[0]]]
    variants = []
    for a, b in rng.sample(pairs, min(families, len(pairs))):
        for chosen in ([a], [b], [a, b]):
            variants.append(Variant(family=f"pair:{a[0]},{b[0]}", flips=chosen))
    return variants


def _other_text(function: ast.AST, leaf: ast.AST) -> str:
    """The test's text a value at `leaf` is read beside: every other string and number it writes."""
    return "\n".join(str(node.value) for node in ast.walk(function) if node is not leaf
                      and isinstance(node, ast.Constant) and isinstance(node.value, str | int | float))


def plan_candidates(source: str, tests: list[str], k: int, rng: random.Random | None = None,
                    written_lines: set[int] | None = None) -> dict[str, DecoysOfTest]:
    """Every candidate variant of every site of `tests` (ids in this one file), before validation. With
    `written_lines` (the lines of this file the test patch wrote), sites on those lines come first. The ids of one
    function (a parametrized test's cases) share its sites and variants: they are graded as one group."""
    rng = rng or random.Random(secrets.randbits(64))
    module = parse_python(source)
    literals, exceptions = module_vocabulary(module)
    plans: dict[str, DecoysOfTest] = {}
    by_function: dict[tuple[str, str | None, str], list[str]] = {}
    for test in tests:
        by_function.setdefault(NodeId.parse(test).function, []).append(test)
    for ids in by_function.values():
        ref = NodeId.parse(ids[0])
        sites, finder = _find(module, ref, ids)
        if finder is None:
            for test in ids:
                plans[test] = DecoysOfTest(test=test, reason="the test function is not defined in its file")
            continue
        nodes = list(ast.walk(finder.function))
        if written_lines is not None:
            sites.sort(key=lambda site: getattr(nodes[site[0]], "lineno", 0) not in written_lines)  # stable
        pools = []
        for index, kind in sites[:MAX_SITES_PER_TEST * 3]:
            node, real = nodes[index], ""
            if kind == "value":
                value = _literal_value(node)
                if isinstance(value, bool):
                    continue
                variants = vocabulary_candidates(value, literals, k, rng) + (
                    number_candidates(value, k, rng) if isinstance(value, int | float)
                    else text_candidates(value, k, rng, inputs=_other_text(finder.function, node)))
            elif kind == "param":
                real, variants = param_candidates(finder.param, finder.param_names, k, rng)
            elif kind == "bits":
                variants = bits_candidates(node, rng)
            elif kind == "exception":
                original = node.id if isinstance(node, ast.Name) else ast.unparse(node)
                variants = exception_candidates(original, exceptions, k, rng)
            else:
                variants = [Variant(family="flip")]
            if variants:
                lines = {getattr(node, "lineno", 0)} if kind != "param" else {
                    getattr(leaf, "lineno", 0) for cells in finder.param.values for leaf in
                    (_leaves(cells[finder.param.argnames.index(name)]) for name in finder.param_names)
                    for leaf in leaf}
                written = written_lines is None or lines <= written_lines
                pools.append(SitePool(site=index, kind=kind, variants=variants[:MAX_VARIANTS_PER_SITE],
                                      written=written, real=real))
            if len(pools) >= MAX_SITES_PER_TEST:
                break
        pools = _with_flip_pair(pools, sites, nodes, rng, written_lines)
        reason = "" if pools else ("no checked expectation to change: the test compares no literal, asserts no "
                                   "truth and expects no exception in its own body or a helper of its module")
        for test in ids:
            plans[test] = DecoysOfTest(test=test, pools=[pool.model_copy(deep=True) for pool in pools], reason=reason)
    return plans


def _with_flip_pair(pools: list[SitePool], sites: list[tuple[int, str]], nodes: list[ast.AST], rng: random.Random,
                    written_lines: set[int] | None) -> list[SitePool]:
    """The pools with the test's single flips replaced by a pair of them (`flip_pair_candidates`), where it has two
    truth checks or more: a single flip gives one decoy, a pair k."""
    flips = [(index, kind) for index, kind in sites if kind.startswith("flip_")]
    if written_lines is not None:
        on_written = [flip for flip in flips if getattr(nodes[flip[0]], "lineno", 0) in written_lines]
        flips = on_written if len(on_written) >= 2 else flips
    variants = flip_pair_candidates(nodes, flips, rng)
    if not variants:
        return pools
    lines = {getattr(nodes[index], "lineno", 0) for variant in variants for index, _ in variant.flips}
    pair = SitePool(site=variants[0].flips[0][0], kind="flip_pair", variants=variants,
                    written=written_lines is None or lines <= written_lines)
    kept = [pool for pool in pools if not pool.kind.startswith("flip_")]
    return (kept + [pair])[:MAX_SITES_PER_TEST] if len(kept) < MAX_SITES_PER_TEST else kept


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
    def __init__(self, target: ast.AST, kind: str, variant: Variant | None, cases: set[str] | None = None):
        self.target, self.kind, self.variant, self.cases = target, kind, variant, cases

    def visit(self, node):
        if node is not self.target or self.variant is None:
            return self.generic_visit(node)
        if self.kind == "value":
            return ast.copy_location(ast.Constant(value=literal(self.variant.replacement)), node)
        if self.kind == "exception":
            return ast.copy_location(ast.Name(id=self.variant.replacement, ctx=ast.Load()), node)
        if self.kind == "bits":
            return ast.copy_location(parse_python(self.variant.replacement, mode="eval").body, node)
        if self.kind == "flip_compare":
            op = COMPLEMENTS[type(node.ops[0])]()
            return ast.copy_location(ast.Compare(left=node.left, ops=[op], comparators=node.comparators), node)
        if self.kind == "param":
            return ast.copy_location(graded_rows(parse_python(self.variant.replacement, mode="eval").body,
                                                 list(self.variant.ids), self.cases), node)
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


def graded_rows(decorator: ast.AST, ids: list[str], cases: set[str] | None) -> ast.AST:
    """A parametrize decorator keeping only the rows of the graded cases (`ids`: each row's id, in order, as the
    real test has it): every member of a group keeps the same rows, and a decoy runs no case nobody grades."""
    if cases is None or not isinstance(decorator, ast.Call) or len(decorator.args) != 2 \
            or not isinstance(decorator.args[1], ast.List) or len(decorator.args[1].elts) != len(ids):
        return decorator
    keep = [index for index, case in enumerate(ids) if case in cases]
    decorator.args[1].elts = [decorator.args[1].elts[index] for index in keep]
    for keyword in decorator.keywords:
        if keyword.arg == "ids" and isinstance(keyword.value, ast.List | ast.Tuple) \
                and len(keyword.value.elts) == len(ids):
            keyword.value.elts = [keyword.value.elts[index] for index in keep]
    return decorator


def render_function(function: ast.FunctionDef | ast.AsyncFunctionDef, member: Member, indent: int,
                    cases: set[str] | None = None) -> str:
    """The function under the member's name, with its site changed to its variant (the real test: unchanged, or
    written as its decoys are). `cases`: the graded cases of a parametrized test (a table site keeps those rows)."""
    clone = copy.deepcopy(function)
    if member.variant is not None and member.site is not None:
        nodes = list(ast.walk(clone))
        changes = [(nodes[index], kind, Variant(family="flip")) for index, kind in member.variant.flips] \
            if member.kind == "flip_pair" else [(nodes[member.site], member.kind, member.variant)]
        for target, kind, variant in changes:  # targets found before any rewrite: a pair's are not nested
            if target is clone:
                raise DecoyError("a decoy site cannot be the test function itself")
            clone = _Rewrite(target, kind, variant, cases).visit(clone)
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
    cases: set[str] | None = None  # the graded cases' ids (a parametrized test's), None: every case


def random_name() -> str:
    return "test_" + secrets.token_hex(NAME_HEX // 2)


def rewrite_module(source: str, groups: list[Group]) -> str:
    """The module with each group's function replaced, where it stood, by its members in their order."""
    module = parse_python(source)
    lines = source.splitlines(keepends=True)
    spans = []
    for group in groups:
        function = find_function(module, group.ref.owner, group.ref.name)
        if function is None:
            raise DecoyError(f"{group.ref.path}: no function {group.ref.name} to rewrite")
        start = min([function.lineno, *(d.lineno for d in function.decorator_list)])
        blocks = [render_function(function, member, function.col_offset, group.cases) for member in group.members]
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
            module = parse_python(source)
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
            value = literal(text)
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


def _shown(member: Member) -> str:
    """A decoy's value in the evidence (a parametrize table's variant by its offset: the table is long)."""
    if member.variant is None:
        return "flip"
    if member.kind == "param":
        return f"every row's expectation moved by {member.variant.offset} ({member.variant.family})"
    if member.kind == "flip_pair":
        return "flipped " + ", ".join(f"{kind} at {index}" for index, kind in member.variant.flips)
    return member.variant.replacement


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
        real = Member(random_name(), "real")
        members = [real]
        # The ids of one function share its sites (plan_candidates): the first with any stands for all.
        pools = next((plan.tests[test].pools for test in tests if test in plan.tests and plan.tests[test].pools), [])
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
                strength = {"value": 2, "param": 2, "bits": 2, "exception": 1}.get(pool.kind, 0)
                size = len(draw_variants(matched, k, random.Random(0)))
                ranked.append(((matched.written, strength, fit, size), matched))
            best = max(rank for rank, _ in ranked)
            pool = rng.choice([matched for rank, matched in ranked if rank == best])
            members += [Member(random_name(), "decoy", pool.site, pool.kind, variant)
                        for variant in draw_variants(pool, k, rng)]
            if pool.real and len(members) > 1:  # written as its decoys are (a parametrize table spelled out)
                cases = list(members[1].variant.ids)
                real.site, real.kind = pool.site, pool.kind
                real.variant = Variant(replacement=pool.real, family="real", ids=dict(zip(cases, cases, strict=True)))
        rng.shuffle(members)
        return members

    # A decoy is judged on the cases its site was validated on (a parametrized test's planned cases): its other
    # cases run, but a case no gold run saw fail is no evidence either way.
    validated = {test for test, found in plan.tests.items() if found.pools}
    return _layout(sources, fail_to_pass, pass_to_pass, members_of, rng, untouched=plan.untouched,
                   decoy_tests=validated)


def validation_layout(sources: dict[str, str], candidates: dict[str, DecoysOfTest], fail_to_pass: list[str],
                      pass_to_pass: list[str]) -> DecoyLayout:
    """Every candidate variant of every site as a decoy of its own: what runs under the gold patch to find the
    variants that fail there (Verifier.decoy_plan)."""
    def members_of(tests: list[str]) -> list[Member]:
        found = next((candidates[test] for test in tests if test in candidates), None)
        members = [Member(random_name(), "real")] + [
            Member(random_name(), "decoy", pool.site, pool.kind, variant)
            for pool in (found.pools if found else []) for variant in pool.variants]
        rng.shuffle(members)  # decoys before the real test too, as at a grading
        return members

    rng = random.SystemRandom()
    return _layout(sources, fail_to_pass, pass_to_pass, members_of, rng, decoy_tests=set(candidates))


def inherited(sources: dict[str, str], functions: list[tuple[str, str | None, str]]) -> set[tuple[str, str | None, str]]:
    """The graded test methods a class of the module inherits (`Sub::test_m` where `Sub` does not define test_m),
    and the methods they inherit from, up the module's own base classes."""
    frozen: set[tuple[str, str | None, str]] = set()
    modules: dict[str, ast.Module | None] = {}
    for path, owner, name in functions:
        if owner is None or "::" in owner:
            continue
        if path not in modules:
            try:
                modules[path] = parse_python(sources[path]) if path in sources else None
            except (SyntaxError, ValueError):
                modules[path] = None
        module = modules[path]
        if module is None:
            continue
        classes = {node.name: node for node in module.body if isinstance(node, ast.ClassDef)}
        if owner not in classes or find_function(module, owner, name) is not None:
            continue
        frozen.add((path, owner, name))
        queue, seen = [classes[owner]], set()
        while queue:
            current = queue.pop()
            for base in current.bases:
                if isinstance(base, ast.Name) and base.id in classes and base.id not in seen:
                    seen.add(base.id)
                    queue.append(classes[base.id])
                    if find_function(module, base.id, name) is not None:
                        frozen.add((path, base.id, name))
    return frozen


def _layout(sources: dict[str, str], fail_to_pass: list[str], pass_to_pass: list[str], members_of,
            rng: random.Random, untouched: dict[str, str] | None = None,
            decoy_tests: set[str] | None = None) -> DecoyLayout:
    """`decoy_tests`: the graded tests whose decoys are judged (None: all); a decoy's other cases get no id."""
    layout = DecoyLayout()
    by_function: dict[tuple[str, str | None, str], list[str]] = {}
    for test in dict.fromkeys([*fail_to_pass, *pass_to_pass]):
        by_function.setdefault(NodeId.parse(test).function, []).append(test)
    per_file: dict[str, list[Group]] = {}
    ids_of: dict[tuple[str, str | None, str], list[str]] = {}
    frozen = inherited(sources, list(by_function))
    for function, tests in by_function.items():
        if function in frozen:
            # A method a graded subclass inherits (or the inherited id itself): renamed in its class, the
            # subclass's test would be gone. It is graded as it is, under its own name, with no decoy.
            ids_of[function] = list(tests)
            layout.real.update({test: test for test in tests})
            continue
        members = members_of(tests)
        cases = {NodeId.parse(test).params[1:-1] for test in tests}
        per_file.setdefault(function[0], []).append(Group(NodeId.parse(tests[0]), members,
                                                          cases if all(NodeId.parse(t).params for t in tests) else None))
        ids_of[function] = []
        for test in tests:
            ref = NodeId.parse(test)
            for member in members:
                if member.role == "decoy" and decoy_tests is not None and test not in decoy_tests:
                    continue
                renamed = ref.renamed(member.name)
                if member.variant is not None and member.variant.ids and ref.params:
                    # A parametrize table's decoy: its cases are named from its own values.
                    params = member.variant.ids.get(ref.params[1:-1], ref.params[1:-1])
                    renamed = NodeId(ref.path, ref.owner, member.name, f"[{params}]").renamed(member.name)
                ids_of[function].append(renamed)
                layout.members[renamed] = member
                if member.role == "real":
                    layout.real[test] = renamed
                else:
                    layout.decoys[renamed] = test
                    layout.drawn.setdefault(test, {"site": member.site, "kind": member.kind, "values": []})[
                        "values"].append(_shown(member))
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
