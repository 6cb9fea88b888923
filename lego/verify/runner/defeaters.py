"""Assertion defeaters: definitions whose comparison (or membership, or isinstance) succeeds whatever they meet.

An object whose ``__eq__`` returns ``True`` makes ``assert result == expected`` pass without a fix. This module
finds such definitions in a patched Python file by what the code does, not by how it is spelled.

The core, ``function_ignores_operand``, interprets one function abstractly: every value carries the labels of
what it depends on (the operand, i.e. every parameter after the first; the operand's type only; ``*args`` used
as a whole), its constant when known and its truthiness when known. Locals, branches (joined, with the labels
of the condition added where the branches disagree), loops (to a fixpoint), try/except/finally, match, walrus,
calls of functions and methods defined in the same file (summarised by which arguments reach their result),
and tautologies over side-effect-free atoms (``o is None or o is not None``) are followed. A function ignores
its operand when no value it returns depends on the operand and, where its outcomes (a truthiness, a constant,
NotImplemented, an exception) differ, no condition that chooses between them does either. A non-empty tuple
built from the operand, a generator, an object of a class whose ``__bool__`` is always true: their truth is
fixed though their value is not, and the truth is what an assertion sees.

``defeaters_in_source`` finds the places where a function is attached as a comparison, membership or
isinstance method: a ``def`` or assignment in a class body (metaclasses and subclasses of builtins alike), an
attribute assignment, ``setattr`` (a name built at run time makes any function attached there a candidate),
a ``type()`` namespace, a dict literal or ``dict(__eq__=...)``, an item set on a namespace, a factory in this
file that returns the function. Each attached function is judged by the core, and it is a finding when it can
return the value that passes an assertion (true; false for ``__ne__``). Not findings: NotImplemented, a
constant False ``__eq__`` (True ``__ne__``), a function that always raises, a stub returning None, an ordering
that is always true while its mirror is always false (an infinity sentinel). Two further kinds: an ``__eq__``
that looks at nothing but the other object's type in a class whose objects hold values of their own, and the
standard library's wildcard ``unittest.mock.ANY`` imported or used in the patched code.

Kinds: comparison_ignores_operand, contains_ignores_operand, isinstance_always_true,
computed_name_ignores_operand, comparison_only_checks_type, wildcard_object.

Standard library only: this file is copied into the grading container and run there by the task's Python
(``python defeaters.py FILE...`` prints the findings and exits 1 when there are any).
"""

from __future__ import annotations

import ast
import builtins
import sys
from dataclasses import dataclass

COMPARISONS = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__")
ORDERINGS = {"__lt__": "__gt__", "__gt__": "__lt__", "__le__": "__ge__", "__ge__": "__le__"}
ISINSTANCE = ("__instancecheck__", "__subclasscheck__", "__subclasshook__")
CONTAINS = ("__contains__",)
WATCHED = frozenset(COMPARISONS + ISINSTANCE + CONTAINS)
STRICT = False  # raise the analysis's own errors instead of returning nothing (for tests)
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
# The core: one function's data and control flow


class _Exit:
    __slots__ = ("kind", "value", "pc")

    def __init__(self, kind, value, pc):
        self.kind, self.value, self.pc = kind, value, pc


class _Flow:
    """Abstract interpretation of one function body over dependency labels."""

    def __init__(self, module: _Module, node, labels: dict, depth: int = 0, stack: tuple = ()):
        self.module = module
        self.node = node
        self.depth = depth
        self.stack = stack + (node,)
        self.exits: list[_Exit] = []
        self.loops: list[dict] = []
        self.cls = module.enclosing_class(node)
        params = _positional(node.args)
        self.self_name = params[0].arg if params else None
        env = dict(labels)
        if isinstance(node, ast.Lambda):
            self.exits.append(_Exit("return", self.eval(node.body, env), frozenset()))
        else:
            end = self.block(node.body, env, frozenset())
            if end is not None:
                self.exits.append(_Exit("return", _AV(const=None), frozenset()))

    @staticmethod
    def default_value(module, node) -> _AV:
        """A parameter's default (evaluated once, where the function is defined)."""
        if isinstance(node, ast.Constant) and isinstance(node.value, _CONST_TYPES):
            return _AV(const=node.value)
        if isinstance(node, ast.Name) and node.id in module.consts:
            return _AV(const=module.consts[node.id])
        return _AV()

    # -- statements

    def block(self, stmts, env, pc):
        for stmt in stmts:
            if env is None:
                return None
            env = self.stmt(stmt, env, pc)
        return env

    def stmt(self, node, env, pc):  # noqa: C901 - one dispatch over statement types
        if isinstance(node, ast.Return):
            value = self.eval(node.value, env) if node.value is not None else _AV(const=None)
            self.exits.append(_Exit("return", value, pc))
            return None
        if isinstance(node, ast.Raise):
            if node.exc is not None:
                self.eval(node.exc, env)
            self.exits.append(_Exit("raise", None, pc))
            return None
        if isinstance(node, ast.Assert):
            test = self.eval(node.test, env)
            if test.truth is True:
                return env
            self.exits.append(_Exit("raise", None, pc | test.deps))
            return None if test.truth is False else env
        if isinstance(node, ast.Assign):
            value = self.eval(node.value, env)
            for target in node.targets:
                self.bind(target, value, env, pc, node.value)
            return env
        if isinstance(node, ast.AnnAssign):
            if node.value is not None:
                self.bind(node.target, self.eval(node.value, env), env, pc, node.value)
            return env
        if isinstance(node, ast.AugAssign):
            old = self.eval(_as_load(node.target), env)
            new = self.eval(node.value, env)
            self.bind(node.target, _AV(old.deps | new.deps), env, pc, None)
            return env
        if isinstance(node, ast.Expr):
            self.eval(node.value, env)
            return env
        if isinstance(node, ast.If):
            test = self.eval(node.test, env)
            if test.truth is True:
                return self.block(node.body, env, pc)
            if test.truth is False:
                return self.block(node.orelse, env, pc)
            inner = pc | test.deps
            return _merge([self.block(node.body, dict(env), inner), self.block(node.orelse, dict(env), inner)],
                          test.deps)
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            return self.loop(node, env, pc)
        if isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            return self.try_(node, env, pc)
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                value = self.eval(item.context_expr, env)
                if item.optional_vars is not None:
                    self.bind(item.optional_vars, _AV(value.deps), env, pc, None)
            return self.block(node.body, env, pc)
        if isinstance(node, getattr(ast, "Match", ())):
            return self.match(node, env, pc)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for decorator in node.decorator_list:
                self.eval(decorator, env)
            env[node.name] = _AV(self.closure_deps(node, env) | pc, truth=True)
            return env
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for name in _bound_names(node):
                env[name] = _AV(truth=None)
            return env
        if isinstance(node, ast.Break):
            if self.loops:
                self.loops[-1]["breaks"].append((env, pc))
            return None
        if isinstance(node, ast.Continue):
            if self.loops:
                self.loops[-1]["continues"].append((env, pc))
            return None
        if isinstance(node, ast.Delete):
            return env
        return env  # pass, global, nonlocal, ...

    def loop(self, node, env, pc):
        is_while = isinstance(node, ast.While)
        head = env
        frame = {"breaks": [], "continues": []}
        self.loops.append(frame)
        forever = False
        inner = pc
        first_exits = len(self.exits)
        for _ in range(_MAX_LOOP_PASSES):
            del self.exits[first_exits:]  # keep the exits of the last (widest) pass only
            frame["breaks"].clear()
            frame["continues"].clear()
            if is_while:
                test = self.eval(node.test, dict(head))
                if test.truth is False:
                    break
                forever = test.truth is True
                inner = pc | test.deps
                body_env = dict(head)
            else:
                body_env = dict(head)
                source = self.eval(node.iter, body_env)
                inner = pc | source.deps
                self.bind(node.target, _AV(source.deps), body_env, inner, None)
            end = self.block(node.body, body_env, inner)
            jumps = frozenset().union(*(jump_pc for _env, jump_pc in frame["continues"]))
            new_head = _merge([head, end] + [jump_env for jump_env, _pc in frame["continues"]], inner | jumps)
            if _same_env(new_head, head):
                break
            head = new_head
        self.loops.pop()
        breaks = [jump_env for jump_env, _pc in frame["breaks"]]
        # which of these reaches the end of the loop depends on the conditions of the loop and of the breaks
        jumps = frozenset().union(*(jump_pc for _env, jump_pc in frame["breaks"])) | inner
        if forever:
            return _merge(breaks, jumps)
        after = self.block(node.orelse, dict(head), pc) if node.orelse else head
        return _merge([after] + breaks, jumps)

    def try_(self, node, env, pc):
        first_exit = len(self.exits)
        body = self.block(node.body, dict(env), pc)
        taint = frozenset()
        for sub in ast.walk(ast.Module(body=node.body, type_ignores=[])):
            if isinstance(sub, ast.Name):
                for scope in (env, body or {}):
                    if sub.id in scope:
                        taint |= scope[sub.id].deps
        reached = _merge([env, body])
        ends = [self.block(node.orelse, body, pc) if body is not None else None]
        for handler in node.handlers:
            handler_env = dict(reached)
            if handler.type is not None:
                self.eval(handler.type, handler_env)
            if handler.name:
                handler_env[handler.name] = _AV(taint)
            ends.append(self.block(handler.body, handler_env, pc | taint))
        out = _merge(ends, taint)
        if node.finalbody:
            final_exit = len(self.exits)
            end = self.block(node.finalbody, _merge([reached, out], taint), pc)
            if end is None and all(e.kind == "return" for e in self.exits[final_exit:]):
                del self.exits[first_exit:final_exit]  # a return in `finally` overrides every other exit
                return None
            return end if out is not None else None
        return out

    def match(self, node, env, pc):
        subject = self.eval(node.subject, env)
        inner = pc | subject.deps
        ends = [env]
        for case in node.cases:
            case_env = dict(env)
            for sub in ast.walk(case.pattern):
                name = getattr(sub, "name", None) or getattr(sub, "rest", None)
                if isinstance(name, str):
                    case_env[name] = _AV(inner)
            if case.guard is not None:
                inner = inner | self.eval(case.guard, case_env).deps
            ends.append(self.block(case.body, case_env, inner))
        return _merge(ends, subject.deps)

    def bind(self, target, value: _AV, env, pc, source):
        if isinstance(target, ast.Name):
            env[target.id] = value.with_deps(pc)
        elif isinstance(target, (ast.Tuple, ast.List)):
            elts = target.elts
            if (isinstance(source, (ast.Tuple, ast.List)) and len(source.elts) == len(elts)
                    and not any(isinstance(e, ast.Starred) for e in elts + source.elts)):
                values = [self.eval(e, dict(env)) for e in source.elts]
                for elt, sub in zip(elts, values, strict=True):
                    self.bind(elt, sub, env, pc, None)
                return
            for index, elt in enumerate(elts):
                sub = _AV(value.deps)
                if value.vararg is not None and not isinstance(elt, ast.Starred):
                    sub = _AV() if value.vararg + index == 0 else _AV({OP})
                elif value.vararg is not None:
                    sub = _AV({OP})
                self.bind(elt, sub, env, pc, None)
        elif isinstance(target, ast.Starred):
            self.bind(target.value, _AV(value.deps, truth=None), env, pc, None)
        elif isinstance(target, ast.Attribute):
            key = _dotted(target)
            if key is not None:
                env[key] = value.with_deps(pc)
            self.taint_base(target.value, value.deps | pc, env)
        elif isinstance(target, ast.Subscript):
            self.taint_base(target.value, value.deps | pc | self.eval(target.slice, env).deps, env)

    def taint_base(self, node, deps, env):
        """A mutation of ``node`` (an item or attribute set, a method call) with values of ``deps``."""
        if not deps:
            return
        key = _dotted(node)
        while key is not None:
            if key in env:
                env[key] = _AV(env[key].deps | deps, vararg=env[key].vararg)
            if "." not in key:
                break
            key = key.rsplit(".", 1)[0]

    def closure_deps(self, node, env):
        deps = frozenset()
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and sub.id in env:
                deps |= env[sub.id].deps
            elif isinstance(sub, ast.Attribute):
                key = _dotted(sub)
                if key in env:
                    deps |= env[key].deps
        return deps

    # -- expressions

    def eval(self, node, env) -> _AV:  # noqa: C901 - one dispatch over expression types
        if isinstance(node, ast.Constant):
            return _AV(const=node.value) if isinstance(node.value, _CONST_TYPES) else _AV(truth=_truth_of(node.value))
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            if node.id in self.module.consts:
                return _AV(const=self.module.consts[node.id])
            if node.id == "NotImplemented" and node.id not in self.module.bound:
                return _AV(const=NotImplemented)
            return _AV()
        if isinstance(node, ast.Attribute):
            key = _dotted(node)
            if key is not None and key in env:
                return env[key]
            base = self.eval(node.value, env).deps
            return _AV(_type_of(base) if node.attr == "__class__" else base)
        if isinstance(node, ast.Subscript):
            picked = self.literal_item(node, env)
            if picked is not None:
                return picked
            base = self.eval(node.value, env)
            if base.vararg is not None:
                index = node.slice
                if isinstance(index, ast.Constant) and type(index.value) is int:
                    return _AV() if base.vararg + index.value == 0 else _AV({OP})
                return _AV({OP} | self.eval(index, env).deps)
            return _AV(base.deps | self.eval(node.slice, env).deps)
        if isinstance(node, ast.BoolOp):
            result = self.boolop(node, env)
            if result.truth is None and result.const is _UNKNOWN:
                truth = self.tautology(node, env)
                if truth is not None:
                    return _AV(result.deps, truth=truth)
            return result
        if isinstance(node, ast.UnaryOp):
            operand = self.eval(node.operand, env)
            if isinstance(node.op, ast.Not):
                return _AV(const=not operand.truth) if operand.truth is not None else _AV(operand.deps)
            if operand.const is not _UNKNOWN:
                folded = _fold(lambda v: _UNARY[type(node.op)](v), operand.const)
                if folded is not _UNKNOWN:
                    return _AV(const=folded)
            return _AV(operand.deps)
        if isinstance(node, ast.BinOp):
            left, right = self.eval(node.left, env), self.eval(node.right, env)
            if left.const is not _UNKNOWN and right.const is not _UNKNOWN and type(node.op) in _BINARY:
                folded = _fold(_BINARY[type(node.op)], left.const, right.const)
                if folded is not _UNKNOWN:
                    return _AV(const=folded)
            return _AV(left.deps | right.deps)
        if isinstance(node, ast.Compare):
            return self.compare(node, env)
        if isinstance(node, ast.IfExp):
            test = self.eval(node.test, env)
            if test.truth is True:
                return self.eval(node.body, env)
            if test.truth is False:
                return self.eval(node.orelse, env)
            body, orelse = self.eval(node.body, env), self.eval(node.orelse, env)
            if _same_const(body, orelse):
                return body
            joined = _join(body, orelse)
            return _AV(joined.deps | test.deps, truth=joined.truth)
        if isinstance(node, ast.Call):
            return self.call(node, env)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            deps = frozenset()
            for elt in node.elts:
                deps |= self.eval(elt, env).deps
            plain = any(not isinstance(elt, ast.Starred) for elt in node.elts)
            return _AV(deps, truth=True if plain else (False if not node.elts else None))
        if isinstance(node, ast.Dict):
            deps = frozenset()
            for part in list(node.keys) + list(node.values):
                if part is not None:
                    deps |= self.eval(part, env).deps
            plain = any(key is not None for key in node.keys)
            return _AV(deps, truth=True if plain else (False if not node.keys else None))
        if isinstance(node, ast.JoinedStr):
            deps = frozenset()
            literal = False
            for part in node.values:
                if isinstance(part, ast.Constant) and part.value:
                    literal = True
                elif isinstance(part, ast.FormattedValue):
                    deps |= self.eval(part.value, env).deps
            return _AV(deps, truth=True if literal else None)
        if isinstance(node, ast.NamedExpr):
            value = self.eval(node.value, env)
            env[node.target.id] = value
            return value
        if isinstance(node, (ast.Lambda, ast.GeneratorExp)):
            return _AV(self.closure_deps(node, env), truth=True)
        if isinstance(node, ast.Starred):
            return _AV(self.eval(node.value, env).deps)
        return _AV(self.closure_deps(node, env))  # comprehensions, await, slices, ...

    def boolop(self, node, env) -> _AV:
        """``a or b``: the first true part, else the last; ``a and b``: the first false part, else the last."""
        is_or = isinstance(node.op, ast.Or)
        possible = []  # the parts that may be the result
        for index, value in enumerate(node.values):
            part = self.eval(value, env)
            last = index == len(node.values) - 1
            if part.truth is (not is_or) and not last:
                continue  # `False or x`, `True and x`: never the result
            possible.append(part)
            if part.truth is is_or:
                break  # `True or ...`, `False and ...`: this is the result, the rest is not evaluated
        if len(possible) == 1:
            return possible[0]
        deps = frozenset().union(*(part.deps for part in possible))
        return _AV(deps, truth=is_or if possible[-1].truth is is_or else None)

    def compare(self, node, env) -> _AV:
        left = self.eval(node.left, env)
        values = [left] + [self.eval(c, env) for c in node.comparators]
        if len(node.ops) == 1 and type(node.ops[0]) in _REFLEXIVE:
            # `x is x`, `type(o) == type(o)`: the same pure expression on both sides
            a, b = self.pure_key(node.left, env), self.pure_key(node.comparators[0], env)
            if a is not None and a == b:
                truth = _REFLEXIVE[type(node.ops[0])]
                if isinstance(node.ops[0], (ast.Is, ast.IsNot)):
                    return _AV(const=truth)
                return _AV(left.deps, truth=truth)  # true unless __eq__ is not reflexive (NaN)
        if all(v.const is not _UNKNOWN for v in values) and all(type(op) in _COMPARE for op in node.ops):
            result = True
            for op, a, b in zip(node.ops, values, values[1:], strict=False):
                folded = _fold(_COMPARE[type(op)], a.const, b.const)
                if folded is _UNKNOWN:
                    break
                result = result and bool(folded)
            else:
                return _AV(const=result)
        deps = frozenset()
        for value in values:
            deps |= value.deps
        return _AV(deps)

    def literal_item(self, node, env):
        """``(a, b)[1]``, ``{k: True}[x]``: an item of a literal, when which one (or its value) is known."""
        container, index = node.value, node.slice
        if isinstance(container, (ast.Tuple, ast.List)) and not any(
                isinstance(e, ast.Starred) for e in container.elts) and container.elts:
            items = [self.eval(e, env) for e in container.elts]
            position = self.eval(index, env)
            if type(position.const) is int and -len(items) <= position.const < len(items):
                return items[position.const]
            if all(_same_const(items[0], item) for item in items):
                return items[0]
        elif isinstance(container, ast.Dict) and container.keys and None not in container.keys:
            values = [self.eval(v, env) for v in container.values]
            if all(_same_const(values[0], value) for value in values):
                return values[0]  # every key gives the same constant (or a KeyError)
        return None

    def tautology(self, node, env):
        """The truth of a boolean formula that is the same whatever its atoms are (``o is None or o is not
        None``, ``bool(o) or not o``), when its atoms have no side effects; else None."""
        atoms = {}

        def formula(expr):
            if isinstance(expr, ast.BoolOp):
                parts = [formula(v) for v in expr.values]
                return None if None in parts else ("or" if isinstance(expr.op, ast.Or) else "and", parts)
            if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
                inner = formula(expr.operand)
                return None if inner is None else ("not", inner)
            if isinstance(expr, ast.IfExp):
                parts = [formula(expr.test), formula(expr.body), formula(expr.orelse)]
                return None if None in parts else ("if", parts)
            if (isinstance(expr, ast.Call) and self.builtin_name(expr.func, env) and expr.func.id == "bool"
                    and len(expr.args) == 1 and not expr.keywords):
                return formula(expr.args[0])
            negated = False
            if isinstance(expr, ast.Compare) and len(expr.ops) == 1 and type(expr.ops[0]) in _NEGATED:
                negated = True
                expr = ast.Compare(left=expr.left, ops=[_NEGATED[type(expr.ops[0])]()], comparators=expr.comparators)
            key = self.atom_key(expr, env)
            if key is None or len(atoms) > 5 and key not in atoms:
                return None
            index = atoms.setdefault(key, len(atoms))
            return ("not", ("atom", index)) if negated else ("atom", index)

        def value(f, truths):
            op, arg = f
            if op == "atom":
                return truths[arg]
            if op == "not":
                return not value(arg, truths)
            if op == "or":
                return any(value(part, truths) for part in arg)
            if op == "and":
                return all(value(part, truths) for part in arg)
            return value(arg[1], truths) if value(arg[0], truths) else value(arg[2], truths)

        tree = formula(node)
        if tree is None or not atoms:
            return None
        results = {value(tree, [bool(bits >> i & 1) for i in range(len(atoms))]) for bits in range(1 << len(atoms))}
        return results.pop() if len(results) == 1 else None

    def atom_key(self, node, env):
        """A key for an expression without side effects (so that two occurrences evaluate alike), or None."""
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call):
                if not (self.builtin_name(sub.func, env) and sub.func.id in _PURE_CALLS):
                    return None
            elif isinstance(sub, (ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom, ast.Lambda, ast.Starred,
                                  ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
                return None
        return ast.dump(node)

    def pure_key(self, node, env, depth=0):
        """A key for an expression without side effects (names, attributes, constant items, and builtins such
        as type() and id() of those), equal for two expressions that evaluate to the same object; else None."""
        if depth > 8:
            return None
        if isinstance(node, (ast.Name, ast.Constant)):
            return ast.dump(node)
        if isinstance(node, ast.Attribute):
            inner = self.pure_key(node.value, env, depth + 1)
            return None if inner is None else f"{inner}.{node.attr}"
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            inner = self.pure_key(node.value, env, depth + 1)
            return None if inner is None else f"{inner}[{node.slice.value!r}]"
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _PURE_IDENTITY
                and self.builtin_name(node.func, env) and not node.keywords and len(node.args) == 1):
            inner = self.pure_key(node.args[0], env, depth + 1)
            return None if inner is None else f"{node.func.id}({inner})"
        return None

    def builtin_name(self, func, env) -> bool:
        return isinstance(func, ast.Name) and func.id not in env and func.id not in self.module.bound

    def call(self, node, env) -> _AV:
        func = node.func
        args = [self.eval(a, env) for a in node.args]
        kwargs = {kw.arg: self.eval(kw.value, env) for kw in node.keywords}
        all_deps = frozenset().union(*(a.deps for a in args), *(v.deps for v in kwargs.values()))
        if isinstance(func, ast.Name) and func.id not in env and func.id not in self.module.bound:
            if func.id in _PURE_BUILTINS:
                folded = self.builtin(func.id, node, args, kwargs)
                if folded is not None:
                    return folded
        summary = self.summarise_call(node, args, kwargs, env)
        result = summary if summary is not None else _AV(self.eval(func, env).deps | all_deps)
        if summary is None and isinstance(func, ast.Name) and func.id not in env:
            classes = self.module.class_defs.get(func.id, [])
            if len(classes) == 1 and _always_truthy_instances(classes[0], self.module, 0):
                result = _AV(result.deps, truth=True)  # an object of a class whose __bool__ is always true
        # a call may mutate what it is given: a local handed to it takes the deps of every argument
        if all_deps:
            if isinstance(func, ast.Attribute):
                self.taint_base(func.value, all_deps, env)
            for arg in list(node.args) + [kw.value for kw in node.keywords]:
                self.taint_base(arg, all_deps, env)
        return result

    def builtin(self, name, node, args, kwargs):
        if kwargs or any(isinstance(a, ast.Starred) for a in node.args):
            return None
        if name == "bool":
            if not args:
                return _AV(const=False)
            if len(args) == 1:
                return _AV(const=args[0].truth) if args[0].truth is not None else _AV(args[0].deps)
        if name == "object" and not args:
            return _AV(truth=True)
        if name == "type" and len(args) == 1:
            return _AV(_type_of(args[0].deps), truth=True)  # a class: never false
        if name == "id" and len(args) == 1:
            return _AV(args[0].deps, truth=True)  # an id: never 0
        if name in ("isinstance", "issubclass") and len(node.args) == 2:
            if self.builtin_name(node.args[1], {}) and node.args[1].id == "object":
                return _AV(const=True)  # everything is an object
            return _AV(_type_of(args[0].deps) | args[1].deps)
        if name == "hasattr" and len(args) == 2 and args[1].const in _OBJECT_ATTRIBUTES:
            return _AV(const=True)  # everything has what object has
        if args and all(a.const is not _UNKNOWN for a in args) and name in _FOLDABLE:
            folded = _fold(getattr(builtins, name), *(a.const for a in args))
            if folded is not _UNKNOWN and isinstance(folded, _CONST_TYPES):
                return _AV(const=folded)
        return None

    def summarise_call(self, node, args, kwargs, env):
        """The result of a call of a function defined in this file, as a function of the call's arguments."""
        if self.depth >= _MAX_CALL_DEPTH or any(isinstance(a, ast.Starred) for a in node.args) or None in kwargs:
            return None
        func = node.func
        callee, bound = None, None
        if isinstance(func, ast.Name) and func.id not in env and func.id not in self.module.bound - set(
                self.module.funcs):
            defs = self.module.funcs.get(func.id, [])
            if len(defs) == 1 and isinstance(defs[0], (ast.FunctionDef, ast.Lambda)):
                callee = defs[0]
        elif (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and self.cls is not None
              and func.value.id == self.self_name and func.value.id not in _rebound(env, self.self_name)):
            defs = self.module.bindings(self.cls).get(func.attr, [])
            if len(defs) == 1 and (isinstance(defs[0], ast.Lambda) or (
                    isinstance(defs[0], ast.FunctionDef) and not defs[0].decorator_list)):
                callee, bound = defs[0], self.eval(func.value, env)
        if callee is None or callee in self.stack:
            return None
        params = _positional(callee.args)
        actual = ([bound] if bound is not None else []) + args
        mapping = {}
        for index, param in enumerate(params):
            if index < len(actual):
                mapping[param.arg] = actual[index].deps
            elif param.arg in kwargs:
                mapping[param.arg] = kwargs[param.arg].deps
        for param in callee.args.kwonlyargs:
            if param.arg in kwargs:
                mapping[param.arg] = kwargs[param.arg].deps
        extra = frozenset().union(*(a.deps for a in actual[len(params):]))
        extra_kw = frozenset().union(*(v.deps for k, v in kwargs.items() if k not in mapping))
        if callee.args.vararg is not None:
            mapping["*" + callee.args.vararg.arg] = extra
        if callee.args.kwarg is not None:
            mapping["**" + callee.args.kwarg.arg] = extra_kw
        summary = self.module.summaries.get(callee)
        if summary is None:
            summary = _summarise(self.module, callee, self.depth + 1, self.stack)
            self.module.summaries[callee] = summary
        labels, const, truth = summary
        if const is not _UNKNOWN:
            return _AV(const=const)
        deps = frozenset()
        for label in labels:
            deps |= mapping.get(label, frozenset())
        return _AV(deps, truth=truth)


def _rebound(env, name):
    """The names in ``env`` rebound by the body (the first parameter, reassigned, is no longer self)."""
    value = env.get(name)
    return {name} if value is not None and value.deps else set()


def _summarise(module, callee, depth, stack):
    labels = {}
    for param in _positional(callee.args) + list(callee.args.kwonlyargs):
        labels[param.arg] = _AV({"p:" + param.arg})
    if callee.args.vararg is not None:
        labels[callee.args.vararg.arg] = _AV({"p:*" + callee.args.vararg.arg})
    if callee.args.kwarg is not None:
        labels[callee.args.kwarg.arg] = _AV({"p:**" + callee.args.kwarg.arg})
    everything = frozenset(label.replace("p:", "", 1) for value in labels.values() for label in value.deps)
    if _is_generator(callee):
        return frozenset(), _UNKNOWN, True
    flow = _Flow(module, callee, labels, depth, stack)
    returns = [e.value for e in flow.exits if e.kind == "return"]
    if not returns:
        return everything, _UNKNOWN, None
    value = returns[0]
    for other in returns[1:]:
        value = _join(value, other)
    if value.const is not _UNKNOWN:
        return frozenset(), value.const, value.truth
    deps = set(value.deps)
    if any(e.kind == "raise" for e in flow.exits) or len({_outcome_key(e) for e in flow.exits}) > 1:
        for e in flow.exits:
            deps |= e.pc
    return frozenset(label.replace("p:", "", 1) for label in deps), _UNKNOWN, value.truth


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


# ---------------------------------------------------------------------------------------------------------------
# Verdicts


_DEPENDENT = ("dependent",)
_UNDECIDED = ("undecided",)
_TYPED = ("type",)  # depends on the operand's type, not on its value


def _outcome_key(exit_: _Exit):
    if exit_.kind == "raise":
        return ("raise",)
    value = exit_.value
    if value.const is NotImplemented:
        return ("notimplemented",)
    if value.const is None:
        return ("none",)
    if value.truth is not None:
        return ("truth", value.truth)
    if OP in value.deps:
        return _DEPENDENT
    if OPAQUE in value.deps:
        return _UNDECIDED
    if TYPE in value.deps:
        return _TYPED
    return ("self", id(exit_))


@dataclass
class _Verdict:
    ignores: bool | None
    returns: list  # (outcome key, constant or _UNKNOWN) of each exit that returns
    generator: bool = False
    type_only: bool = False  # depends on the operand, but on its type only

    @property
    def outcomes(self) -> list:
        return [key for key, _const in self.returns]


def _judge(module: _Module, node) -> _Verdict:
    args = node.args
    params = _positional(args)
    labels = {}
    defaults = [None] * (len(params) - len(args.defaults)) + list(args.defaults)
    for index, param in enumerate(params):
        labels[param.arg] = _AV() if index == 0 else _AV({OP})
        if index >= 2 and defaults[index] is not None:
            # an operator passes one operand: a further parameter keeps its default
            labels[param.arg] = _Flow.default_value(module, defaults[index])
    for param, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        labels[param.arg] = _AV() if default is None else _Flow.default_value(module, default)
    if args.vararg is not None:
        labels[args.vararg.arg] = _AV({OPAQUE}, vararg=len(params))
    if args.kwarg is not None:
        labels[args.kwarg.arg] = _AV({OPAQUE})
    if _is_generator(node):
        return _Verdict(True, [(("truth", True), _UNKNOWN)], generator=True)
    flow = _Flow(module, node, labels)
    returns = [(_outcome_key(e), e.value.const) for e in flow.exits if e.kind == "return"]
    keys = [key for key, _const in returns]
    if not returns:
        return _Verdict(None, [])
    # a difference between the outcomes is due to the conditions that chose between them
    differ = len({_outcome_key(e) for e in flow.exits}) > 1
    pcs = frozenset().union(*(e.pc for e in flow.exits)) if differ else frozenset()
    if _DEPENDENT in keys or OP in pcs:
        return _Verdict(False, returns)
    if _UNDECIDED in keys or OPAQUE in pcs:
        return _Verdict(None, returns)
    if _TYPED in keys or TYPE in pcs:
        return _Verdict(False, returns, type_only=True)
    return _Verdict(True, returns)


_PARSED: dict = {}
# The parser accepts expressions nested about 3,000 deep (a long `a + b + ...`); the analysis recurses once or
# twice a level, so it runs under a higher limit: a deep expression must not hide a defeater behind a
# RecursionError.
_RECURSION_LIMIT = 20_000


class _DeepRecursion:
    def __enter__(self):
        self.saved = sys.getrecursionlimit()
        sys.setrecursionlimit(max(self.saved, _RECURSION_LIMIT))

    def __exit__(self, *exc):
        sys.setrecursionlimit(self.saved)
        return False


def _module_of(source: str):
    module = _PARSED.get(source)
    if module is None:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        module = _Module(tree)
        if len(_PARSED) > 32:
            _PARSED.clear()
        _PARSED[source] = module
    return module


def _functions_at(module: _Module, firstlineno: int, name: str | None):
    found = []
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Lambda):
            if name not in (None, "<lambda>") or node.lineno != firstlineno:
                continue
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if name is not None and name != node.name:
                continue
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if firstlineno not in (node.lineno, first):
                continue
        else:
            continue
        found.append(node)
    return found


def function_ignores_operand(source: str, firstlineno: int, name: str | None = None) -> bool | None:
    """Given a file's source and the first line of a function or lambda (as a code object's co_firstlineno and
    co_name; '<lambda>' for lambdas), True when that function's result cannot depend on its operands (every
    parameter after the first; as an operator passes one operand, a third or later parameter with a default
    keeps its default), False when it can (an operand's type is enough), None when it cannot be decided (no
    such function, *args used as a whole, raises on every path, a syntax error, ...).

    "Its result" is what it returns, or the truthiness of what it returns when only that is fixed (a non-empty
    tuple built from the operand is always true). Returning NotImplemented or a constant False is ignoring the
    operand too: which of those defeat an assertion is for the caller (see ``function_defeats``)."""
    try:
        module = _module_of(source)  # parsed under the ordinary limit, as the tests will import it
        if module is None:
            return None
        with _DeepRecursion():
            verdicts = {_judge(module, node).ignores for node in _functions_at(module, firstlineno, name)}
    except Exception as error:
        if STRICT and not isinstance(error, RecursionError):
            raise
        return None
    return verdicts.pop() if len(verdicts) == 1 else None


def function_defeats(source: str, firstlineno: int, name: str | None = None, method: str = "__eq__") -> bool | None:
    """Like ``function_ignores_operand``, but True only when the function, attached as ``method``, defeats an
    assertion: it ignores its operand and can return something other than NotImplemented, None, or the
    harmless constant (False for ``__eq__`` and the others, True for ``__ne__``)."""
    try:
        module = _module_of(source)
        if module is None:
            return None
        with _DeepRecursion():
            nodes = _functions_at(module, firstlineno, name)
            results = {_defeat(_judge(module, node), method, node) is not None for node in nodes}
    except Exception as error:
        if STRICT and not isinstance(error, RecursionError):
            raise
        return None
    return results.pop() if len(results) == 1 else None


def _callable_with_two(node) -> bool:
    args = node.args
    params = _positional(args)
    required = len(params) - len(args.defaults)
    if any(default is None for default in args.kw_defaults):
        return False
    return required <= 2 and (len(params) >= 2 or args.vararg is not None)


def _harmful(key, method: str) -> bool:
    """Whether an outcome defeats an assertion through ``method``: a value not known (computed from self or
    globals), or of the truth that makes the assertion pass (False for ``__ne__``, True for the others).
    Under a computed name (which may be any method: memoizers set ``lambda *a: result``) only a value known
    to be true counts."""
    if key[0] == "self":
        return method != COMPUTED
    return key[0] == "truth" and key[1] is (method != "__ne__")


def _defeat(verdict: _Verdict, method: str, node) -> str | None:
    """What the function returns that defeats an assertion through ``method``, or None when it does not."""
    if verdict.ignores is not True or not _callable_with_two(node):
        return None
    if not any(_harmful(key, method) for key in verdict.outcomes):
        return None
    if verdict.generator:
        return "a generator or coroutine (always true)"
    harmful = [(key, const) for key, const in verdict.returns if _harmful(key, method)]
    if all(const is not _UNKNOWN for _key, const in harmful):
        return " or ".join(sorted({repr(const)[:40] for _key, const in harmful}))
    if all(key[0] == "truth" for key, _const in harmful):
        return "an always-true value" if method != "__ne__" else "an always-false value"
    return "a value computed without the operand"


def _always(verdict: _Verdict, truth: bool) -> bool:
    keys = {key for key in verdict.outcomes if key[0] != "notimplemented"}
    if truth is False:
        keys.discard(("none",))
    return verdict.ignores is True and bool(keys) and keys == {("truth", truth)}


# ---------------------------------------------------------------------------------------------------------------
# Attachment sites


def _kind(method: str) -> str:
    if method in ISINSTANCE:
        return "isinstance_always_true"
    if method in CONTAINS:
        return "contains_ignores_operand"
    if method == COMPUTED:
        return "computed_name_ignores_operand"
    return "comparison_ignores_operand"


class _Sites:
    """The attachment sites of a module, each judged with the core."""

    def __init__(self, module: _Module, path: str, depth: int = 0):
        self.module = module
        self.path = path
        self.depth = depth  # of exec() strings within exec() strings
        self.scopes = [module.funcs]  # function bindings of the enclosing module/function scopes
        self.findings: list[Finding] = []
        self.seen = set()

    def run(self):
        for node, scopes in self.module.sites:
            self.scopes = [self.module.bindings(scope) for scope in scopes]
            kind = type(node)
            if kind is ast.ClassDef:
                self.visit_class(node)
            elif kind is ast.Assign:
                self.visit_assign(node)
            elif kind is ast.Call:
                self.visit_call(node)
            else:
                self.visit_dict(node)

    def visit_class(self, node):
        bindings = self.module.bindings(node)
        judged = {}
        for stmt in _scope_statements(node.body):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name in WATCHED:
                judged.setdefault(stmt.name, []).append((stmt, stmt, self.judge(stmt)))
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                names = [t.id for t in targets if isinstance(t, ast.Name) and t.id in WATCHED]
                if stmt.value is None or not names:
                    continue
                for fn in self.resolve(stmt.value, [bindings] + self.scopes[::-1]):
                    for name in names:
                        judged.setdefault(name, []).append((stmt, fn, self.judge(fn)))
        for method, entries in judged.items():
            for site, fn, verdict in entries:
                what = _defeat(verdict, method, fn)
                if what is None and method == "__eq__" and self.type_only(verdict, fn, node):
                    detail = (f"{node.name}.__eq__ looks at nothing but the other object's type, so any two "
                              f"{node.name} objects are equal whatever they hold")
                    self.add(Finding(self.path, site.lineno, "comparison_only_checks_type", detail), site, fn)
                if what is None or self.extremum(method, verdict, judged):
                    continue
                self.report(site, fn, method, what, node.name)

    def type_only(self, verdict, fn, cls) -> bool:
        """An ``__eq__`` that depends on the operand's type alone, in a class whose objects hold state."""
        if not verdict.type_only or not _callable_with_two(fn):
            return False
        if not any(key in (_TYPED, ("truth", True)) or key[0] == "self" for key in verdict.outcomes):
            return False
        return _has_state(cls) and not _hash_by_type(cls, self.module)

    def extremum(self, method, verdict, judged) -> bool:
        """An ordering that is constantly true while its mirror is constantly false is an infinity sentinel
        (``Infinity > x`` for every x), not a defeater: packaging's Infinity, sorting sentinels."""
        mirror = ORDERINGS.get(method)
        if mirror is None or mirror not in judged or not _always(verdict, True):
            return False
        return all(_always(other, False) for _site, _fn, other in judged[mirror])

    # -- attachments outside class bodies

    def visit_assign(self, node):
        for target in node.targets:
            method = None
            if isinstance(target, ast.Attribute) and target.attr in WATCHED:
                method = target.attr
            elif isinstance(target, ast.Subscript):
                key = _fold_str(target.slice, self.module)
                method = key if key in WATCHED else None
            if method is not None:
                self.judge_value(node, node.value, method, _dotted(target.value) or "an object")

    def visit_call(self, node):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if name in ("exec", "compile") and node.args:
            self.visit_exec(node)
        if name in ("setattr", "__setattr__") and len(node.args) == 3 and not node.keywords:
            key = _fold_str(node.args[1], self.module)
            owner = _dotted(node.args[0]) or "an object"
            if key is None:
                self.judge_value(node, node.args[2], COMPUTED, owner)
            elif key in WATCHED:
                self.judge_value(node, node.args[2], key, owner)
        for keyword in node.keywords:  # dict(__eq__=f), namespace.update(__eq__=f), ...
            if keyword.arg in WATCHED:
                self.judge_value(node, keyword.value, keyword.arg, "a class namespace")
        if name in ("type", "__new__", "new_class") and len(node.args) >= 3:
            namespace = node.args[-1] if name != "new_class" else None
            if isinstance(namespace, ast.Dict):
                for key, value in zip(namespace.keys, namespace.values, strict=True):
                    if key is not None and _fold_str(key, self.module) is None:
                        self.judge_value(node, value, COMPUTED, "a class built by type()")

    def visit_exec(self, node):
        """Code in a string handed to exec() or compile(): analysed as if it were a class body (exec in a class
        namespace defines methods), its findings placed at the call."""
        code = _fold_str(node.args[0], self.module)
        if code is None or self.depth >= _MAX_EXEC_DEPTH:
            return
        try:
            tree = ast.parse(code)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return
        wrapper = ast.Module(body=[ast.ClassDef(name="<exec>", bases=[], keywords=[], body=tree.body or [ast.Pass()],
                                                decorator_list=[])], type_ignores=[])
        ast.fix_missing_locations(wrapper)
        inner = _Sites(_Module(wrapper), self.path, self.depth + 1)
        inner.run()
        for finding in inner.findings + _wildcards(inner.module, self.path):
            self.add(Finding(self.path, node.lineno, finding.kind,
                             f"code run by {_dotted(node.func) or 'exec'}() at this line: {finding.detail}"), node, node)

    def visit_dict(self, node):
        for key, value in zip(node.keys, node.values, strict=True):
            method = _fold_str(key, self.module) if key is not None else None
            if method in WATCHED:
                self.judge_value(key, value, method, "a class namespace")

    # -- judging

    def judge_value(self, site, value, method, owner):
        for fn in self.resolve(value, self.scopes[::-1]):
            what = _defeat(self.judge(fn), method, fn)
            if what is not None:
                self.report(site, fn, method, what, owner)

    def judge(self, fn) -> _Verdict:
        return _judge(self.module, fn)

    def resolve(self, value, scopes, depth=0) -> list:
        """The function nodes (defs, lambdas) that ``value`` evaluates to, as far as this file says."""
        if depth > 8 or value is None:
            return []
        if isinstance(value, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef)):
            return [value]
        if isinstance(value, ast.Name):
            for scope in scopes:
                if value.id in scope:
                    out = []
                    for bound in scope[value.id]:
                        out.extend(self.resolve(bound, scopes, depth + 1))
                    return out
            return []
        if isinstance(value, ast.IfExp):
            return self.resolve(value.body, scopes, depth + 1) + self.resolve(value.orelse, scopes, depth + 1)
        if isinstance(value, ast.BoolOp):
            return [fn for part in value.values for fn in self.resolve(part, scopes, depth + 1)]
        if isinstance(value, ast.NamedExpr):
            return self.resolve(value.value, scopes, depth + 1)
        if (isinstance(value, ast.Call) and len(value.args) == 1 and not value.keywords
                and isinstance(value.func, ast.Name) and value.func.id in ("staticmethod", "classmethod")):
            return self.resolve(value.args[0], scopes, depth + 1)
        if isinstance(value, ast.Call):  # a factory defined here: what it returns
            out = []
            for factory in self.resolve(value.func, scopes, depth + 1):
                if isinstance(factory, ast.Lambda):
                    out.extend(self.resolve(factory.body, scopes, depth + 1))
                    continue
                inner = [self.module.bindings(factory)] + list(scopes)
                for stmt in _scope_statements(factory.body):
                    if isinstance(stmt, ast.Return) and stmt.value is not None:
                        out.extend(self.resolve(stmt.value, inner, depth + 1))
            return out
        return []

    def report(self, site, fn, method, what, owner):
        shown = f"{owner}.{method}" if method != COMPUTED else f"a function set on {owner} under a computed name"
        where = f" (defined at line {fn.lineno})" if getattr(site, "lineno", fn.lineno) != fn.lineno else ""
        detail = f"{shown} returns {what} whatever it is compared with{where}"
        if method in CONTAINS:
            detail = f"{shown} returns {what} whatever is looked up in it{where}"
        elif method in ISINSTANCE:
            detail = f"{shown} returns {what} whatever is checked against it{where}"
        self.add(Finding(self.path, site.lineno, _kind(method), detail), site, fn)

    def add(self, finding, site, fn):
        key = (site.lineno, finding.kind, id(fn))
        if key not in self.seen:
            self.seen.add(key)
            self.findings.append(finding)


def _always_truthy_instances(cls: ast.ClassDef, module: _Module, depth: int) -> bool:
    """Whether every object of ``cls`` is true: its ``__bool__`` (or a base's in this file) returns a true
    constant on every path."""
    if depth > 8:
        return False
    cached = module.truthy.get(cls)
    if cached is not None:
        return cached
    module.truthy[cls] = False  # while it is being decided (a cycle of bases)
    result = False
    defs = module.bindings(cls).get("__bool__", [])
    if len(defs) == 1 and isinstance(defs[0], (ast.FunctionDef, ast.Lambda)):
        verdict = _judge(module, defs[0])
        result = bool(verdict.outcomes) and all(key == ("truth", True) for key in verdict.outcomes)
    elif not defs and "__len__" not in module.bindings(cls):
        for base in cls.bases:
            defined = module.class_defs.get(base.id, []) if isinstance(base, ast.Name) else []
            if len(defined) == 1 and _always_truthy_instances(defined[0], module, depth + 1):
                result = True
    module.truthy[cls] = result
    return result


_STATEFUL_BASES = {"str", "bytes", "bytearray", "int", "float", "complex", "tuple", "list", "dict", "set",
                   "frozenset", "Decimal", "Fraction", "NamedTuple", "deque", "OrderedDict", "defaultdict",
                   "Counter", "UserDict", "UserList", "UserString"}


_DATACLASS_DECORATORS = {"dataclass", "s", "attrs", "define", "frozen", "mutable", "dataclass_transform"}


def _has_state(cls: ast.ClassDef) -> bool:
    """Whether each object of ``cls`` holds values given to it when it is made: a builtin value type among
    its bases, dataclass or attrs fields, ``self.x = <a parameter>`` in its own ``__init__``, ``__new__`` or
    ``__post_init__``. Class attributes, constants and a base's settings (a cache size) are not state: a
    subclass whose objects differ in nothing of their own may well be equal by type."""
    for base in cls.bases:
        name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
        if isinstance(base, ast.Call):
            return True  # namedtuple(...), a class factory
        if name in _STATEFUL_BASES:
            return True
    decorated = any((_dotted(d.func if isinstance(d, ast.Call) else d) or "").rsplit(".", 1)[-1]
                    in _DATACLASS_DECORATORS for d in cls.decorator_list)
    for stmt in _scope_statements(cls.body):
        if decorated and isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and \
                "ClassVar" not in ast.dump(stmt.annotation):
            return True
        if isinstance(stmt, ast.FunctionDef) and stmt.name in ("__init__", "__new__", "__post_init__"):
            params = [p.arg for p in _positional(stmt.args)[1:] + list(stmt.args.kwonlyargs)]
            params += [p.arg for p in (stmt.args.vararg, stmt.args.kwarg) if p is not None]
            if stmt.name == "__post_init__":
                params.append(_positional(stmt.args)[0].arg if _positional(stmt.args) else "self")
            if any(_stores_a_parameter(sub, params) for sub in ast.walk(stmt)):
                return True
    return False


def _stores_a_parameter(node, params) -> bool:
    """``x.attr = <something made from a parameter>`` (or setattr(x, ..., <that>))."""
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        value = node.value
    elif isinstance(node, ast.Call) and _dotted(node.func) in ("setattr", "object.__setattr__") and len(node.args) == 3:
        targets, value = [ast.Attribute(value=node.args[0], attr="_", ctx=ast.Store())], node.args[2]
    else:
        return False
    if not any(isinstance(t, ast.Attribute) for t in targets):
        return False
    return any(isinstance(sub, ast.Name) and sub.id in params for sub in ast.walk(value))


def _hash_by_type(cls: ast.ClassDef, module: _Module) -> bool:
    """Whether the class hashes its objects by their type alone (``hash(type(self))``): equality by type is
    then the design, not an accident."""
    defs = module.bindings(cls).get("__hash__", [])
    if len(defs) != 1 or not isinstance(defs[0], (ast.FunctionDef, ast.Lambda)):
        return False
    params = _positional(defs[0].args)
    if not params:
        return False
    flow = _Flow(module, defs[0], {params[0].arg: _AV({OP})})
    values = [e.value for e in flow.exits if e.kind == "return"]
    return bool(values) and all(v.const is _UNKNOWN and TYPE in v.deps and OP not in v.deps for v in values)


def _fold_str(node, module: _Module):
    """The string ``node`` always evaluates to, when that can be computed exactly; else None."""
    try:
        value = _fold_str_value(node, module, 0)
    except RecursionError:
        return None
    return value if isinstance(value, str) else None


def _fold_str_value(node, module, depth):
    if depth > 20:
        return None
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.Name):
        value = module.consts.get(node.id)
        return value if isinstance(value, str) else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left = _fold_str_value(node.left, module, depth + 1)
        right = _fold_str_value(node.right, module, depth + 1)
        return left + right if left is not None and right is not None else None
    if isinstance(node, ast.JoinedStr):
        parts = []
        for part in node.values:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                parts.append(part.value)
            elif (isinstance(part, ast.FormattedValue) and part.conversion in (-1, None) and part.format_spec is None):
                inner = _fold_str_value(part.value, module, depth + 1)
                if inner is None:
                    return None
                parts.append(inner)
            else:
                return None
        return "".join(parts)
    return None


def _wildcards(module: _Module, path: str) -> list[Finding]:
    """Imports and uses of objects that equal everything (``unittest.mock.ANY``) in the patched code."""
    findings = []
    aliases = {}  # a name bound to a wildcard module (or to the unittest package) -> what it is
    for node in module.imports:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in _WILDCARD_MODULES or alias.name == "unittest":
                    aliases[alias.asname or alias.name] = alias.name
                    if alias.asname is None and alias.name == "unittest.mock":
                        aliases["unittest"] = "unittest"
        elif node.module in _WILDCARD_MODULES and node.level == 0:
            for alias in node.names:
                if alias.name in _WILDCARDS:
                    findings.append(Finding(path, node.lineno, "wildcard_object",
                                            f"imports {node.module}.{alias.name}, which compares equal to everything"))
        elif node.module == "unittest" and node.level == 0:
            for alias in node.names:
                if alias.name == "mock":
                    aliases[alias.asname or "mock"] = "unittest.mock"
    for node in module.wildcard_uses:
        if isinstance(node, ast.Attribute):
            owner, name = node.value, node.attr
        else:  # getattr(owner, "ANY")
            owner, name = node.args[0], node.args[1].value
        found = _mock_module(owner, aliases)
        if found is not None:
            findings.append(Finding(path, node.lineno, "wildcard_object",
                                    f"uses {found}.{name}, which compares equal to everything"))
    return findings


def _mock_module(node, aliases):
    """The wildcard module (unittest.mock, mock) that ``node`` evaluates to, or None."""
    key = _dotted(node)
    if key in aliases and aliases[key] in _WILDCARD_MODULES:
        return aliases[key]
    if isinstance(node, ast.Attribute) and node.attr == "mock":  # unittest.mock, __import__("unittest").mock
        inner = node.value
        if _dotted(inner) in aliases and aliases[_dotted(inner)] == "unittest":
            return "unittest.mock"
        if isinstance(inner, ast.Call) and _literal_arg(inner) in ("unittest", "unittest.mock"):
            return "unittest.mock"
    if isinstance(node, ast.Subscript) and _dotted(node.value) == "sys.modules":
        if isinstance(node.slice, ast.Constant) and node.slice.value in _WILDCARD_MODULES:
            return node.slice.value
    if isinstance(node, ast.Call) and _literal_arg(node) in _WILDCARD_MODULES:
        if (_dotted(node.func) or "").endswith("import_module") or _dotted(node.func) == "__import__":
            return _literal_arg(node) if _dotted(node.func) != "__import__" or _literal_arg(node) == "mock" else None
    return None


def _literal_arg(call):
    if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
        return call.args[0].value
    return None


def defeaters_in_source(path: str, source: str) -> list[Finding]:
    """Static analysis of one Python file after the patch (AST), finding definitions that defeat assertions:
    comparison, membership and isinstance special methods whose result does not depend on what they are
    given, however they are attached. A file that does not parse has none (its tests fail to import it)."""
    try:
        module = _module_of(source)  # parsed under the ordinary limit, as the tests will import it
        if module is None:
            return []
        with _DeepRecursion():
            sites = _Sites(module, path)
            sites.run()
            findings = sites.findings + _wildcards(module, path)
    except Exception as error:  # a grader must not crash on a strange file: no findings (STRICT in tests)
        if STRICT and not isinstance(error, RecursionError):
            raise
        return []
    return sorted(findings, key=lambda f: (f.line, f.kind, f.detail))


def main(argv: list[str]) -> int:
    """``python defeaters.py FILE...``: print one line per finding; exit 1 when there are any."""
    found = 0
    for path in argv:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                source = handle.read()
        except OSError:
            continue
        for finding in defeaters_in_source(path, source):
            found += 1
            print(f"{finding.path}:{finding.line}: {finding.kind}: {finding.detail}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
