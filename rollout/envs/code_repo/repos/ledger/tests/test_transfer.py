from ledger import Account, InsufficientFunds, LedgerError, transfer, transfer_fee


def test_transfer_fee():
    assert transfer_fee(10000) == 100
    assert transfer_fee(1000) == 50
    assert transfer_fee(500000) == 1000
    assert transfer_fee(500000, same_owner=True) == 0


def test_transfer_moves_money_and_fee():
    ann, bob = Account("ann", 20000), Account("bob")
    assert transfer(ann, bob, 10000) == 100
    assert ann.balance == 9900 and bob.balance == 10000
    assert ann.history == [("withdrawal", 10000, "transfer"), ("withdrawal", 100, "fee")]
    assert bob.history == [("deposit", 10000, "transfer")]


def test_transfer_between_own_accounts_is_free():
    checking, savings = Account("ann", 1000), Account("ann")
    assert transfer(checking, savings, 1000) == 0
    assert checking.balance == 0 and savings.balance == 1000


def test_transfer_is_all_or_nothing():
    ann, bob = Account("ann", 10000), Account("bob")
    try:
        transfer(ann, bob, 10000)  # the fee (1.00) is not covered
    except InsufficientFunds:
        pass
    else:
        raise AssertionError("the transfer should raise InsufficientFunds")
    assert ann.balance == 10000 and bob.balance == 0
    assert ann.history == [] and bob.history == []


def test_transfer_to_itself_is_refused():
    ann = Account("ann", 1000)
    try:
        transfer(ann, ann, 10)
    except LedgerError:
        return
    raise AssertionError("a transfer to the same account should raise LedgerError")
