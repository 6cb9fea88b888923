import pytest

from unitconv import UnitError, convert, parse_unit
from unitconv.units import make_dimension


def test_speed():
    assert convert(36, "km/h", "m/s") == pytest.approx(10)


def test_force_dimension():
    unit = parse_unit("kg*m/s^2")
    assert unit.dimension == make_dimension(mass=1, length=1, time=-2)
    assert unit.scale == pytest.approx(1)


def test_area_and_volume():
    assert convert(1, "m^2", "cm^2") == pytest.approx(10_000)
    assert convert(1, "L", "cm^3") == pytest.approx(1000)


def test_negative_exponent():
    assert parse_unit("m*s^-1").dimension == make_dimension(length=1, time=-1)


def test_offset_units_not_allowed_in_compounds():
    with pytest.raises(UnitError, match="offset"):
        parse_unit("degC/s")


def test_malformed_expressions():
    for text in ["", "m//s", "m/", "3m"]:
        with pytest.raises(UnitError):
            parse_unit(text)
