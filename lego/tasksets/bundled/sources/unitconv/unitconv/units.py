"""The unit registry.

Every unit belongs to a dimension (a mapping of base dimensions to exponents) and converts to the
base unit of that dimension with ``base = value * scale + offset``. Only temperatures have an offset.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class UnitError(ValueError):
    """An unknown unit, or a conversion between incompatible dimensions."""


Dimension = tuple  # sorted tuple of (base dimension, exponent) pairs


def make_dimension(**exponents: int) -> Dimension:
    return tuple(sorted((name, exp) for name, exp in exponents.items() if exp != 0))


def combine_dimensions(left: Dimension, right: Dimension, sign: int = 1) -> Dimension:
    exponents = dict(left)
    for name, exp in right:
        exponents[name] = exponents.get(name, 0) + sign * exp
    return make_dimension(**exponents)


def describe_dimension(dimension: Dimension) -> str:
    if not dimension:
        return "dimensionless"
    return "*".join(name if exp == 1 else f"{name}^{exp}" for name, exp in dimension)


@dataclass(frozen=True)
class Unit:
    symbol: str
    dimension: Dimension
    scale: float
    offset: float = 0.0
    aliases: tuple = field(default=())

    @property
    def is_affine(self) -> bool:
        return self.offset != 0.0

    def to_base(self, value: float) -> float:
        return value * self.scale + self.offset

    def from_base(self, value: float) -> float:
        return (value - self.offset) / self.scale


LENGTH = make_dimension(length=1)
MASS = make_dimension(mass=1)
TIME = make_dimension(time=1)
TEMPERATURE = make_dimension(temperature=1)
VOLUME = make_dimension(length=3)


class Registry:
    def __init__(self) -> None:
        self._units: dict[str, Unit] = {}

    def define(self, symbol: str, dimension: Dimension, scale: float, offset: float = 0.0,
               aliases: tuple = ()) -> Unit:
        unit = Unit(symbol, dimension, scale, offset, tuple(aliases))
        for name in (symbol, *aliases):
            if name in self._units:
                raise UnitError(f"unit {name!r} is already defined")
            self._units[name] = unit
        return unit

    def get(self, name: str) -> Unit:
        try:
            return self._units[name]
        except KeyError:
            raise UnitError(f"unknown unit {name!r}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._units

    def symbols(self) -> list[str]:
        return sorted({unit.symbol for unit in self._units.values()})


def default_registry() -> Registry:
    reg = Registry()
    reg.define("m", LENGTH, 1.0, aliases=("meter", "metre"))
    reg.define("km", LENGTH, 1000.0, aliases=("kilometer",))
    reg.define("cm", LENGTH, 0.01)
    reg.define("mm", LENGTH, 0.001)
    reg.define("in", LENGTH, 0.0254, aliases=("inch",))
    reg.define("ft", LENGTH, 0.3048, aliases=("foot", "feet"))
    reg.define("mi", LENGTH, 1609.344, aliases=("mile",))
    reg.define("kg", MASS, 1.0, aliases=("kilogram",))
    reg.define("g", MASS, 0.001, aliases=("gram",))
    reg.define("mg", MASS, 1e-6)
    reg.define("lb", MASS, 0.45359237, aliases=("pound",))
    reg.define("s", TIME, 1.0, aliases=("sec", "second"))
    reg.define("ms", TIME, 0.001)
    reg.define("min", TIME, 60.0, aliases=("minute",))
    reg.define("h", TIME, 3600.0, aliases=("hour",))
    reg.define("K", TEMPERATURE, 1.0, aliases=("kelvin",))
    reg.define("degC", TEMPERATURE, 1.0, 273.15, aliases=("celsius",))
    reg.define("degF", TEMPERATURE, 5.0 / 9.0, 459.67 * 5.0 / 9.0, aliases=("fahrenheit",))
    reg.define("L", VOLUME, 0.001, aliases=("liter", "litre"))
    reg.define("mL", VOLUME, 1e-6)
    return reg


REGISTRY = default_registry()
