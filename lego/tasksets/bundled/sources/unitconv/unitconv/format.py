"""Formatting quantities, optionally rescaled to the SI prefix that keeps the number readable."""

from __future__ import annotations

from unitconv.units import REGISTRY, Registry, UnitError

# Prefixes by power of ten, largest first.
PREFIXES = [(9, "G"), (6, "M"), (3, "k"), (0, ""), (-3, "m"), (-6, "u"), (-9, "n")]


def _prefixed_symbol(prefix: str, symbol: str, registry: Registry) -> str:
    candidate = prefix + symbol
    if prefix == "" or candidate in registry:
        return candidate
    return ""


def choose_prefix(value: float, symbol: str, registry: Registry = REGISTRY) -> tuple[float, str]:
    """Rescale ``value`` (in ``symbol``) to the largest known prefixed unit it is at least 1 of."""
    if value == 0:
        return value, symbol
    magnitude = abs(value)
    for power, prefix in PREFIXES:
        prefixed = _prefixed_symbol(prefix, symbol, registry)
        if prefixed and magnitude >= 10 ** power:
            return value / 10 ** power, prefixed
    return value, symbol


def format_quantity(value: float, unit: str, precision: int = 2, auto_prefix: bool = False,
                    registry: Registry = REGISTRY) -> str:
    """``format_quantity(1500, "m", auto_prefix=True) == "1.5 km"``; trailing zeros are dropped."""
    if precision < 0:
        raise UnitError("precision must be >= 0")
    if auto_prefix:
        value, unit = choose_prefix(value, unit, registry)
    text = f"{value:.{precision}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    if text == "-0":
        text = "0"
    return f"{text} {unit}"
