import pytest

from unitconv import REGISTRY, Registry, UnitError, convert
from unitconv.units import LENGTH, combine_dimensions, describe_dimension, make_dimension


def test_length_conversions():
    assert convert(5, "km", "m") == pytest.approx(5000)
    assert convert(12, "in", "ft") == pytest.approx(1)
    assert convert(1, "mi", "km") == pytest.approx(1.609344)


def test_mass_conversions():
    assert convert(1, "lb", "g") == pytest.approx(453.59237)
    assert convert(2500, "mg", "g") == pytest.approx(2.5)


def test_time_conversions():
    assert convert(90, "min", "h") == pytest.approx(1.5)
    assert convert(1, "h", "s") == pytest.approx(3600)


def test_celsius_kelvin():
    assert convert(0, "degC", "K") == pytest.approx(273.15)
    assert convert(300, "K", "degC") == pytest.approx(26.85)


def test_fahrenheit_to_kelvin():
    assert convert(32, "degF", "K") == pytest.approx(273.15)


def test_aliases():
    assert convert(3, "feet", "inch") == pytest.approx(36)
    assert convert(1, "kilometer", "metre") == pytest.approx(1000)


def test_unknown_unit():
    with pytest.raises(UnitError, match="unknown unit 'parsec'"):
        convert(1, "parsec", "m")


def test_incompatible_dimensions():
    with pytest.raises(UnitError, match="cannot convert"):
        convert(1, "kg", "m")


def test_duplicate_definition_rejected():
    reg = Registry()
    reg.define("m", LENGTH, 1.0)
    with pytest.raises(UnitError, match="already defined"):
        reg.define("m", LENGTH, 2.0)


def test_dimensions():
    velocity = combine_dimensions(make_dimension(length=1), make_dimension(time=1), -1)
    assert describe_dimension(velocity) == "length*time^-1"
    assert describe_dimension(()) == "dimensionless"


def test_symbols_listed_once():
    symbols = REGISTRY.symbols()
    assert "m" in symbols and "meter" not in symbols
    assert len(symbols) == len(set(symbols))
