"""JSON read and written by the proxy: orjson where it gives exactly what json gives, json elsewhere.

orjson is several times faster than json, and the proxy reads every request (80 KB for Claude Code), every tool call
the model writes, and writes every answer and streamed event. Where the two differ, json's result is the one kept:
- orjson refuses NaN, Infinity, numbers past a double's range and lone surrogates, which json reads: such a text
  is read again by json;
- orjson reads an integer past 64 bits (from 19 digits on, for a negative one) as a float, silently, where json
  keeps it exact (a tool's `input_schema` bound, a big id in a tool call's input): the model would then see another
  number than the harness sent. So a text with a run of 19 digits or more, where only such an integer can be, is
  read by json alone (a run inside a string, a hash, costs only json's slower read);
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

LONG_INTEGER_DIGITS = 19  # orjson reads an integer this long or longer as a float when it is past 64 bits
_DIGITS_TO_ZERO = bytes.maketrans(b"0123456789", bytes(10))
_LONG_RUN = bytes(LONG_INTEGER_DIGITS)


def loads(data: bytes | str) -> Any:
    """The JSON value of `data`, as `json.loads` gives it (see the module docstring). Raises ValueError when it is
    not JSON."""
    if _orjson_loads is not None:
        raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
        if _LONG_RUN not in raw.translate(_DIGITS_TO_ZERO):
            try:
                return _orjson_loads(raw)
            except ValueError:  # what orjson refuses and json may read
                pass
    return json.loads(data)


def to_json(value: Any) -> bytes:
    """`value` as JSON bytes (orjson's compact form; json's where orjson refuses a value)."""
    if _orjson_dumps is not None:
        try:
            return _orjson_dumps(value)
        except TypeError:  # orjson.JSONEncodeError: an integer past 64 bits, a string that is not valid UTF-8
            pass
    return json.dumps(value).encode()
