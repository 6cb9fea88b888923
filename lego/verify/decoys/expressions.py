"""What an expectation looks like in a test's AST: literals, values built by value constructors, their
perturbable leaves."""

from __future__ import annotations

import ast
import math
import string


def is_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value is not Ellipsis
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        return isinstance(node.operand, ast.Constant) and type(node.operand.value) in (int, float)
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return all(is_literal(element) for element in node.elts)
    if isinstance(node, ast.Dict):
        return all(key is not None and is_literal(key) for key in node.keys) and all(map(is_literal, node.values))
    return False


def literal_leaves(node: ast.AST) -> list[ast.AST]:
    """The perturbable scalars of a literal: numbers (a negative one as its unary minus), strings, bytes."""
    if isinstance(node, ast.UnaryOp):
        return [node]
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or value is None:
            return []
        if isinstance(value, int | float) and not (isinstance(value, float) and not math.isfinite(value)):
            return [node]
        if isinstance(value, str | bytes) and text_positions(
                value.decode("latin-1") if isinstance(value, bytes) else value):
            return [node]
        return []
    if isinstance(node, ast.Dict):
        return [leaf for value in node.values for leaf in literal_leaves(value)]  # keys select, values are checked
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [leaf for element in node.elts for leaf in literal_leaves(element)]
    return []


def call_name(node: ast.AST) -> str:
    func = node.func if isinstance(node, ast.Call) else None
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def node_value(node: ast.AST):
    return ast.literal_eval(node)


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


def is_value_call(func: ast.AST, imported: frozenset[str] = frozenset()) -> bool:
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


def expectation_shaped(node: ast.AST, imported: frozenset[str] = frozenset()) -> bool:
    """Whether an expression is built from literals and names by value constructors only (an expectation's shape)."""
    if isinstance(node, ast.Constant):
        return node.value is not Ellipsis
    if isinstance(node, ast.Name):
        return True
    if isinstance(node, ast.Attribute):
        return _dotted(node)
    if isinstance(node, ast.Starred):
        return expectation_shaped(node.value, imported)
    if isinstance(node, ast.UnaryOp):
        return expectation_shaped(node.operand, imported)
    if isinstance(node, ast.BinOp):
        return expectation_shaped(node.left, imported) and expectation_shaped(node.right, imported)
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return all(expectation_shaped(element, imported) for element in node.elts)
    if isinstance(node, ast.Dict):
        return all(key is not None and expectation_shaped(key, imported) for key in node.keys) \
            and all(expectation_shaped(value, imported) for value in node.values)
    if isinstance(node, ast.JoinedStr):
        return all(isinstance(value, ast.Constant)
                   or (isinstance(value, ast.FormattedValue) and expectation_shaped(value.value, imported))
                   for value in node.values)
    if isinstance(node, ast.Call):
        return (is_value_call(node.func, imported) and all(expectation_shaped(arg, imported) for arg in node.args)
                and all(expectation_shaped(keyword.value, imported) for keyword in node.keywords))
    return False


def expectation_leaves(node: ast.AST) -> list[ast.AST]:
    """The perturbable scalars of an expectation-shaped expression (dict keys select and tolerances are settings:
    neither is one)."""
    if isinstance(node, ast.Constant | ast.UnaryOp) and is_literal(node):
        return literal_leaves(node)
    if isinstance(node, ast.UnaryOp):
        return expectation_leaves(node.operand)
    if isinstance(node, ast.BinOp):
        return expectation_leaves(node.left) + expectation_leaves(node.right)
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [leaf for element in node.elts for leaf in expectation_leaves(element)]
    if isinstance(node, ast.Dict):
        # The values are checked; the keys only select them, unless no value holds anything to change.
        return [leaf for value in node.values for leaf in expectation_leaves(value)] \
            or [leaf for key in node.keys if key is not None for leaf in expectation_leaves(key)]
    if isinstance(node, ast.JoinedStr):
        return [leaf for value in node.values if isinstance(value, ast.Constant) for leaf in literal_leaves(value)]
    if isinstance(node, ast.Starred):
        return expectation_leaves(node.value)
    if isinstance(node, ast.Call):
        receiver = node.func.value if isinstance(node.func, ast.Attribute) else None
        own = literal_leaves(receiver) if isinstance(receiver, ast.Constant) else []
        args = node.args[:1] if isinstance(node.func, ast.Name) and node.func.id in FIRST_ARGUMENT_ONLY else node.args
        return own + [leaf for arg in args for leaf in expectation_leaves(arg)] + [
            leaf for keyword in node.keywords if keyword.arg not in SETTING_KEYWORDS for leaf in expectation_leaves(keyword.value)]
    return []


def bool_rows(node: ast.AST) -> list[ast.AST]:
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


# Punctuation a string made of punctuation only (a regex, a rule) may take instead of one of its own: quotes and
# backslashes are left out (a decoy spelling escapes the real value never needs would stand out).
PUNCTUATION = "".join(c for c in string.punctuation if c not in "\\'\"`")


def text_positions(text: str) -> list[int]:
    """The positions of a string a decoy may change: its letters and digits; in a string without any, its
    punctuation where it mixes three marks or more, outside runs of one (`(.+?)`, not `+---+` or `=====`: a rule
    of one or two marks is read at a glance, and a changed bracket or separator among words would read as a typo)."""
    found = [i for i, char in enumerate(text) if char.isascii() and char.isalnum()]
    if found or len({char for char in text if char in PUNCTUATION}) < 3:
        return found
    return [i for i, char in enumerate(text) if char in PUNCTUATION
            and char not in text[max(0, i - 1):i] + text[i + 1:i + 2]]


def loaded_names(node: ast.AST) -> set[str]:
    return {child.id for child in ast.walk(node) if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load)}
