"""Procedural bug injection: AST mutations of function bodies, applied as minimal text edits.

Each mutation replaces the source text of one node (or deletes one statement), so the diff between
the pristine and the mutated file is a few lines: the gold patch of a synthesized task stays small.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Iterator
from dataclasses import dataclass

_FLIP = {ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt, ast.Eq: ast.NotEq,
         ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_BOUNDARY = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
_ARITH = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult,
          ast.Div: ast.Mult}
_NON_COMMUTATIVE = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)

OPERATORS = ("flip_comparison", "boundary_comparison", "off_by_one", "swap_operands", "swap_arithmetic",
             "boolean_operator", "negate_condition", "drop_return_branch")


@dataclass(frozen=True)
class Mutation:
    file: str  # path relative to the package root
    function: str  # qualified name: Class.method or function
    operator: str
    lineno: int
    start: int  # byte offsets into the file's UTF-8 source
    end: int
    replacement: str
    original: str

    @property
    def description(self) -> str:
        return f"{self.operator} at {self.file}:{self.lineno} in {self.function}: {self.original!r} -> {self.replacement!r}"

    def apply(self, source: bytes) -> bytes:
        return source[: self.start] + self.replacement.encode() + source[self.end:]


def _line_offsets(source: bytes) -> list[int]:
    offsets, total = [0], 0
    for line in source.splitlines(keepends=True):
        total += len(line)
        offsets.append(total)
    return offsets


class _Collector(ast.NodeVisitor):
    def __init__(self, rel: str, source: bytes) -> None:
        self.rel, self.source = rel, source
        self.offsets = _line_offsets(source)
        self.scope: list[str] = []
        self.found: list[Mutation] = []

    def _span(self, node: ast.AST) -> tuple[int, int]:
        return (self.offsets[node.lineno - 1] + node.col_offset, self.offsets[node.end_lineno - 1] + node.end_col_offset)

    def _add(self, node: ast.AST, operator: str, replacement: str) -> None:
        start, end = self._span(node)
        original = self.source[start:end].decode()
        if replacement != original:
            self.found.append(Mutation(self.rel, ".".join(self.scope), operator, node.lineno, start, end,
                                       replacement, original))

    def _in_function(self) -> bool:
        return bool(self.scope) and self._function_depth > 0

    _function_depth = 0

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        for stmt in node.body:  # decorators and bases are not function bodies
            self.visit(stmt)
        self.scope.pop()

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        self._function_depth += 1
        for stmt in node.body:  # defaults and annotations are skipped on purpose
            self.visit(stmt)
        self._function_depth -= 1
        self.scope.pop()

    visit_FunctionDef = _visit_function
    visit_AsyncFunctionDef = _visit_function

    def visit_Compare(self, node: ast.Compare) -> None:
        if self._in_function() and len(node.ops) == 1:
            op = type(node.ops[0])
            for operator, table in (("flip_comparison", _FLIP), ("boundary_comparison", _BOUNDARY)):
                if op in table:
                    mutated = ast.Compare(node.left, [table[op]()], node.comparators)
                    self._add(node, operator, ast.unparse(mutated))
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if self._in_function():
            if type(node.op) in _ARITH:
                self._add(node, "swap_arithmetic", ast.unparse(ast.BinOp(node.left, _ARITH[type(node.op)](), node.right)))
            if isinstance(node.op, _NON_COMMUTATIVE):
                self._add(node, "swap_operands", ast.unparse(ast.BinOp(node.right, node.op, node.left)))
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if self._in_function() and type(node.value) is int and 0 <= node.value <= 1000:
            self._add(node, "off_by_one", str(node.value + 1))

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        if self._in_function():
            swapped = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            self._add(node, "boolean_operator", ast.unparse(ast.BoolOp(swapped, node.values)))
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        if self._in_function():
            start, end = self._span(node.test)
            test_text = self.source[start:end].decode()
            self.found.append(Mutation(self.rel, ".".join(self.scope), "negate_condition", node.lineno, start, end,
                                       f"not ({test_text})", test_text))
            if not node.orelse and isinstance(node.body[-1], ast.Return):
                self._drop_statement(node)
        self.generic_visit(node)

    def _drop_statement(self, node: ast.stmt) -> None:
        # Whole lines only, and only when the statement starts its line (no `x = 1; if ...`).
        line_start = self.offsets[node.lineno - 1]
        if self.source[line_start:line_start + node.col_offset].strip():
            return
        start, end = line_start, self.offsets[node.end_lineno]
        original = self.source[start:end].decode()
        self.found.append(Mutation(self.rel, ".".join(self.scope), "drop_return_branch", node.lineno, start, end,
                                   "", original))


def find_mutations(rel: str, source: bytes) -> list[Mutation]:
    """Every candidate mutation in the function bodies of one file (none if it does not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    collector = _Collector(rel, source)
    collector.visit(tree)
    valid = []
    for mutation in collector.found:
        try:
            compile(mutation.apply(source), rel, "exec")
        except SyntaxError:
            continue
        valid.append(mutation)
    return valid


def shuffled(mutations: list[Mutation], seed: int) -> Iterator[Mutation]:
    order = list(mutations)
    random.Random(seed).shuffle(order)
    yield from order
