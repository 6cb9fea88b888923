"""unitconv: convert, parse and format physical quantities."""

from unitconv.expr import CompoundUnit, parse_unit
from unitconv.format import choose_prefix, format_quantity
from unitconv.quantity import Quantity, convert, parse_quantity
from unitconv.units import REGISTRY, Registry, Unit, UnitError, default_registry

__all__ = [
    "CompoundUnit", "Quantity", "REGISTRY", "Registry", "Unit", "UnitError", "choose_prefix",
    "convert", "default_registry", "format_quantity", "parse_quantity", "parse_unit",
]
__version__ = "0.1.0"
