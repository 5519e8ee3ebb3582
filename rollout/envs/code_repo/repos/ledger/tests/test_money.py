from ledger import format_amount, parse_amount, percent_of, split_evenly


def test_parse_amount():
    assert parse_amount("12.34") == 1234
    assert parse_amount("$5") == 500
    assert parse_amount("0.05") == 5
    assert parse_amount(" 1,234.50 ") == 123450


def test_parse_amount_one_decimal():
    assert parse_amount("1.5") == 150
    assert parse_amount("$0.5") == 50


def test_parse_amount_negative():
    assert parse_amount("-3.05") == -305
    assert parse_amount("-$2") == -200


def test_parse_amount_thousands():
    assert parse_amount("$1,234,567.00") == 123456700
    assert parse_amount("1234567") == 123456700


def test_parse_amount_rejects_garbage():
    for text in ("1,23.00", "abc", "1.234", "", "$"):
        try:
            parse_amount(text)
        except ValueError:
            continue
        raise AssertionError(f"parse_amount({text!r}) should raise ValueError")


def test_format_amount():
    assert format_amount(123450) == "1,234.50"
    assert format_amount(5) == "0.05"
    assert format_amount(100) == "1.00"
    assert format_amount(0) == "0.00"


def test_format_amount_negative():
    assert format_amount(-5) == "-0.05"
    assert format_amount(-123450) == "-1,234.50"


def test_split_evenly():
    assert split_evenly(100, 3) == [34, 33, 33]
    assert split_evenly(10, 5) == [2, 2, 2, 2, 2]
    assert split_evenly(101, 4) == [26, 25, 25, 25]
    assert sum(split_evenly(1000, 7)) == 1000


def test_percent_of():
    assert percent_of(250, 10) == 25
    assert percent_of(5, 10) == 1
    assert percent_of(14, 10) == 1
    assert percent_of(25, 10) == 3
