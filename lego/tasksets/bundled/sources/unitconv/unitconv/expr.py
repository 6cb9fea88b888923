"""Compound unit expressions: ``km/h``, ``kg*m/s^2``, ``m/s/s``.

A factor preceded by ``/`` is in the denominator, one preceded by ``*`` (or the first one) in the
numerator. ``^n`` raises a factor to an integer power, which may be negative.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from unitconv.units import REGISTRY, Dimension, Registry, UnitError, combine_dimensions

_FACTOR = re.compile(r"^([A-Za-z]+)(?:\^(-?\d+))?$")


@dataclass(frozen=True)
class CompoundUnit:
    expression: str
    dimension: Dimension
    scale: float
    offset: float = 0.0

    def to_base(self, value: float) -> float:
        return value * self.scale + self.offset

    def from_base(self, value: float) -> float:
        return value / self.scale - self.offset


def _tokens(expression: str) -> list[tuple[str, str]]:
    """Split ``a*b/c`` into [("*", "a"), ("*", "b"), ("/", "c")]."""
    text = expression.replace(" ", "")
    if not text:
        raise UnitError("empty unit expression")
    parts = re.split(r"([*/])", text)
    tokens = [("*", parts[0])]
    for op, factor in zip(parts[1::2], parts[2::2]):
        tokens.append((op, factor))
    for _, factor in tokens:
        if not factor:
            raise UnitError(f"malformed unit expression {expression!r}")
    return tokens


def parse_unit(expression: str, registry: Registry = REGISTRY) -> CompoundUnit:
    if expression in registry:
        unit = registry.get(expression)
        return CompoundUnit(expression, unit.dimension, unit.scale, unit.offset)
    dimension: Dimension = ()
    scale = 1.0
    sign = 1
    for op, factor in _tokens(expression):
        match = _FACTOR.match(factor)
        if match is None:
            raise UnitError(f"malformed unit factor {factor!r} in {expression!r}")
        unit = registry.get(match.group(1))
        if unit.is_affine:
            raise UnitError(f"{unit.symbol} has an offset and cannot appear in a compound unit")
        power = int(match.group(2) or 1)
        if op == "/":
            sign = -sign
        exponent = sign * power
        for _ in range(abs(exponent)):
            dimension = combine_dimensions(dimension, unit.dimension, 1 if exponent > 0 else -1)
        scale *= unit.scale ** exponent
    return CompoundUnit(expression, dimension, scale)
