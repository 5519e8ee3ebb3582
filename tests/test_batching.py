"""rl/batching.py: the one splitter and the cuts built on it (mini-batches, micro-batches)."""

from rl.batching import micro_batches, minibatches, split_even


def test_split_even_is_exact():
    for n_items in range(0, 40):
        for n in range(1, 9):
            parts = split_even(list(range(n_items)), n)
            assert len(parts) == n and sum(parts, []) == list(range(n_items))
            assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_micro_batches_are_exact():
    for n_items in range(1, 40):
        for n in range(1, 9):
            parts = micro_batches(list(range(n_items)), n)
            assert sum(parts, []) == list(range(n_items))
            assert len(parts) == min(n, n_items) and max(map(len, parts)) - min(map(len, parts)) <= 1


def test_minibatches_are_a_seeded_permutation():
    items = list(range(24))
    a, b = minibatches(items, 3, seed=1, step=4), minibatches(items, 3, seed=1, step=4)
    assert a == b and [len(p) for p in a] == [8, 8, 8] and sorted(sum(a, [])) == items
    assert minibatches(items, 3, seed=1, step=5) != a
