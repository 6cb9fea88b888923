"""The proxy reads JSON as json reads it, with orjson where the two agree (lego/proxy/jsonio.py)."""

from __future__ import annotations

import json
import math
import random

import pytest

from lego.proxy.jsonio import loads, to_json


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_values_are_read_as_json_reads_them():
    """Integers past 64 bits (which orjson turns into floats), NaN and huge exponents (which orjson refuses), lone
    surrogates, duplicate keys and ordinary documents: the same value and type as json.loads, from bytes and str."""
    texts = ['{"id": 1234567890123456789012345, "n": -9223372036854775809, "ok": 9223372036854775807}',
             '[18446744073709551616, 18446744073709551615, -18446744073709551616]', "-9223372036854775809",
             '{"a": [{"b": -9223372036854775809}]}', "9223372036854775808.0",
             '{"x": NaN, "y": Infinity, "z": -Infinity, "big": 1e400}',
             '"\\ud800 lone"', '{"a": 1, "a": 2}', '{"name": "bash", "arguments": {"command": "ls", "n": 1.5}}',
             '{"text": "a 1234567890123456789012345 in a string", "n": 3}', "[]", "0", '"x"']
    rng = random.Random(3)
    for _ in range(300):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 30)))
        texts.append(f'{{"v": {rng.choice(["", "-"])}{digits.lstrip("0") or "0"}, "f": {rng.random()}}}')
    for text in texts:
        expected = json.loads(text)
        for data in (text, text.encode("utf-8", "surrogatepass")):
            assert _same(loads(data), expected), text
    for bad in ("", "{", '{"a": }', "[1,]", "nul"):
        with pytest.raises(ValueError):
            loads(bad)


def test_what_orjson_cannot_write_is_written_by_json():
    assert json.loads(to_json({"id": 2 ** 70, "s": "é"})) == {"id": 2 ** 70, "s": "é"}
    assert json.loads(to_json({"n": 1, "t": [True, None]})) == {"n": 1, "t": [True, None]}
