"""An account with a balance, an overdraft limit and a history."""

from .errors import InsufficientFunds, InvalidAmount
from .money import format_amount


class Account:
    """Money in whole cents. The balance may go down to -overdraft, no further."""

    def __init__(self, owner, balance=0, overdraft=0):
        if overdraft < 0:
            raise InvalidAmount(f"the overdraft cannot be negative, got {overdraft}")
        self.owner, self.balance, self.overdraft = owner, balance, overdraft
        self.history = []  # (kind, cents, memo), kind "deposit" or "withdrawal"

    @staticmethod
    def _check(cents):
        if isinstance(cents, bool) or not isinstance(cents, int) or cents <= 0:
            raise InvalidAmount(f"an amount must be a positive whole number of cents, got {cents!r}")

    @property
    def available(self):
        """What can still be withdrawn."""
        return self.balance + self.overdraft

    def can_withdraw(self, cents):
        return self.balance - cents >= -self.overdraft

    def deposit(self, cents, memo=""):
        self._check(cents)
        self.balance += cents
        self.history.append(("deposit", cents, memo))

    def withdraw(self, cents, memo=""):
        self._check(cents)
        if not self.can_withdraw(cents):
            raise InsufficientFunds(f"{self.owner}: cannot withdraw {format_amount(cents)}, only "
                                    f"{format_amount(self.available)} available")
        self.balance -= cents
        self.history.append(("withdrawal", cents, memo))
