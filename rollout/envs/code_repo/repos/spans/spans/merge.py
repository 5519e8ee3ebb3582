"""Joining intervals."""

from .interval import Interval


def merge(intervals):
    """The intervals sorted, with overlapping or touching ones joined into one."""
    out = []
    for iv in sorted(intervals, key=lambda i: (i.start, i.end)):
        if out and iv.start <= out[-1].end:
            out[-1] = Interval(out[-1].start, max(out[-1].end, iv.end))
        else:
            out.append(Interval(iv.start, iv.end))
    return out


def total_minutes(intervals):
    """Minutes covered by at least one of the intervals."""
    return sum(iv.length for iv in merge(intervals))
