"""Amounts of money as whole cents."""

import re
from decimal import ROUND_HALF_UP, Decimal

# An optional minus, an optional $, the whole part (with or without thousands commas), up to two decimals.
_AMOUNT = re.compile(r"^(-)?\$?(\d{1,3}(?:,\d{3})*|\d+)(?:\.(\d{1,2}))?$")


def parse_amount(text):
    """'$1,234.5' -> 123450 cents; '-3.05' -> -305."""
    m = _AMOUNT.match(text.strip())
    if not m:
        raise ValueError(f"not an amount: {text!r}")
    sign, whole, frac = m.groups()
    cents = int(whole.replace(",", "")) * 100 + int((frac or "0").ljust(2, "0"))
    return -cents if sign else cents


def format_amount(cents):
    """123450 -> '1,234.50'; -5 -> '-0.05'."""
    sign = "-" if cents < 0 else ""
    whole, frac = divmod(abs(cents), 100)
    return f"{sign}{whole:,}.{frac:02d}"


def split_evenly(cents, parts):
    """`cents` shared among `parts` as evenly as possible; the first shares get the cents left over."""
    if parts < 1:
        raise ValueError("parts must be at least 1")
    base, extra = divmod(cents, parts)
    return [base + 1 if i < extra else base for i in range(parts)]


def percent_of(cents, percent):
    """`percent` % of `cents`, rounded half up to a whole cent: percent_of(250, 10) == 25, percent_of(5, 10) == 1."""
    exact = Decimal(cents) * Decimal(str(percent)) / 100
    return int(exact.quantize(Decimal(1), rounding=ROUND_HALF_UP))
