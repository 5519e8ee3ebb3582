from ledger import Account, monthly_interest, statement, totals, transfer


def test_totals():
    ann, bob = Account("ann"), Account("bob")
    ann.deposit(5000, "salary")
    ann.withdraw(1000, "rent")
    transfer(ann, bob, 2000)
    assert totals(ann) == {"deposits": 5000, "withdrawals": 3000, "fees": 50}
    assert totals(bob) == {"deposits": 2000, "withdrawals": 0, "fees": 0}


def test_statement_lines():
    acct = Account("ann")
    acct.deposit(1050, "salary")
    acct.withdraw(300, "coffee")
    assert statement(acct) == [
        "salary      +     10.50       10.50",
        "coffee      -      3.00        7.50",
        "closing                        7.50",
    ]


def test_statement_opening_balance():
    acct = Account("ann", 10000)
    acct.deposit(1050, "salary")
    acct.withdraw(300, "coffee")
    assert statement(acct, opening=10000)[-1].endswith("107.50")


def test_monthly_interest():
    assert monthly_interest(120000, 6) == 600
    assert monthly_interest(1000, 6) == 5
    assert monthly_interest(100, 3) == 0
    assert monthly_interest(-500, 6) == 0
    assert monthly_interest(0, 6) == 0
