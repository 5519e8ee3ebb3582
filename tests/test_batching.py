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


def test_micro_batch_count_is_the_fewest_under_the_token_budget():
    """trainer.micro_batch_size=auto cuts a step into the fewest micro-batches (as micro_batches cuts them) whose
    largest runs over at most the budget's positions, padded or packed; a sample over the budget runs alone."""
    import itertools

    from rl.batching import micro_batch_count
    from rl.memory import micro_batch_tokens
    from rl.trajectory import Trajectory

    lengths = [3, 40, 7, 7, 19, 64, 5, 33, 12, 12, 90, 1]
    trajs = [Trajectory(uid=str(i), group_id="g", domain="d", prompt_ids=[1] * 4, response_ids=[2] * n,
                        inference_logprobs=[0.0] * n)
             for i, n in enumerate(lengths)]
    for layout, budget in itertools.product(["padded", "packed"], [50, 94, 200, 400, 10**6]):
        n = micro_batch_count(trajs, budget, layout)
        fits = lambda k: max(micro_batch_tokens(p, layout == "packed") for p in micro_batches(trajs, k, layout)) <= budget  # noqa: E731
        assert (fits(n) or n == len(trajs)) and (n == 1 or not fits(n - 1)), (layout, budget, n)
    assert micro_batch_count(trajs, 10**6, "padded") == 1
    # packed within a budget: as few micro-batches as the tokens fill, where near-equal totals would need one more
    tight = [Trajectory(uid=str(i), group_id="g", domain="d", prompt_ids=[1], response_ids=[2] * (n - 1),
                        inference_logprobs=[0.0] * (n - 1)) for i, n in enumerate([6, 4, 4, 3, 3])]
    balanced = micro_batches(tight, 2, "packed")  # longest first onto the lightest: 9 and 11 tokens
    assert max(micro_batch_tokens(p, True) for p in balanced) == 11
    filled = micro_batches(tight, 2, "packed", max_tokens=10)
    assert sorted(micro_batch_tokens(p, True) for p in filled) == [10, 10]
    assert sorted(t.uid for p in filled for t in p) == [t.uid for t in tight]
    assert micro_batch_count(tight, 10, "packed") == 2
    from rl.batching import _best_fit

    assert _best_fit([0, 1], [5, 5], 2, 10) == [[0], [1]]  # as many micro-batches as asked, none left empty
    assert micro_batch_count(trajs, 10, "padded") == len(trajs)  # nothing fits: one sample per micro-batch


def test_fill_rows_keeps_what_the_trainers_packing_fits_into_the_rows():
    """algorithm.step_tokens: the conversations `fill_rows` keeps always pack, by `micro_batches`' own rule and in
    any order, into the asked rows of the budget (so the step runs exactly that many micro-batches); it leaves out
    only what fits no row, and fills the rows nearly full on lengths like SFT data's."""
    import numpy as np

    from rl.batching import fill_rows, micro_batch_count
    from rl.memory import micro_batch_tokens
    from rl.trajectory import Trajectory

    rng = np.random.default_rng(0)
    fills = []
    for trial in range(200):
        rows, cap = int(rng.integers(1, 7)), int(rng.choice([64, 512, 4096]))
        sizes = [int(x) for x in rng.integers(2, cap + 1, size=int(rng.integers(1, 60)))]
        if trial % 2:  # SFT-like: many conversations a fraction of a row long, a step's worth and one more
            sizes = []
            while sum(sizes) < rows * cap:
                sizes.append(int(rng.integers(max(2, cap // 30), cap // 8 + 3)))
        kept = fill_rows(sizes, rows, cap)
        assert kept == sorted(set(kept)) and all(0 <= i < len(sizes) for i in kept)
        trajs = [Trajectory(uid=str(i), group_id="g", domain="d", prompt_ids=[1], response_ids=[2] * (sizes[i] - 1),
                            inference_logprobs=None) for i in kept]
        for order in (trajs, [trajs[i] for i in rng.permutation(len(trajs))]):
            parts = micro_batches(order, rows, "packed", max_tokens=cap)
            assert max(micro_batch_tokens(p, True) for p in parts) <= cap, (trial, sizes)
            assert micro_batch_count(order, cap, "packed") <= rows
        room = rows * cap - sum(sizes[i] for i in kept)
        if sum(sizes) <= cap:  # everything fits one row: nothing waits
            assert kept == list(range(len(sizes)))
        if trial % 2:
            fills.append(1 - room / (rows * cap))
    assert min(fills) > 0.85 and np.mean(fills) > 0.97, (min(fills), np.mean(fills))
    assert fill_rows([10, 10, 10], 1, 25) == [0, 1] and fill_rows([30, 5], 2, 25) == [1]
