from intervals import Interval, IntervalSet


def test_disjoint_intervals_stay_sorted():
    s = IntervalSet([Interval.closed(5, 6), Interval.closed(1, 2)])
    assert list(s) == [Interval.closed(1, 2), Interval.closed(5, 6)]


def test_overlapping_intervals_merge():
    s = IntervalSet([Interval.closed(1, 3), Interval.closed(2, 5)])
    assert list(s) == [Interval.closed(1, 5)]


def test_touching_intervals_merge():
    s = IntervalSet([Interval.closed_open(0, 1), Interval.closed(1, 2)])
    assert list(s) == [Interval.closed(0, 2)]


def test_membership_and_length():
    s = IntervalSet([Interval.closed(0, 1), Interval.open(3, 5)])
    assert 0.5 in s and 4 in s
    assert 2 not in s and 3 not in s
    assert s.total_length == 3


def test_union():
    a = IntervalSet([Interval.closed(0, 1)])
    b = IntervalSet([Interval.closed(5, 6)])
    assert len(a.union(b)) == 2


def test_complement_of_empty_set():
    assert list(IntervalSet().complement(Interval.closed(0, 1))) == [Interval.closed(0, 1)]


def test_complement_middle_gap_contents():
    comp = IntervalSet([Interval.closed(0, 1), Interval.closed(4, 5)]).complement(Interval.closed(0, 5))
    assert 2 in comp and 3 in comp
    assert 0.5 not in comp and 4.5 not in comp
