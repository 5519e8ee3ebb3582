"""The ledger's exceptions."""


class LedgerError(Exception):
    """Something the ledger refuses to do."""


class InvalidAmount(LedgerError, ValueError):
    """An amount that is not a positive whole number of cents."""


class InsufficientFunds(LedgerError):
    """A withdrawal the balance and the overdraft together do not cover."""
