from spans import Interval


def test_interval_parse():
    assert Interval.parse("09:00-10:30") == Interval(540, 630)
    assert Interval.parse("9:00-9:45").length == 45
    try:
        Interval.parse("0900")
    except ValueError:
        pass
    else:
        raise AssertionError("Interval.parse('0900') should raise ValueError")


def test_interval_validation():
    try:
        Interval(10, 5)
    except ValueError:
        pass
    else:
        raise AssertionError("Interval(10, 5) should raise ValueError")
    assert Interval(5, 5).length == 0


def test_contains():
    iv = Interval(540, 600)
    assert iv.contains(540)
    assert iv.contains(599)
    assert not iv.contains(600)
    assert not iv.contains(539)


def test_overlaps():
    iv = Interval(540, 600)
    assert iv.overlaps(Interval(570, 660))
    assert Interval(570, 660).overlaps(iv)
    assert not iv.overlaps(Interval(600, 660))
    assert not Interval(600, 660).overlaps(iv)
    assert not iv.overlaps(Interval(300, 400))


def test_intersection():
    assert Interval(540, 600).intersection(Interval(570, 660)) == Interval(570, 600)
    assert Interval(540, 600).intersection(Interval(600, 660)) is None
    assert Interval(540, 600).intersection(Interval(0, 10)) is None


def test_repr():
    assert repr(Interval(545, 600)) == "Interval(09:05-10:00)"
