"""Times of day as minutes after midnight, and durations."""

import re

_TIME = re.compile(r"^(\d{1,2}):(\d{2})$")
_DURATION = re.compile(r"^(?:(\d+)h)?\s*(?:(\d+)m)?$")


def parse_time(text):
    """'09:30' -> 570. Hours 0-24 ('24:00' is the end of the day), minutes 0-59; one-digit hours are fine."""
    m = _TIME.match(text.strip())
    if not m:
        raise ValueError(f"not a time: {text!r}")
    hours, minutes = int(m.group(1)), int(m.group(2))
    if hours > 24 or minutes > 59 or (hours == 24 and minutes):
        raise ValueError(f"not a time of day: {text!r}")
    return hours * 60 + minutes


def format_time(minutes):
    """570 -> '09:30'."""
    if not 0 <= minutes <= 24 * 60:
        raise ValueError(f"not a time of day: {minutes} minutes")
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def parse_duration(text):
    """'1h30m' -> 90, '45m' -> 45, '2h' -> 120."""
    m = _DURATION.match(text.strip())
    if not m or not (m.group(1) or m.group(2)):
        raise ValueError(f"not a duration: {text!r}")
    return int(m.group(1) or 0) * 60 + int(m.group(2) or 0)
