"""A test's `parametrize` table: its rows, the ids pytest gives them, and the decorator written back out."""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

from lego.verify.decoys.expressions import call_name, is_literal, is_value_call
from lego.verify.decoys.model import NodeId


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
    if isinstance(node, ast.Constant | ast.UnaryOp) and is_literal(node):
        value = ast.literal_eval(node)
        if isinstance(value, str):
            return value or None
        if isinstance(value, bytes):
            return value.decode("ascii") if value and all(32 <= byte < 127 and byte != 92 for byte in value) else None
        if isinstance(value, bool | int | float | complex) or value is None:
            return str(value)
    if isinstance(node, ast.List | ast.Tuple | ast.Set | ast.Dict) or (
            isinstance(node, ast.Call) and is_value_call(node.func)):
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
                  if isinstance(node, ast.Call) and call_name(node) == "parametrize"]
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
        if isinstance(row, ast.Call) and call_name(row) == "param":
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
