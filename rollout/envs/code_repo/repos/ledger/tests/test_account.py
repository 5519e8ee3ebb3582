from ledger import Account, InsufficientFunds, InvalidAmount


def test_deposit_and_withdraw():
    acct = Account("ann", 1000)
    acct.deposit(500)
    acct.withdraw(300, "books")
    assert acct.balance == 1200
    assert acct.history == [("deposit", 500, ""), ("withdrawal", 300, "books")]


def test_invalid_amounts():
    acct = Account("ann", 1000)
    for bad in (0, -5, 1.5, True):
        for op in (acct.deposit, acct.withdraw):
            try:
                op(bad)
            except InvalidAmount:
                continue
            raise AssertionError(f"{op.__name__}({bad!r}) should raise InvalidAmount")
    assert acct.balance == 1000 and acct.history == []


def test_overdraft():
    acct = Account("bob", 100, overdraft=500)
    acct.withdraw(600)
    assert acct.balance == -500
    assert acct.available == 0
    try:
        acct.withdraw(1)
    except InsufficientFunds:
        pass
    else:
        raise AssertionError("a withdrawal past the overdraft should raise InsufficientFunds")


def test_insufficient_funds():
    acct = Account("cy", 100)
    try:
        acct.withdraw(101)
    except InsufficientFunds as exc:
        assert "1.01" in str(exc)
    else:
        raise AssertionError("withdraw(101) from 100 should raise InsufficientFunds")
    assert acct.balance == 100 and acct.history == []


def test_negative_overdraft_is_refused():
    try:
        Account("dee", overdraft=-1)
    except InvalidAmount:
        return
    raise AssertionError("a negative overdraft should raise InvalidAmount")
