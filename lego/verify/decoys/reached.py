"""What every passing run of a test executes, and its blocks that expect an exception (`with pytest.raises(E):`).

Some decoys are sound only where the real check held whenever the test passed: `x is None` held, so `x is True`
fails; `a == b` held, so `a < b` fails; a `pytest.raises` block's body raised, so the body without the block
lets the exception out of the test. That is so for a check that every passing run makes, with nothing of the test
around it that could catch what it raises: a statement of the function's own body, or of a `for` loop over values
no patch can change (a table written in the test, `range(3)`, `combinations("abc", 2)`: the gold runs show such a
loop is entered, and then it is entered under every patch) that never breaks or continues, in a function that
never returns early. A check inside an `if`, a `try`, a `with`, a `while`, or a loop over what the code under test
computed is left to the complement flips, which fail exactly when the real check passes, wherever it stands.

A dropped expectation also needs the manager to be pytest's or unittest's (a `raises` of the module's own might pass
a block that raises nothing), and the expected type not one that pytest reads as a skip or an exit when it escapes.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Callable
from dataclasses import dataclass

from lego.verify.decoys.expressions import call_name
from lego.verify.decoys.model import NOT_FAILURES, RAISES_CALLS

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
# Callables whose result depends on their arguments alone, deterministically: a loop over what they make of
# literals runs as often under every patch.
STABLE_BUILTINS = frozenset({"range", "enumerate", "zip", "reversed", "sorted", "list", "tuple", "set", "frozenset",
                             "dict", "str", "int", "float", "len", "min", "max", "abs", "sum", "map", "filter"})
STABLE_MODULES = frozenset({"itertools", "string", "math", "operator", "collections", "decimal", "fractions"})


def _names_in(node: ast.AST) -> list[str]:
    return [n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node) if isinstance(n, ast.Name | ast.Attribute)]


def fails_when_escaping(expected: ast.AST) -> bool:
    """Whether an exception of the expected type, escaping a test, is reported as a failure (not a skip, an xfail,
    an exit or an interrupt)."""
    return not any(name in NOT_FAILURES or "skip" in name.lower() or "xfail" in name.lower() or name.endswith("Exit")
                   for name in _names_in(expected))


def _module_bindings(module: ast.Module) -> dict[str, int]:
    """How often each name is bound in the module's own scope (a `global` statement counts twice)."""
    stores: dict[str, int] = {}
    for node in ast.walk(module):
        if isinstance(node, ast.Global):
            for name in node.names:
                stores[name] = stores.get(name, 0) + 2
    stack: list[ast.AST] = list(module.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            stores[node.id] = stores.get(node.id, 0) + 1
        elif isinstance(node, ast.alias):
            name = (node.asname or node.name).split(".")[0]
            stores[name] = stores.get(name, 0) + 1
        elif isinstance(node, _SCOPES):
            if not isinstance(node, ast.Lambda):
                stores[node.name] = stores.get(node.name, 0) + 1
            continue  # its body is its own scope
        stack.extend(ast.iter_child_nodes(node))
    return stores


@dataclass(frozen=True)
class ModuleFacts:
    """What a test module's names are: pytest's `raises` under its names here, module constants bound once to an
    expected-exception manager (`SE = raises(SchemaError)`), and names of deterministic standard modules and
    functions (bound once, by an import)."""

    pytest_modules: frozenset[str] = frozenset()  # `import pytest` (as ...)
    raises_functions: frozenset[str] = frozenset()  # `from pytest import raises` (as ...)
    own_methods: frozenset[str] = frozenset()  # assertRaises* the module defines itself (not unittest's)
    constants: frozenset[str] = frozenset()
    stable: frozenset[str] = frozenset()  # `import itertools`, `from itertools import combinations`, builtins
    expected_by_constant: tuple[tuple[str, str], ...] = ()  # each constant -> ast.dump of the type it expects

    @classmethod
    def of(cls, module: ast.Module) -> ModuleFacts:
        stores = _module_bindings(module)
        pytest_modules, raises_functions, defined, stable = set(), set(), set(), set()
        for node in ast.walk(module):
            if isinstance(node, ast.Import):
                pytest_modules.update(alias.asname or alias.name for alias in node.names if alias.name == "pytest")
                stable.update(alias.asname or alias.name for alias in node.names if alias.name in STABLE_MODULES)
            elif isinstance(node, ast.ImportFrom) and node.module == "pytest":
                raises_functions.update(alias.asname or alias.name for alias in node.names if alias.name == "raises")
            elif isinstance(node, ast.ImportFrom) and node.module in STABLE_MODULES and not node.level:
                stable.update(alias.asname or alias.name for alias in node.names if alias.name != "*")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                defined.add(node.name)
        stable = {name for name in stable if stores.get(name) == 1}
        stable |= {name for name in STABLE_BUILTINS if hasattr(builtins, name) and name not in stores}
        found = cls(frozenset(pytest_modules), frozenset(raises_functions),
                    frozenset(name for name in defined if name in RAISES_CALLS), frozenset(), frozenset(stable))
        constants = {statement.targets[0].id for statement in module.body
                     if isinstance(statement, ast.Assign) and len(statement.targets) == 1
                     and isinstance(statement.targets[0], ast.Name) and stores.get(statement.targets[0].id) == 1
                     and found.manager_call(statement.value, frozenset())}
        expected = tuple((statement.targets[0].id, ast.dump(statement.value.args[0])) for statement in module.body
                         if isinstance(statement, ast.Assign) and len(statement.targets) == 1
                         and isinstance(statement.targets[0], ast.Name) and statement.targets[0].id in constants)
        return cls(found.pytest_modules, found.raises_functions, found.own_methods, frozenset(constants),
                   found.stable, expected)

    def expected_type(self, manager: ast.AST, local: frozenset[str]) -> str | None:
        """ast.dump of the exception type a `raises`/`assertRaises` manager (or a constant bound to one) expects."""
        if isinstance(manager, ast.Name):
            return dict(self.expected_by_constant).get(manager.id) if manager.id not in local else None
        return ast.dump(manager.args[0]) if self.manager_call(manager, local) else None

    def manager_call(self, node: ast.AST, local: frozenset[str]) -> bool:
        """`pytest.raises(E)`, `raises(E, match=...)`, `self.assertRaises(E)`, `self.assertRaisesRegex(E, text)`:
        the manager form (no callable passed), its expected type none of `local` (names the test binds)."""
        if not isinstance(node, ast.Call) or any(isinstance(arg, ast.Starred) for arg in node.args) \
                or any(keyword.arg is None for keyword in node.keywords):
            return False
        func, name = node.func, call_name(node)
        if isinstance(func, ast.Name):
            trusted = func.id in self.raises_functions
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            trusted = (func.attr == "raises" and func.value.id in self.pytest_modules) or (
                func.attr.startswith("assertRaises") and func.value.id in ("self", "cls")
                and func.attr not in self.own_methods)
        else:
            trusted = False
        arguments = 2 if name.startswith("assertRaisesRegex") else 1
        if not trusted or name not in RAISES_CALLS or len(node.args) != arguments:
            return False
        expected = node.args[0]
        return fails_when_escaping(expected) and not (set(_names_in(expected)) & local)

    def expects(self, statement: ast.AST, local: frozenset[str]) -> bool:
        """A `with` of one item whose manager expects an exception (a call, or a constant bound to one)."""
        if not isinstance(statement, ast.With) or len(statement.items) != 1:
            return False
        manager = statement.items[0].context_expr
        if isinstance(manager, ast.Name):
            return manager.id in self.constants and manager.id not in local
        return self.manager_call(manager, local)


def stable_expression(node: ast.AST, facts: ModuleFacts, constant_locals: frozenset[str]) -> bool:
    """Whether an expression's value is the same under every patch: literals, names the test binds once to an
    immutable literal, deterministic builtins and standard functions (ModuleFacts.stable) of such values."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Name):
        return node.id in constant_locals or node.id in facts.stable
    if isinstance(node, ast.Attribute):
        return isinstance(node.value, ast.Constant) or (
            isinstance(node.value, ast.Name) and node.value.id in facts.stable and node.value.id not in constant_locals)
    if isinstance(node, ast.Call):
        return stable_expression(node.func, facts, constant_locals) and all(
            stable_expression(child, facts, constant_locals)
            for child in [*node.args, *(keyword.value for keyword in node.keywords)])
    if isinstance(node, ast.List | ast.Tuple | ast.Set | ast.Dict | ast.Starred | ast.BinOp | ast.UnaryOp
                  | ast.Subscript | ast.Slice | ast.BoolOp | ast.Compare):
        return all(stable_expression(child, facts, constant_locals) for child in ast.iter_child_nodes(node)
                   if not isinstance(child, ast.expr_context | ast.operator | ast.unaryop | ast.boolop | ast.cmpop))
    return False


def _returns_or_yields(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the function itself (not a function it defines) returns or yields anywhere."""
    stack: list[ast.AST] = list(function.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return | ast.Yield | ast.YieldFrom):
            return True
        if not isinstance(node, _SCOPES):
            stack.extend(ast.iter_child_nodes(node))
    return False


def fixed_count(node: ast.AST, stable: Callable[[ast.AST], bool]) -> bool:
    """Whether iterating the expression yields as many items under every patch: a list or tuple written out (its
    items may be anything), enumerate/zip/reversed of such, or a `stable` value."""
    if isinstance(node, ast.List | ast.Tuple):
        return not any(isinstance(element, ast.Starred) for element in node.elts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
            "enumerate", "zip", "reversed") and stable(node.func) and node.args and not node.keywords:
        return all(fixed_count(arg, stable) for arg in node.args)
    return stable(node)


def always_reached(function: ast.FunctionDef | ast.AsyncFunctionDef,
                   stable: Callable[[ast.AST], bool]) -> list[ast.stmt]:
    """The statements of the test that every passing run executes, with nothing of the test around them that could
    catch what they raise (the module docstring): those of its own body, and of `for` loops over a `fixed_count`
    iterable that never break or continue; none if the function returns or yields."""
    if _returns_or_yields(function):
        return []
    found: list[ast.stmt] = []

    def visit(body: list[ast.stmt]) -> None:
        for statement in body:
            found.append(statement)
            if isinstance(statement, ast.For) and fixed_count(statement.iter, stable) and not any(
                    isinstance(node, ast.Break | ast.Continue) for node in ast.walk(statement)):
                visit(statement.body)

    visit(function.body)
    return found


def escapes(block: ast.With, inner: ast.AST) -> bool:
    """Whether an exception raised at `inner`, inside the block's body, leaves the body: no `with`, scope or `try`
    around it there (the handler of a `try` without `finally` lets it through)."""
    parents = {id(child): node for node in ast.walk(block) for child in ast.iter_child_nodes(node)}
    node = inner
    while id(node) in parents:
        parent = parents[id(node)]
        if parent is block:
            return node in block.body
        if isinstance(parent, (ast.With, ast.AsyncWith, ast.TryStar, *_SCOPES)):
            return False
        if isinstance(parent, ast.Try) and (parent.finalbody or node not in parent.handlers):
            return False
        node = parent
    return False
