"""Half-open intervals of minutes."""

from .timeparse import format_time, parse_time


class Interval:
    """The minutes [start, end): `start` belongs to it, `end` does not."""

    __slots__ = ("start", "end")

    def __init__(self, start, end):
        if end < start:
            raise ValueError(f"an interval cannot end ({end}) before it starts ({start})")
        self.start, self.end = start, end

    @classmethod
    def parse(cls, text):
        """'09:00-10:30' -> Interval(540, 630)."""
        left, sep, right = text.partition("-")
        if not sep:
            raise ValueError(f"not an interval (expected HH:MM-HH:MM): {text!r}")
        return cls(parse_time(left), parse_time(right))

    @property
    def length(self):
        return self.end - self.start

    def contains(self, minute):
        return self.start <= minute < self.end

    def overlaps(self, other):
        """True when the two share at least one minute (touching intervals do not overlap)."""
        return self.start < other.end and other.start < self.end

    def intersection(self, other):
        """The shared part, or None when they do not overlap."""
        start, end = max(self.start, other.start), min(self.end, other.end)
        return Interval(start, end) if start < end else None

    def __eq__(self, other):
        return isinstance(other, Interval) and (self.start, self.end) == (other.start, other.end)

    def __hash__(self):
        return hash((self.start, self.end))

    def __repr__(self):
        return f"Interval({format_time(self.start)}-{format_time(self.end)})"
