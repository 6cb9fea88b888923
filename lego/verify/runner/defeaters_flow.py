"""The core of the assertion-defeater analysis: one function's data and control flow, interpreted abstractly.

Part of defeaters.py (which explains the analysis); standard library only, shipped with it to the grading container.
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass

from .defeaters_values import (
    _AV,
    _BINARY,
    _COMPARE,
    _CONST_TYPES,
    _FOLDABLE,
    _MAX_CALL_DEPTH,
    _MAX_LOOP_PASSES,
    _NEGATED,
    _OBJECT_ATTRIBUTES,
    _PURE_BUILTINS,
    _PURE_CALLS,
    _PURE_IDENTITY,
    _REFLEXIVE,
    _UNARY,
    _UNKNOWN,
    OP,
    OPAQUE,
    TYPE,
    _as_load,
    _bound_names,
    _dotted,
    _fold,
    _is_generator,
    _join,
    _merge,
    _Module,
    _positional,
    _rebound,
    _same_const,
    _same_env,
    _truth_of,
    _type_of,
)

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

    def eval(self, node, env) -> _AV:
        if isinstance(node, ast.Constant):
            return _AV(const=node.value) if isinstance(node.value, _CONST_TYPES) else _AV(truth=_truth_of(node.value))
        if isinstance(node, ast.Name):
            return self.name(node, env)
        if isinstance(node, ast.Attribute):
            key = _dotted(node)
            if key is not None and key in env:
                return env[key]
            base = self.eval(node.value, env).deps
            return _AV(_type_of(base) if node.attr == "__class__" else base)
        if isinstance(node, ast.Subscript):
            return self.subscript(node, env)
        if isinstance(node, ast.BoolOp):
            result = self.boolop(node, env)
            if result.truth is None and result.const is _UNKNOWN:
                truth = self.tautology(node, env)
                if truth is not None:
                    return _AV(result.deps, truth=truth)
            return result
        if isinstance(node, ast.UnaryOp):
            return self.unaryop(node, env)
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
            return self.ifexp(node, env)
        if isinstance(node, ast.Call):
            return self.call(node, env)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict, ast.JoinedStr)):
            return self.display(node, env)
        if isinstance(node, ast.NamedExpr):
            value = self.eval(node.value, env)
            env[node.target.id] = value
            return value
        if isinstance(node, (ast.Lambda, ast.GeneratorExp)):
            return _AV(self.closure_deps(node, env), truth=True)
        if isinstance(node, ast.Starred):
            return _AV(self.eval(node.value, env).deps)
        return _AV(self.closure_deps(node, env))  # comprehensions, await, slices, ...

    def name(self, node, env) -> _AV:
        if node.id in env:
            return env[node.id]
        if node.id in self.module.consts:
            return _AV(const=self.module.consts[node.id])
        if node.id == "NotImplemented" and node.id not in self.module.bound:
            return _AV(const=NotImplemented)
        return _AV()

    def subscript(self, node, env) -> _AV:
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

    def unaryop(self, node, env) -> _AV:
        operand = self.eval(node.operand, env)
        if isinstance(node.op, ast.Not):
            return _AV(const=not operand.truth) if operand.truth is not None else _AV(operand.deps)
        if operand.const is not _UNKNOWN:
            folded = _fold(lambda v: _UNARY[type(node.op)](v), operand.const)
            if folded is not _UNKNOWN:
                return _AV(const=folded)
        return _AV(operand.deps)

    def ifexp(self, node, env) -> _AV:
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

    def display(self, node, env) -> _AV:
        """A tuple, list, set, dict or f-string: what its parts depend on; true when it surely has an element
        (or literal text), false when it is surely empty."""
        deps = frozenset()
        if isinstance(node, ast.Dict):
            for part in list(node.keys) + list(node.values):
                if part is not None:
                    deps |= self.eval(part, env).deps
            plain = any(key is not None for key in node.keys)
            return _AV(deps, truth=True if plain else (False if not node.keys else None))
        if isinstance(node, ast.JoinedStr):
            literal = False
            for part in node.values:
                if isinstance(part, ast.Constant) and part.value:
                    literal = True
                elif isinstance(part, ast.FormattedValue):
                    deps |= self.eval(part.value, env).deps
            return _AV(deps, truth=True if literal else None)
        for elt in node.elts:
            deps |= self.eval(elt, env).deps
        plain = any(not isinstance(elt, ast.Starred) for elt in node.elts)
        return _AV(deps, truth=True if plain else (False if not node.elts else None))

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
