"""Intervals of real numbers with open or closed ends."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Interval:
    start: float
    end: float
    closed_start: bool = True
    closed_end: bool = True

    def __post_init__(self) -> None:
        if self.start > self.end:
            raise ValueError(f"interval start {self.start} is after its end {self.end}")
        if self.start == self.end and not (self.closed_start and self.closed_end):
            raise ValueError(f"an interval from {self.start} to itself must be closed at both ends")

    @classmethod
    def closed(cls, start: float, end: float) -> Interval:
        return cls(start, end, True, True)

    @classmethod
    def open(cls, start: float, end: float) -> Interval:
        return cls(start, end, False, False)

    @classmethod
    def closed_open(cls, start: float, end: float) -> Interval:
        return cls(start, end, True, False)

    @classmethod
    def open_closed(cls, start: float, end: float) -> Interval:
        return cls(start, end, False, True)

    def __str__(self) -> str:
        return f"{'[' if self.closed_start else '('}{self.start}, {self.end}{']' if self.closed_end else ')'}"

    @property
    def length(self) -> float:
        return self.end - self.start

    def __contains__(self, value: float) -> bool:
        after_start = self.start < value or (self.closed_start and value == self.start)
        before_end = value < self.end or (self.closed_end and value == self.end)
        return after_start and before_end

    def overlaps(self, other: Interval) -> bool:
        """True when the two intervals share at least one point."""
        return self.start < other.end and other.start < self.end

    def touches(self, other: Interval) -> bool:
        """True when the intervals do not overlap but leave no gap, like [1, 2) and [2, 3]."""
        first, second = (self, other) if self.start <= other.start else (other, self)
        return first.end == second.start and first.closed_end != second.closed_start

    def intersection(self, other: Interval) -> Interval | None:
        if not self.overlaps(other):
            return None
        if self.start != other.start:
            start_from = self if self.start > other.start else other
            start, closed_start = start_from.start, start_from.closed_start
        else:
            start, closed_start = self.start, self.closed_start and other.closed_start
        if self.end != other.end:
            end_from = self if self.end < other.end else other
            end, closed_end = end_from.end, end_from.closed_end
        else:
            end, closed_end = self.end, self.closed_end and other.closed_end
        return Interval(start, end, closed_start, closed_end)

    def merge(self, other: Interval) -> Interval:
        """The union of two overlapping or touching intervals."""
        if not (self.overlaps(other) or self.touches(other)):
            raise ValueError(f"cannot merge {self} and {other}: there is a gap between them")
        if self.start != other.start:
            start_from = self if self.start < other.start else other
            start, closed_start = start_from.start, start_from.closed_start
        else:
            start, closed_start = self.start, self.closed_start or other.closed_start
        if self.end != other.end:
            end_from = self if self.end > other.end else other
            end, closed_end = end_from.end, end_from.closed_end
        else:
            end, closed_end = self.end, self.closed_end or other.closed_end
        return Interval(start, end, closed_start, closed_end)

    def gap(self, other: Interval) -> Interval | None:
        """The interval between this one and a later one that does not overlap it; None if none."""
        if other.start <= self.end:
            return None
        return Interval(self.end, other.start)
