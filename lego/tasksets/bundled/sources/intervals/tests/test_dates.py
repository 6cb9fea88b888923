from datetime import date

import pytest

from intervals import DateRange, month_end


def test_len_and_iteration():
    r = DateRange(date(2024, 1, 30), date(2024, 2, 2))
    assert len(r) == 4
    assert list(r)[-1] == date(2024, 2, 2)


def test_step():
    r = DateRange(date(2024, 1, 1), date(2024, 1, 7))
    assert list(r.days(3)) == [date(2024, 1, 1), date(2024, 1, 4), date(2024, 1, 7)]


def test_parse_and_str():
    r = DateRange.parse("2024-03-01..2024-03-31")
    assert str(r) == "2024-03-01..2024-03-31"
    with pytest.raises(ValueError, match="cannot parse"):
        DateRange.parse("2024-03-01")


def test_end_before_start():
    with pytest.raises(ValueError):
        DateRange(date(2024, 2, 1), date(2024, 1, 1))


def test_overlap_and_intersection():
    a = DateRange(date(2024, 1, 1), date(2024, 1, 10))
    b = DateRange(date(2024, 1, 10), date(2024, 1, 20))
    assert a.overlaps(b)
    assert a.intersection(b) == DateRange(date(2024, 1, 10), date(2024, 1, 10))


def test_month_end():
    assert month_end(date(2024, 2, 10)) == date(2024, 2, 29)
    assert month_end(date(2023, 4, 1)) == date(2023, 4, 30)


def test_split_by_month():
    r = DateRange(date(2024, 1, 15), date(2024, 3, 3))
    assert [str(p) for p in r.split_by_month()] == [
        "2024-01-15..2024-01-31", "2024-02-01..2024-02-29", "2024-03-01..2024-03-03",
    ]


def test_to_interval():
    assert DateRange(date(2024, 1, 1), date(2024, 1, 3)).to_interval().length == 2
