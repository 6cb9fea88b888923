"""SQL lives in sql/*.sql and is loaded by name, with `{{ name }}` placeholders filled in as SQL literals.

Values are rendered as literals (strings quoted, booleans as TRUE/FALSE, None as NULL) because DuckDB
views cannot take bound parameters; `Raw` passes a piece of SQL through unchanged (a table expression).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from lego import SQL_DIR
from lego.errors import LegoError

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


class SQLTemplateError(LegoError):
    """A SQL file is missing or its placeholders do not match the parameters given."""


@dataclass(frozen=True)
class Raw:
    """A fragment of SQL inserted as written (never user input)."""

    sql: str


def sql_literal(value: object) -> str:
    if isinstance(value, Raw):
        return value.sql
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SQLTemplateError(f"cannot put the non-finite number {value!r} into SQL")
        return repr(value)
    if isinstance(value, str | Path):
        return "'" + str(value).replace("'", "''") + "'"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(sql_literal(item) for item in value) + "]"
    raise SQLTemplateError(f"cannot render {type(value).__name__} {value!r} as a SQL literal")


def render_sql(text: str, name: str = "<text>", **params: object) -> str:
    wanted = set(PLACEHOLDER.findall(text))
    missing = sorted(wanted - params.keys())
    unused = sorted(params.keys() - wanted)
    if missing or unused:
        raise SQLTemplateError(
            f"sql/{name}: placeholders and parameters disagree (missing: {missing or 'none'}, "
            f"unknown: {unused or 'none'}); pass exactly the {{{{ name }}}} placeholders the file uses"
        )
    return PLACEHOLDER.sub(lambda match: sql_literal(params[match.group(1)]), text)


def load_sql(name: str, **params: object) -> str:
    """The text of sql/<name>.sql with its placeholders filled in."""
    file = SQL_DIR / (name if name.endswith(".sql") else f"{name}.sql")
    if not file.is_file():
        available = ", ".join(sorted(p.stem for p in SQL_DIR.glob("*.sql"))) or "none"
        raise SQLTemplateError(f"no SQL file {file}; available: {available}")
    return render_sql(file.read_text(), file.name, **params)
