import pytest

from unitconv import Quantity, UnitError, format_quantity, parse_quantity


def test_parse_simple():
    assert parse_quantity("5 km") == Quantity(5.0, "km")
    assert parse_quantity("2.5kg") == Quantity(2.5, "kg")


def test_parse_compound():
    assert parse_quantity("36 km/h").to("m/s").value == pytest.approx(10)


def test_parse_rejects_garbage():
    with pytest.raises(UnitError, match="cannot parse"):
        parse_quantity("five km")
    with pytest.raises(UnitError, match="unknown unit"):
        parse_quantity("5 furlongs")


def test_arithmetic():
    total = Quantity(1, "km") + Quantity(500, "m")
    assert total.unit == "km" and total.value == pytest.approx(1.5)
    assert (Quantity(2, "h") - Quantity(30, "min")).value == pytest.approx(1.5)
    assert (3 * Quantity(2, "kg")).value == 6


def test_format_plain():
    assert format_quantity(2.5, "kg") == "2.5 kg"
    assert format_quantity(3.0, "m") == "3 m"
    assert format_quantity(1 / 3, "h", precision=3) == "0.333 h"


def test_format_auto_prefix():
    assert format_quantity(1500, "m", auto_prefix=True) == "1.5 km"
    assert format_quantity(0.002, "g", auto_prefix=True) == "2 mg"
    assert format_quantity(0, "m", auto_prefix=True) == "0 m"


def test_format_negative_precision():
    with pytest.raises(UnitError):
        format_quantity(1, "m", precision=-1)
