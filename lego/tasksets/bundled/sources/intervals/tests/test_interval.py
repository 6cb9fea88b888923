import pytest

from intervals import Interval


def test_construction_checks():
    with pytest.raises(ValueError):
        Interval(2, 1)
    with pytest.raises(ValueError):
        Interval.open(1, 1)
    assert Interval.closed(1, 1).length == 0


def test_contains_respects_ends():
    half = Interval.closed_open(0, 1)
    assert 0 in half and 0.5 in half and 1 not in half
    assert 0 not in Interval.open(0, 1)


def test_str():
    assert str(Interval.closed_open(1, 2)) == "[1, 2)"
    assert str(Interval.open_closed(1, 2)) == "(1, 2]"


def test_overlapping():
    assert Interval.closed(0, 5).overlaps(Interval.closed(3, 8))
    assert Interval.closed(3, 8).overlaps(Interval.closed(0, 5))
    assert not Interval.closed(0, 1).overlaps(Interval.closed(2, 3))


def test_half_open_neighbours_do_not_overlap():
    assert not Interval.closed_open(0, 1).overlaps(Interval.closed(1, 2))
    assert Interval.closed_open(0, 1).touches(Interval.closed(1, 2))


def test_intersection():
    assert Interval.closed(0, 5).intersection(Interval.open(3, 8)) == Interval.open_closed(3, 5)
    assert Interval.closed(0, 1).intersection(Interval.closed(2, 3)) is None


def test_merge():
    assert Interval.closed_open(0, 1).merge(Interval.closed(1, 2)) == Interval.closed(0, 2)
    with pytest.raises(ValueError, match="gap"):
        Interval.closed(0, 1).merge(Interval.closed(2, 3))
