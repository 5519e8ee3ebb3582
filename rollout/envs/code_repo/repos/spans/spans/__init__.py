"""spans: times of day, intervals and a day planner."""

from .interval import Interval
from .merge import merge, total_minutes
from .schedule import first_slot, free_slots, parse_day
from .timeparse import format_time, parse_duration, parse_time
from .week import next_weekday, occurrences, weekday_index

__all__ = ["Interval", "merge", "total_minutes", "first_slot", "free_slots", "parse_day", "format_time",
           "parse_duration", "parse_time", "next_weekday", "occurrences", "weekday_index"]
