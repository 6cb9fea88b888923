"""JSON read and written by the proxy: orjson where it gives exactly what json gives, json elsewhere.

orjson is several times faster than json, and the proxy reads every request (80 KB for Claude Code), every tool call
the model writes, and writes every answer and streamed event. Where the two differ, json's result is the one kept:
- orjson refuses NaN, Infinity, numbers past a double's range and lone surrogates, which json reads: such a text
  is read again by json;
- orjson reads an integer past 64 bits (below -2**63 or above 2**64 - 1) as a float, silently, where json keeps it
  exact (a tool's `input_schema` bound, a big id in a tool call's input): the model would then see another number
  than the harness sent. So a value orjson read with a float of 2**63 or more in size, which is where such an
  integer lands, is read again by json (a real float that large gets the same value from json);
- orjson refuses to write an integer past 64 bits and a string that is not valid UTF-8: json writes those.
"""

from __future__ import annotations

import json
from typing import Any

try:  # prefect depends on orjson; json alone is exact, only slower
    from orjson import dumps as _orjson_dumps
    from orjson import loads as _orjson_loads
except ImportError:  # pragma: no cover
    _orjson_dumps = _orjson_loads = None

LONG_INTEGER = 2.0 ** 63  # orjson reads an integer past 64 bits as a float at least this large


def loads(data: bytes | str) -> Any:
    """The JSON value of `data`, as `json.loads` gives it (see the module docstring). Raises ValueError when it is
    not JSON."""
    if _orjson_loads is not None:
        try:
            value = _orjson_loads(data)
        except ValueError:  # what orjson refuses and json may read
            pass
        else:
            if not _may_be_long_integer(value):
                return value
    return json.loads(data)


def _may_be_long_integer(value: Any) -> bool:
    """Whether orjson's `value` holds a float as large as an integer past 64 bits: one it may have read from such an
    integer (json keeps those exact). A real float that large is read again by json, to the same value."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
        elif kind is float and not -LONG_INTEGER < item < LONG_INTEGER:
            return True
    return False


def to_json(value: Any) -> bytes:
    """`value` as JSON bytes (orjson's compact form; json's where orjson refuses a value)."""
    if _orjson_dumps is not None:
        try:
            return _orjson_dumps(value)
        except TypeError:  # orjson.JSONEncodeError: an integer past 64 bits, a string that is not valid UTF-8
            pass
    return json.dumps(value).encode()
