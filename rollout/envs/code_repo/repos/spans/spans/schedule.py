"""A day planner: free time between busy intervals."""

from .interval import Interval
from .merge import merge


def free_slots(busy, day_start, day_end, min_length=1):
    """The gaps of at least `min_length` minutes inside [day_start, day_end) that no busy interval covers."""
    slots, cursor = [], day_start
    for iv in merge(busy):
        if iv.end <= cursor:
            continue
        if iv.start >= day_end:
            break
        if iv.start - cursor >= min_length:
            slots.append(Interval(cursor, iv.start))
        cursor = max(cursor, iv.end)
    if day_end - cursor >= min_length:
        slots.append(Interval(cursor, day_end))
    return slots


def first_slot(busy, duration, day_start, day_end):
    """The earliest free interval of exactly `duration` minutes, or None."""
    for slot in free_slots(busy, day_start, day_end, duration):
        return Interval(slot.start, slot.start + duration)
    return None


def parse_day(text):
    """Busy intervals from lines like '09:00-10:30 standup'; blank lines and '#' comments are skipped."""
    busy = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        busy.append(Interval.parse(line.split()[0]))
    return busy
