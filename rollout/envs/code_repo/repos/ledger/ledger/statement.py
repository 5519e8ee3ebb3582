"""Statements and interest."""

from decimal import Decimal

from .money import format_amount, percent_of


def totals(account):
    """{'deposits', 'withdrawals', 'fees'} in cents from the account's history (fees are withdrawals whose memo is
    'fee', and are not counted as withdrawals)."""
    out = {"deposits": 0, "withdrawals": 0, "fees": 0}
    for kind, cents, memo in account.history:
        if kind == "deposit":
            out["deposits"] += cents
        elif memo == "fee":
            out["fees"] += cents
        else:
            out["withdrawals"] += cents
    return out


def statement(account, opening=0):
    """One line per history entry (memo, signed amount, running balance from `opening`), then the closing line."""
    lines, balance = [], opening
    for kind, cents, memo in account.history:
        balance += cents if kind == "deposit" else -cents
        sign = "+" if kind == "deposit" else "-"
        lines.append(f"{memo or kind:<12}{sign}{format_amount(cents):>10}{format_amount(balance):>12}")
    lines.append(f"{'closing':<12}{'':>11}{format_amount(balance):>12}")
    return lines


def monthly_interest(balance, annual_percent):
    """One month's interest (annual_percent / 12) on a positive balance, rounded half up; 0 otherwise."""
    if balance <= 0:
        return 0
    return percent_of(balance, Decimal(str(annual_percent)) / 12)
