"""How a step's samples are cut up: mini-batches (optimizer steps), rank shards, micro-batches, worker shares.

One splitter for all of them (`split_even`), so every cut follows the same rule: contiguous parts whose sizes
differ by at most one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

import numpy as np

from rl.config import packed_step_rows, trains_on_dataset
from rl.trajectory import Trajectory

T = TypeVar("T")


def split_even(items: Sequence[T], n: int) -> list[list[T]]:
    """`n` contiguous parts of near-equal size, in order (some empty when there are fewer items than parts)."""
    bounds = np.linspace(0, len(items), n + 1).round().astype(int)
    return [list(items[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


def minibatches(trajs: list[Trajectory], n: int, seed: int, step: int) -> list[list[Trajectory]]:
    """The step's samples in a (seed, step)-determined random order, cut into `n` mini-batches (one optimizer
    step each)."""
    order = np.random.default_rng([seed, step, 7]).permutation(len(trajs))
    return split_even([trajs[i] for i in order], n)


def minibatch_norm(minibatch: list[Trajectory]) -> tuple[float, int]:
    """(episodes, loss tokens) of a whole mini-batch: every rank's micro-batch losses are normalised by these,
    so that they sum to the mini-batch's loss (see `rl.losses.aggregate`). Episodes = the sum of the samples'
    `episode_share`: the number of samples, where a managed agent episode's context segments count as one
    together (a fraction of one where its segments fall into different mini-batches)."""
    return float(sum(t.episode_share for t in minibatch)), int(sum(t.loss_mask_or_ones().sum() for t in minibatch))


def micro_batches(trajs: list[Trajectory], n: int, layout: str | None = None,
                  max_tokens: int | None = None) -> list[list[Trajectory]]:
    """A rank's share of a mini-batch cut into at most `n` micro-batches (gradient accumulation); the loss of each
    is normalised by the whole mini-batch, so how the samples are grouped changes the cost, never the update.

    layout None: in order, `split_even`. "padded": samples of similar length together (sorted by length, then
    `split_even`), so each micro-batch pads to less. "packed" (`collate(packed=True)`): near-equal token totals
    (longest first onto the lightest micro-batch), so no micro-batch is much longer than the others; when that
    leaves one over `max_tokens` (the micro-batch token budget) but the samples fit n micro-batches of the budget,
    those (best fit, longest first): a step's tokens in as few micro-batches as they fill, each costing host time."""
    if layout is None:
        return [part for part in split_even(trajs, n) if part]
    size = [t.num_tokens for t in trajs]
    order = sorted(range(len(trajs)), key=lambda i: (-size[i], i))
    if layout == "padded":
        return [part for part in split_even([trajs[i] for i in order], n) if part]
    if layout != "packed":
        raise ValueError(f"layout must be None, 'padded' or 'packed', got {layout!r}")
    bins: list[list[int]] = [[] for _ in range(min(n, len(trajs)))]
    totals = [0] * len(bins)
    for i in order:
        b = min(range(len(bins)), key=lambda k: (totals[k], len(bins[k])))
        bins[b].append(i)
        totals[b] += size[i]
    if max_tokens and max(totals, default=0) > max_tokens:
        bins = _best_fit(order, size, len(bins), int(max_tokens)) or bins
    return [[trajs[i] for i in sorted(b)] for b in bins if b]


def _best_fit(order: list[int], size: list[int], n: int, capacity: int) -> list[list[int]] | None:
    """Best-fit decreasing: each sample (longest first) into the fullest of `n` bins it still fits; None when one
    fits none."""
    bins, left_out = _fit(order, size, n, capacity)
    if left_out:
        return None
    # still n micro-batches where there are n samples (every rank runs the count the ranks agreed on): a sample of
    # the fullest bin moves into each empty one, which has all its room
    for empty in [k for k in range(n) if not bins[k]]:
        donor = max((k for k in range(n) if len(bins[k]) > 1), key=lambda k: len(bins[k]), default=None)
        if donor is None:
            break
        bins[empty].append(bins[donor].pop())
    return bins


def _fit(order: list[int], size: list[int], n: int, capacity: int) -> tuple[list[list[int]], list[int]]:
    """Items in `order`, each into the fullest of `n` bins of `capacity` it still fits: (the bins, the items that
    fit none)."""
    bins: list[list[int]] = [[] for _ in range(n)]
    room = [capacity] * n
    left_out = []
    for i in order:
        fits = [k for k in range(n) if room[k] >= size[i]]
        if not fits:
            left_out.append(i)
            continue
        b = min(fits, key=lambda k: room[k])
        bins[b].append(i)
        room[b] -= size[i]
    return bins, left_out


def fill_rows(sizes: list[int], n: int, capacity: int) -> list[int]:
    """Which of these items fill `n` packed rows of `capacity` tokens: best-fit decreasing, the items that fit no
    row left out (returned in their given order). The items kept are exactly those `micro_batches(kept, n,
    "packed", capacity)` fits into n micro-batches of the budget: it packs them by the same rule, and items of
    equal size are interchangeable, whatever order they come in."""
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    bins, _ = _fit(order, sizes, n, capacity)
    return sorted(i for b in bins for i in b)


def micro_batch_count(trajs: list[Trajectory], max_tokens: int, layout: str) -> int:
    """The fewest micro-batches, cut as `micro_batches(trajs, n, layout, max_tokens)` cuts them, whose largest runs
    the model over at most `max_tokens` positions (`rl.memory.micro_batch_tokens`: rows x the longest padded, the
    sum packed); one per sample when even that does not fit (a sample longer than the budget runs alone)."""
    from rl.memory import micro_batch_tokens

    packed = layout == "packed"
    total = sum(t.num_tokens for t in trajs)
    for n in range(max(1, -(-total // max(int(max_tokens), 1))), len(trajs) + 1):
        if max(micro_batch_tokens(p, packed) for p in micro_batches(trajs, n, layout, max_tokens)) <= max_tokens:
            return n
    return max(len(trajs), 1)


def step_samples(cfg: Mapping) -> int:
    """Samples of one step: data.prompts_per_step x rollout.n_samples from rollouts, algorithm.samples_per_step rows
    from a dataset (SFT), or with algorithm.step_tokens the packed rows (micro-batches) that many tokens fill."""
    if trains_on_dataset(cfg):
        # with step_tokens a step of packed rows, not of a fixed count: its rows stand for the samples
        return packed_step_rows(cfg) or int(cfg["algorithm"]["samples_per_step"])
    return int(cfg["data"]["prompts_per_step"]) * int(cfg["rollout"]["n_samples"])


def per_rank_samples(cfg: Mapping, world_size: int) -> int:
    """A rank's share of one mini-batch, in samples."""
    return max(1, step_samples(cfg) // int(cfg["trainer"]["mini_batches"]) // world_size)


def micro_batches_per_minibatch(cfg: Mapping, world_size: int) -> int:
    """Gradient-accumulation steps: a rank's share of a mini-batch over `trainer.micro_batch_size`, rounded up
    (1 for `auto`, whose count is chosen per step: `micro_batch_count`)."""
    if str(cfg["trainer"]["micro_batch_size"]) == "auto":
        return 1
    return max(1, -(-per_rank_samples(cfg, world_size) // int(cfg["trainer"]["micro_batch_size"])))
