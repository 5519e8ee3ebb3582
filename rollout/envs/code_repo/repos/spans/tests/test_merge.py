from spans import Interval, merge, total_minutes


def ivs(*pairs):
    return [Interval(a, b) for a, b in pairs]


def test_merge_overlapping():
    assert merge(ivs((540, 600), (570, 660))) == ivs((540, 660))
    assert merge([]) == []


def test_merge_touching():
    assert merge(ivs((540, 600), (600, 660))) == ivs((540, 660))


def test_merge_nested():
    assert merge(ivs((540, 720), (600, 660))) == ivs((540, 720))


def test_merge_unsorted():
    assert merge(ivs((700, 760), (540, 600), (580, 620))) == ivs((540, 620), (700, 760))


def test_total_minutes():
    assert total_minutes(ivs((540, 600), (570, 660), (700, 710))) == 130
