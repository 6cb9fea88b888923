"""intervals: real intervals with open/closed ends, interval sets, and date ranges."""

from intervals.dates import DateRange as DateRange, month_end as month_end
from intervals.interval import Interval as Interval
from intervals.intervalset import IntervalSet as IntervalSet

__version__ = "0.3.0"
