from spans import format_time, parse_duration, parse_time


def raises(fn, *args):
    try:
        fn(*args)
    except ValueError:
        return True
    return False


def test_parse_time():
    assert parse_time("09:30") == 570
    assert parse_time("9:05") == 545
    assert parse_time(" 00:00 ") == 0
    assert parse_time("24:00") == 1440


def test_parse_time_rejects_bad_times():
    for text in ("09:60", "25:00", "24:01", "9.30", "930"):
        assert raises(parse_time, text), text


def test_format_time():
    assert format_time(570) == "09:30"
    assert format_time(545) == "09:05"
    assert format_time(0) == "00:00"
    assert raises(format_time, 2000)


def test_parse_duration():
    assert parse_duration("1h30m") == 90
    assert parse_duration("45m") == 45
    assert parse_duration("2h") == 120
    assert parse_duration("1h 5m") == 65


def test_parse_duration_rejects_garbage():
    for text in ("", "  ", "abc", "5s"):
        assert raises(parse_duration, text), repr(text)
