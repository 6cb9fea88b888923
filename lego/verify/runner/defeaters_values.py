"""The assertion-defeater analysis's vocabulary: abstract values, and what a module's top level binds.

Part of defeaters.py (which explains the analysis); standard library only, shipped with it to the grading container.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

COMPARISONS = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__")
ORDERINGS = {"__lt__": "__gt__", "__gt__": "__lt__", "__le__": "__ge__", "__ge__": "__le__"}
ISINSTANCE = ("__instancecheck__", "__subclasscheck__", "__subclasshook__")
CONTAINS = ("__contains__",)
WATCHED = frozenset(COMPARISONS + ISINSTANCE + CONTAINS)
COMPUTED = "<computed name>"  # the method name of a function attached under a name built at run time

OP = "op"  # the value depends on an operand
OPAQUE = "opaque"  # it depends on *args/**kwargs used as a whole: cannot be decided
TYPE = "type"  # it depends on the operand's type only (type(o), o.__class__, isinstance(o, C))
_UNKNOWN = object()  # an abstract value's constant when it is not known
_CONST_TYPES = (type(None), bool, int, float, complex, str, bytes, type(NotImplemented), type(Ellipsis))
_MAX_LOOP_PASSES = 4
_MAX_CALL_DEPTH = 4
_FOLDABLE = {"bool", "int", "float", "str", "repr", "len", "abs", "ord", "chr"}
_PURE_BUILTINS = _FOLDABLE | {"object", "type", "id", "isinstance", "issubclass", "hasattr"}
_PURE_IDENTITY = {"type", "id", "len", "str", "repr", "hash", "bool", "int", "float"}
_OBJECT_ATTRIBUTES = frozenset(dir(object))
_PURE_CALLS = _PURE_IDENTITY | {"isinstance", "issubclass", "hasattr", "callable", "abs"}


@dataclass
class Finding:
    path: str  # file
    line: int
    kind: str  # comparison_ignores_operand, isinstance_always_true, contains_ignores_operand, ...
    detail: str  # one line a human can act on


# ---------------------------------------------------------------------------------------------------------------
# Abstract values


class _AV:
    """What the analysis knows of a value: the labels it depends on, its constant, its truthiness."""

    __slots__ = ("deps", "const", "truth", "vararg")

    def __init__(self, deps=frozenset(), const=_UNKNOWN, truth=None, vararg=None):
        if const is not _UNKNOWN:
            deps, truth = frozenset(), _truth_of(const)
        self.deps = frozenset(deps)
        self.const = const
        self.truth = truth
        self.vararg = vararg  # for *args: how many positional parameters come before it

    def with_deps(self, extra) -> _AV:
        if not extra or self.const is not _UNKNOWN or extra <= self.deps:
            return self
        return _AV(self.deps | extra, truth=self.truth, vararg=self.vararg)

    def key(self):
        return (self.deps, _const_key(self.const), self.truth, self.vararg)


def _truth_of(value) -> bool | None:
    if value is NotImplemented:
        return None  # a refusal, not a truth (and deprecated as one)
    try:
        return bool(value)
    except Exception:
        return None


def _const_key(value):
    return ("k", type(value).__name__, repr(value)) if value is not _UNKNOWN else None


def _same_const(a: _AV, b: _AV) -> bool:
    return a.const is not _UNKNOWN and b.const is not _UNKNOWN and _const_key(a.const) == _const_key(b.const)


def _join(a: _AV, b: _AV) -> _AV:
    if _same_const(a, b):
        return a
    return _AV(a.deps | b.deps, truth=a.truth if a.truth == b.truth else None,
               vararg=a.vararg if a.vararg == b.vararg else None)


def _merge(envs: list, extra=frozenset()):
    """Join the environments that reach one point; a name whose value differs between them also takes
    ``extra`` (the labels of the condition that chose between them)."""
    envs = [env for env in envs if env is not None]
    if not envs:
        return None
    if len(envs) == 1:
        return dict(envs[0])
    out = {}
    for name in set().union(*envs):
        values = [env[name] for env in envs if name in env]
        value = values[0]
        differs = len(values) < len(envs)
        for other in values[1:]:
            if not _same_const(value, other) and value is not other:
                differs = True
            value = _join(value, other)
        out[name] = value.with_deps(extra) if differs else value
    return out


def _same_env(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return a.keys() == b.keys() and all(a[k].key() == b[k].key() for k in a)


# ---------------------------------------------------------------------------------------------------------------
# The module: what its top level binds


_LEAVES = (ast.Name, ast.Constant, ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop, ast.alias,
           ast.Pass, ast.Break, ast.Continue, ast.Global, ast.Nonlocal)
# Objects of the standard library (and its backport) that compare equal to everything.
_WILDCARD_MODULES = {"unittest.mock", "mock"}
_WILDCARDS = {"ANY", "_ANY"}
_ATTACHING_CALLS = {"setattr", "__setattr__", "type", "__new__", "new_class", "exec", "compile"}
_MAX_EXEC_DEPTH = 3


class _Module:
    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.bound = set()  # names bound at module level (shadow builtins)
        self.consts = {}  # name -> constant, for names bound once, at module level, to a constant
        self.funcs = {}  # name -> [function nodes] bound at module level
        self.summaries = {}
        counts = {}
        for node in _scope_statements(tree.body):
            for name in _bound_names(node):
                self.bound.add(name)
                counts[name] = counts.get(name, 0) + 1
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                if isinstance(node.value, ast.Constant) and isinstance(node.value.value, _CONST_TYPES):
                    self.consts[node.targets[0].id] = node.value.value
        self.consts = {k: v for k, v in self.consts.items() if counts.get(k) == 1}
        self.classes = {}  # function node -> the class whose body defines it
        self.sites = []  # (node, the scopes around it): where a function may be attached as a method
        self.class_defs = {}  # name -> the classes of that name
        self.truthy = {}  # class -> whether its objects are always true
        self.imports = []
        self.wildcard_uses = []  # attributes named like a known wildcard (mock.ANY)
        self._bindings = {tree: None}
        self.funcs = _function_bindings(tree.body)
        self._walk(tree)

    def _walk(self, tree):
        """One pass over the tree (a plain stack: ``ast.walk`` and a NodeVisitor cost more than the analysis)."""
        stack = [(tree, (tree,))]
        while stack:
            node, scopes = stack.pop()
            inner = scopes
            kind = type(node)
            if kind is ast.Global:  # assigned elsewhere: not a constant
                for name in node.names:
                    self.consts.pop(name, None)
                    self.bound.add(name)
            elif kind is ast.FunctionDef or kind is ast.AsyncFunctionDef:
                inner = scopes + (node,)
            elif kind is ast.ClassDef:
                self.sites.append((node, scopes))
                self.class_defs.setdefault(node.name, []).append(node)
                inner = scopes + (node,)
                for stmt in _scope_statements(node.body):
                    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self.classes[stmt] = node
                    elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.Expr)):
                        for sub in ast.walk(stmt):
                            if isinstance(sub, ast.Lambda):
                                self.classes.setdefault(sub, node)
            elif kind is ast.Assign:
                if any(type(target) is not ast.Name for target in node.targets):
                    self.sites.append((node, scopes))
            elif kind is ast.Call:
                func = node.func
                name = func.id if type(func) is ast.Name else func.attr if type(func) is ast.Attribute else None
                if name in _ATTACHING_CALLS or any(kw.arg in WATCHED for kw in node.keywords):
                    self.sites.append((node, scopes))
                elif (name == "getattr" and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                      and node.args[1].value in _WILDCARDS):
                    self.wildcard_uses.append(node)
            elif kind is ast.Dict:
                if node.keys:
                    self.sites.append((node, scopes))
            elif kind is ast.Import or kind is ast.ImportFrom:
                self.imports.append(node)
            elif kind is ast.Attribute:
                if node.attr in _WILDCARDS:
                    self.wildcard_uses.append(node)
            for field in node._fields:
                value = getattr(node, field, None)
                if type(value) is list:
                    for item in value:
                        if isinstance(item, ast.AST) and not isinstance(item, _LEAVES):
                            stack.append((item, inner))
                elif isinstance(value, ast.AST) and not isinstance(value, _LEAVES):
                    stack.append((value, inner))

    def bindings(self, scope) -> dict:
        """The function bindings of a scope (the module, a function, a class body)."""
        found = self._bindings.get(scope)
        if found is None:
            found = self.funcs if isinstance(scope, ast.Module) else _function_bindings(scope.body)
            self._bindings[scope] = found
        return found

    def enclosing_class(self, node):
        return self.classes.get(node)


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _scope_statements(body):
    """The statements of a scope, into its if/try/with/for blocks but not into nested defs and classes."""
    stack = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in reversed(getattr(node, field, None) or []):
                if isinstance(child, ast.stmt):
                    stack.append(child)
                elif isinstance(child, (ast.ExceptHandler, ast.match_case)):
                    stack.extend(reversed(child.body))


def _bound_names(node):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        yield node.name
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
        for alias in node.names:
            yield (alias.asname or alias.name).split(".")[0]
    elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor, ast.With,
                           ast.AsyncWith)):
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [item.optional_vars for item in node.items if item.optional_vars is not None]
                   if isinstance(node, (ast.With, ast.AsyncWith)) else [node.target])
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Name):
                    yield sub.id


def _function_bindings(body) -> dict:
    """name -> the function nodes (defs, lambdas, or names to follow) a scope binds to it."""
    out = {}
    for node in _scope_statements(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.setdefault(node.name, []).append(node)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out.setdefault(target.id, []).append(node.value)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Helpers of the interpreter: names, parameters, constant folding


def _rebound(env, name):
    """The names in ``env`` rebound by the body (the first parameter, reassigned, is no longer self)."""
    value = env.get(name)
    return {name} if value is not None and value.deps else set()


def _positional(args: ast.arguments) -> list:
    return list(args.posonlyargs) + list(args.args)


def _type_of(deps):
    """The labels of an operand's type, given the labels of the operand."""
    return frozenset(TYPE if label == OP else label for label in deps) if OP in deps else deps


def _dotted(node):
    """``a.b.c`` for an attribute chain on a name (at most 32 long), else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
        if len(parts) > 32:
            return None
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _as_load(node):
    if isinstance(node, ast.Name):
        return ast.Name(id=node.id, ctx=ast.Load())
    return node


def _fold(function, *values):
    for value in values:
        if isinstance(value, (str, bytes)) and len(value) > 10_000:
            return _UNKNOWN
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 1 << 64:
            return _UNKNOWN
    try:
        result = function(*values)
    except Exception:
        return _UNKNOWN
    if isinstance(result, (str, bytes)) and len(result) > 10_000:
        return _UNKNOWN
    return result


def _safe_mult(a, b):
    if isinstance(a, (str, bytes)) or isinstance(b, (str, bytes)):
        count = b if isinstance(a, (str, bytes)) else a
        if not isinstance(count, int) or count > 1000:
            raise ValueError
    return a * b


def _safe_pow(a, b):
    if isinstance(b, int) and abs(b) > 64:
        raise ValueError
    return a ** b


_UNARY = {ast.USub: lambda v: -v, ast.UAdd: lambda v: +v, ast.Invert: lambda v: ~v}


_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: _safe_mult, ast.Pow: _safe_pow,
           ast.Mod: lambda a, b: a % b if not isinstance(a, (str, bytes)) else _UNKNOWN_OP(),
           ast.FloorDiv: lambda a, b: a // b, ast.Div: lambda a, b: a / b, ast.BitOr: lambda a, b: a | b,
           ast.BitAnd: lambda a, b: a & b, ast.BitXor: lambda a, b: a ^ b}


_COMPARE = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
            ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
            ast.Is: lambda a, b: a is b if a is None or b is None or isinstance(a, bool) else _UNKNOWN_OP(),
            ast.IsNot: lambda a, b: a is not b if a is None or b is None or isinstance(a, bool) else _UNKNOWN_OP(),
            ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}


_NEGATED = {ast.IsNot: ast.Is, ast.NotIn: ast.In}


_REFLEXIVE = {ast.Is: True, ast.IsNot: False, ast.Eq: True, ast.LtE: True, ast.GtE: True, ast.NotEq: False,
              ast.Lt: False, ast.Gt: False}


def _UNKNOWN_OP():  # noqa: N802 - raises to leave a fold undone
    raise ValueError


def _is_generator(node) -> bool:
    if isinstance(node, ast.AsyncFunctionDef):
        return True
    if isinstance(node, ast.Lambda):
        return any(isinstance(sub, (ast.Yield, ast.YieldFrom)) for sub in ast.walk(node.body))
    stack = list(node.body)
    while stack:
        sub = stack.pop()
        if isinstance(sub, (ast.Yield, ast.YieldFrom)):
            return True
        if isinstance(sub, _SCOPES):
            continue
        stack.extend(ast.iter_child_nodes(sub))
    return False
