import datetime as dt

from spans import next_weekday, occurrences, weekday_index

WEDNESDAY = dt.date(2024, 5, 1)


def test_weekday_index():
    assert weekday_index("Monday") == 0
    assert weekday_index("sun") == 6
    assert weekday_index("FRI") == 4
    try:
        weekday_index("funday")
    except ValueError:
        pass
    else:
        raise AssertionError("weekday_index('funday') should raise ValueError")


def test_next_weekday():
    assert next_weekday(WEDNESDAY, "fri") == dt.date(2024, 5, 3)
    assert next_weekday(WEDNESDAY, "wed") == dt.date(2024, 5, 8)
    assert next_weekday(WEDNESDAY, "mon") == dt.date(2024, 5, 6)


def test_occurrences():
    assert occurrences(WEDNESDAY, "Friday", 3) == [dt.date(2024, 5, 3), dt.date(2024, 5, 10), dt.date(2024, 5, 17)]
    assert occurrences(WEDNESDAY, "wednesday", 2) == [dt.date(2024, 5, 1), dt.date(2024, 5, 8)]
