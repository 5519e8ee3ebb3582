"""DAPO's dynamic sampling (verl: `algorithm.filter_groups`), its pure part: which groups a step trains on, how many
prompts of each domain a backfill round draws, when the rounds stop, and what the step logs about it.

A GRPO group whose samples all got the same reward has advantage 0 in every sample: it adds nothing to the policy
gradient, yet it takes its place in the batch and in the loss's normaliser. With `data.dynamic_sampling.enabled`
the rollout source (launch/sources.py, `RolloutSource.take`) drops such groups and generates groups of more prompts
until the step holds `data.prompts_per_step` groups with reward variance, in each domain's share of the step, or
`max_rounds` rounds have run.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Mapping, Sequence

from rl.trajectory import Trajectory

EPS = 1e-12  # rewards closer than this are equal (as rl.metrics.zero_variance_group_frac counts them)
ROUND_SEED_STRIDE = 10**7  # rollout seed id of round r >= 2 of step s: r * stride + s (eval uses 10**6 + s)


def group_order(trajs: Sequence[Trajectory]) -> list[tuple[str, str]]:
    """(group id, domain) of every group, in the order of its first sample: a rollout returns its samples in request
    order, so this is the order the prompts were drawn in."""
    return list({t.group_id: t.domain for t in trajs}.items())


def informative_groups(trajs: Sequence[Trajectory], exempt_domains: Collection[str] = ()) -> set[str]:
    """Ids of the groups that have something to teach: their scored samples' rewards differ. A sample whose reward
    failed trains with advantage 0 and has no say in its group's baseline (`rl.advantages.assign_advantages`), so it
    does not count here either. A group of a domain in `exempt_domains` always counts (on-policy distillation: its
    teacher grades every token, whatever the rewards)."""
    low: dict[str, float] = {}
    high: dict[str, float] = {}
    out = set()
    for t in trajs:
        if t.domain in exempt_domains:
            out.add(t.group_id)
        elif not t.reward_failed:
            low[t.group_id] = min(low.get(t.group_id, math.inf), t.reward)
            high[t.group_id] = max(high.get(t.group_id, -math.inf), t.reward)
    return out | {g for g in low if high[g] - low[g] > EPS}


def first_round_prompts(prompts_per_step: int, oversample: float) -> int:
    """Prompts the step's first round draws: `prompts_per_step` times `oversample`, rounded up (verl's
    gen_batch_size over train_batch_size)."""
    return max(int(prompts_per_step), math.ceil(int(prompts_per_step) * float(oversample) - 1e-9))


def step_quota(order: Sequence[tuple[str, str]], prompts_per_step: int) -> dict[str, int]:
    """Groups of each domain the step trains on: the domains of the first `prompts_per_step` groups drawn. The
    mixture draws prompts in a prefix-stable order, so this is the share each domain has in the same step without
    dynamic sampling, and backfill keeps it (a hard domain is not crowded out by an easy one)."""
    return dict(Counter(domain for _, domain in order[: int(prompts_per_step)]))


def kept_counts(order: Sequence[tuple[str, str]], informative: Collection[str],
                quota: Mapping[str, int]) -> dict[str, int]:
    """Groups with variance found so far per domain of the quota, at most the domain's quota."""
    found = Counter(domain for gid, domain in order if gid in informative)
    return {d: min(found.get(d, 0), q) for d, q in quota.items()}


def backfill_counts(quota: Mapping[str, int], kept: Mapping[str, int], oversample: float) -> dict[str, int]:
    """Prompts of each domain the next round draws: the groups the domain still lacks times `oversample`, rounded up;
    domains that are full draw none (each domain refills its own share of the step)."""
    out = {}
    for d, q in quota.items():
        missing = q - kept.get(d, 0)
        if missing > 0:
            out[d] = max(missing, math.ceil(missing * float(oversample) - 1e-9))
    return out


def next_round(quota: Mapping[str, int], kept: Mapping[str, int], rounds_done: int, max_rounds: int,
               oversample: float) -> dict[str, int]:
    """What the next round draws per domain; empty when the step is full or `max_rounds` rounds (the first one
    included, as verl's max_num_gen_batches counts) have run."""
    if rounds_done >= int(max_rounds):
        return {}
    return backfill_counts(quota, kept, oversample)


def select_groups(order: Sequence[tuple[str, str]], informative: Collection[str],
                  quota: Mapping[str, int]) -> tuple[list[str], int]:
    """The groups the step trains on, in draw order, and how many of them have no reward variance. Per domain: its
    first `quota[d]` groups with variance; groups with variance beyond that (oversampling) are left out. Where the
    rounds ran out first, the domain's earliest zero-variance groups fill its share: they train with advantage 0, as
    they would without dynamic sampling, and the step keeps its shape (each mini-batch must fill the trainer ranks'
    micro-batches, and samples split evenly over them)."""
    chosen: set[str] = set()
    filled = 0
    for d, q in quota.items():
        groups = [gid for gid, domain in order if domain == d]
        with_variance = [gid for gid in groups if gid in informative][:q]
        fill = [gid for gid in groups if gid not in informative][: q - len(with_variance)]
        chosen.update(with_variance, fill)
        filled += len(fill)
    return [gid for gid, _ in order if gid in chosen], filled


def sampling_metrics(*, rounds: int, prompts_drawn: int, prompts_per_step: int, order: Sequence[tuple[str, str]],
                     informative: Collection[str], chosen: Sequence[str], first_round: Collection[str], filled: int,
                     rewards: Sequence[float]) -> dict[str, float]:
    """The step's `dynamic_sampling/*` keys (rows in rl/metric_keys.py). `rewards`: every sample generated this
    step, all rounds: the policy's own mean reward, which `reward/mean` (of the trained samples) no longer is."""
    return {
        "dynamic_sampling/rounds": float(rounds),
        "dynamic_sampling/extra_prompts": float(prompts_drawn - int(prompts_per_step)),
        "dynamic_sampling/dropped_groups": float(sum(gid not in informative for gid, _ in order)),
        "dynamic_sampling/backfilled_frac": sum(g not in first_round for g in chosen) / max(len(chosen), 1),
        "dynamic_sampling/filled_groups": float(filled),
        "dynamic_sampling/reward_mean": sum(rewards) / max(len(rewards), 1),
    }
