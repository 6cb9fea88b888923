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

Standard library only. This file and its parts (defeaters_values.py: abstract values and module bindings;
defeaters_flow.py: the abstract interpreter and a function's verdict) are copied into the grading container and
run there by the task's Python: lego_grade.py loads them as one package, by path. On the host,
``python -m lego.verify.runner.defeaters FILE...`` prints the findings and exits 1 when there are any.
"""

from __future__ import annotations

import ast
import sys

from .defeaters_flow import (
    _TYPED,
    _Flow,
    _judge,
    _Verdict,
)
from .defeaters_values import (
    _AV,
    _MAX_EXEC_DEPTH,
    _UNKNOWN,
    _WILDCARD_MODULES,
    _WILDCARDS,
    COMPUTED,
    CONTAINS,
    ISINSTANCE,
    OP,
    ORDERINGS,
    TYPE,
    WATCHED,
    Finding,
    _dotted,
    _Module,
    _positional,
    _scope_statements,
)

STRICT = False  # raise the analysis's own errors instead of returning nothing (for tests)

# ---------------------------------------------------------------------------------------------------------------
# The public questions: does a function defeat assertions, where are they attached in a file


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
    """``python -m lego.verify.runner.defeaters FILE...``: print one line per finding; exit 1 when there are any."""
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
