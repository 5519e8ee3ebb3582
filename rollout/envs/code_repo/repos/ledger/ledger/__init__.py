"""ledger: bank accounts in whole cents."""

from .account import Account
from .errors import InsufficientFunds, InvalidAmount, LedgerError
from .money import format_amount, parse_amount, percent_of, split_evenly
from .statement import monthly_interest, statement, totals
from .transfer import transfer, transfer_fee

__all__ = ["Account", "InsufficientFunds", "InvalidAmount", "LedgerError", "format_amount", "parse_amount",
           "percent_of", "split_evenly", "monthly_interest", "statement", "totals", "transfer", "transfer_fee"]
