"""Inclusive date ranges: iteration, overlap, and splitting by calendar month."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, timedelta

from intervals.interval import Interval


def month_end(day: date) -> date:
    """The last day of ``day``'s month."""
    first_of_next = date(day.year, day.month + 1, 1)
    return first_of_next - timedelta(days=1)


@dataclass(frozen=True)
class DateRange:
    start: date
    end: date  # inclusive

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"date range ends ({self.end}) before it starts ({self.start})")

    @classmethod
    def parse(cls, text: str) -> DateRange:
        """``"2024-01-01..2024-01-31"``."""
        try:
            first, last = text.split("..")
            return cls(date.fromisoformat(first.strip()), date.fromisoformat(last.strip()))
        except ValueError as exc:
            raise ValueError(f"cannot parse date range {text!r}; expected YYYY-MM-DD..YYYY-MM-DD ({exc})") from None

    def __str__(self) -> str:
        return f"{self.start.isoformat()}..{self.end.isoformat()}"

    def __len__(self) -> int:
        return (self.end - self.start).days + 1

    def __contains__(self, day: date) -> bool:
        return self.start <= day <= self.end

    def __iter__(self) -> Iterator[date]:
        return self.days()

    def days(self, step: int = 1) -> Iterator[date]:
        if step < 1:
            raise ValueError("step must be at least 1 day")
        current = self.start
        while current <= self.end:
            yield current
            current += timedelta(days=step)

    def to_interval(self) -> Interval:
        return Interval.closed(self.start.toordinal(), self.end.toordinal())

    def overlaps(self, other: DateRange) -> bool:
        return self.start <= other.end and other.start <= self.end

    def intersection(self, other: DateRange) -> DateRange | None:
        if not self.overlaps(other):
            return None
        return DateRange(max(self.start, other.start), min(self.end, other.end))

    def split_by_month(self) -> list[DateRange]:
        """One range per calendar month the range touches, clipped to the range."""
        pieces = []
        current = self.start
        while current <= self.end:
            last = min(month_end(current), self.end)
            pieces.append(DateRange(current, last))
            current = last + timedelta(days=1)
        return pieces
