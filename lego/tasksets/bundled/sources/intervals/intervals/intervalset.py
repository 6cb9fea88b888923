"""A set of real numbers kept as sorted, disjoint intervals."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from intervals.interval import Interval


def _sort_key(interval: Interval) -> tuple:
    return (interval.start, not interval.closed_start)


class IntervalSet:
    def __init__(self, intervals: Iterable[Interval] = ()) -> None:
        self._items: list[Interval] = []
        for interval in intervals:
            self.add(interval)

    def add(self, interval: Interval) -> None:
        """Add an interval, merging it with the intervals it overlaps or touches."""
        for index, existing in enumerate(self._items):
            if existing.overlaps(interval) or existing.touches(interval):
                self._items[index] = existing.merge(interval)
                return
        self._items.append(interval)
        self._items.sort(key=_sort_key)

    def __iter__(self) -> Iterator[Interval]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, value: float) -> bool:
        return any(value in interval for interval in self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IntervalSet) and self._items == other._items

    def __repr__(self) -> str:
        return "IntervalSet(" + ", ".join(str(i) for i in self._items) + ")"

    @property
    def total_length(self) -> float:
        return sum(interval.length for interval in self._items)

    def union(self, other: IntervalSet) -> IntervalSet:
        return IntervalSet([*self._items, *other._items])

    def complement(self, within: Interval) -> IntervalSet:
        """The points of ``within`` that are in none of the intervals."""
        result = IntervalSet()
        cursor = within.start
        for item in self._items:
            clipped = item.intersection(within)
            if clipped is None:
                continue
            if clipped.start > cursor:
                result.add(Interval(cursor, clipped.start))
            cursor = max(cursor, clipped.end)
        if cursor < within.end:
            result.add(Interval(cursor, within.end))
        return result
