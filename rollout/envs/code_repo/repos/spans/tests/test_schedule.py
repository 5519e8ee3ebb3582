from spans import Interval, first_slot, free_slots, parse_day


def ivs(*pairs):
    return [Interval(a, b) for a, b in pairs]


def test_free_slots():
    busy = ivs((600, 660), (540, 570))
    assert free_slots(busy, 480, 1020) == ivs((480, 540), (570, 600), (660, 1020))


def test_free_slots_min_length():
    assert free_slots(ivs((540, 600)), 480, 660, min_length=60) == ivs((480, 540), (600, 660))
    assert free_slots(ivs((540, 600)), 480, 660, min_length=61) == []


def test_free_slots_busy_outside_the_day():
    assert free_slots(ivs((300, 500), (1000, 1100)), 480, 1020) == ivs((500, 1000))


def test_first_slot():
    busy = ivs((540, 600), (630, 720))
    assert first_slot(busy, 45, 480, 1020) == Interval(480, 525)
    assert first_slot(busy, 90, 480, 1020) == Interval(720, 810)
    assert first_slot(busy, 400, 480, 1020) is None


def test_parse_day():
    text = "# plan\n09:00-10:00 standup\n\n13:30-14:00 review\n"
    assert parse_day(text) == ivs((540, 600), (810, 840))
