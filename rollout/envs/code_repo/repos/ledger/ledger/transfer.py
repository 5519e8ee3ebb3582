"""Transfers between accounts."""

from .errors import InsufficientFunds, LedgerError
from .money import format_amount, percent_of

FEE_PERCENT = 1
MIN_FEE = 50  # cents
MAX_FEE = 1000


def transfer_fee(cents, same_owner=False):
    """Free between two accounts of one owner; otherwise 1%, at least 0.50 and at most 10.00."""
    if same_owner:
        return 0
    return min(max(percent_of(cents, FEE_PERCENT), MIN_FEE), MAX_FEE)


def transfer(src, dst, cents, memo="transfer"):
    """Moves `cents` from `src` to `dst` and takes the fee from `src` (memo 'fee'): all of it or, when `src`
    cannot pay amount and fee together, nothing (InsufficientFunds). Returns the fee."""
    if src is dst:
        raise LedgerError("cannot transfer to the same account")
    fee = transfer_fee(cents, same_owner=src.owner == dst.owner)
    if not src.can_withdraw(cents + fee):
        raise InsufficientFunds(f"{src.owner}: cannot transfer {format_amount(cents)} plus a fee of "
                                f"{format_amount(fee)}")
    src.withdraw(cents, memo)
    if fee:
        src.withdraw(fee, "fee")
    dst.deposit(cents, memo)
    return fee
