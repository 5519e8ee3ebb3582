"""Weekdays and weekly repetition."""

import datetime as dt

WEEKDAYS = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]


def weekday_index(name):
    """'Monday', 'mon' or 'MON' -> 0; 'sunday' -> 6."""
    key = name.strip()[:3].lower()
    if key not in WEEKDAYS:
        raise ValueError(f"not a weekday: {name!r}")
    return WEEKDAYS.index(key)


def next_weekday(date, weekday):
    """The first date strictly after `date` that falls on `weekday`."""
    days = (weekday_index(weekday) - date.weekday()) % 7 or 7
    return date + dt.timedelta(days=days)


def occurrences(start, weekday, count):
    """The first `count` dates on `weekday` from `start` on (`start` itself when it falls on that day)."""
    if start.weekday() == weekday_index(weekday):
        first = start
    else:
        first = next_weekday(start, weekday)
    return [first + dt.timedelta(weeks=k) for k in range(count)]
