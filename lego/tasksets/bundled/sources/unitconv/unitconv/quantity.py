"""Quantities: a value with a unit, conversion between compatible units, and parsing from text."""

from __future__ import annotations

import re
from dataclasses import dataclass

from unitconv.expr import parse_unit
from unitconv.units import REGISTRY, Registry, UnitError, describe_dimension

_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z][A-Za-z0-9^*/ ]*?)\s*$")


def convert(value: float, source: str, target: str, registry: Registry = REGISTRY) -> float:
    """Convert ``value`` from the ``source`` unit expression to ``target``."""
    src = parse_unit(source, registry)
    dst = parse_unit(target, registry)
    if src.dimension != dst.dimension:
        raise UnitError(
            f"cannot convert {source} ({describe_dimension(src.dimension)}) "
            f"to {target} ({describe_dimension(dst.dimension)})"
        )
    return dst.from_base(src.to_base(value))


@dataclass(frozen=True)
class Quantity:
    value: float
    unit: str

    def to(self, target: str, registry: Registry = REGISTRY) -> Quantity:
        return Quantity(convert(self.value, self.unit, target, registry), target)

    def __add__(self, other: Quantity) -> Quantity:
        if not isinstance(other, Quantity):
            return NotImplemented
        return Quantity(self.value + other.to(self.unit).value, self.unit)

    def __sub__(self, other: Quantity) -> Quantity:
        if not isinstance(other, Quantity):
            return NotImplemented
        return Quantity(self.value - other.to(self.unit).value, self.unit)

    def __mul__(self, factor: float) -> Quantity:
        return Quantity(self.value * factor, self.unit)

    __rmul__ = __mul__


def parse_quantity(text: str, registry: Registry = REGISTRY) -> Quantity:
    """Parse ``"5 km"``, ``"2.5kg"`` or ``"36 km/h"`` into a Quantity."""
    match = _QUANTITY.match(text)
    if match is None:
        raise UnitError(f"cannot parse quantity {text!r}; expected a number followed by a unit")
    value, unit = match.groups()
    parse_unit(unit, registry)  # fail early on unknown units
    return Quantity(float(value), unit)
