"""GRPO advantages, and the one place where a sample takes its domain's coefficients (KL strength, OPSM threshold).

Both run in the loop between rewards and training; both are pure functions of the trajectories and the config.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from rl.trajectory import Trajectory


def grpo_advantages(
    rewards: torch.Tensor, group_index: torch.Tensor, normalize_std: bool = False, eps: float = 1e-6
) -> torch.Tensor:
    """Group-relative advantages (GRPO): A_i = R_i - mean_{j in g(i)} R_j, optionally / (std_g + eps).

    `group_index[B]` (long) may hold any ids; samples sharing an id form a group. std is the population
    std (unbiased=False). A group of one sample, or of equal rewards, has A = 0 exactly.
    """
    rewards = rewards.detach()
    _, inv = torch.unique(group_index, return_inverse=True)
    G = int(inv.max()) + 1 if inv.numel() else 0
    count = torch.zeros(G, dtype=rewards.dtype, device=rewards.device).index_add_(0, inv, torch.ones_like(rewards))
    mean = torch.zeros(G, dtype=rewards.dtype, device=rewards.device).index_add_(0, inv, rewards) / count
    centered = rewards - mean[inv]
    # A group whose rewards are all equal carries no signal: exactly 0, not the +-1e-17 its rounded mean leaves
    # (which OPSM would read as a negative advantage).
    gmax = torch.full((G,), -torch.inf, dtype=rewards.dtype, device=rewards.device).scatter_reduce(0, inv, rewards, "amax")
    gmin = torch.full((G,), torch.inf, dtype=rewards.dtype, device=rewards.device).scatter_reduce(0, inv, rewards, "amin")
    centered = torch.where((gmax == gmin)[inv], torch.zeros_like(centered), centered)
    if not normalize_std:
        return centered
    var = torch.zeros(G, dtype=rewards.dtype, device=rewards.device).index_add_(0, inv, centered.square()) / count
    return centered / (var.sqrt()[inv] + eps)


def assign_advantages(trajs: list[Trajectory], normalize_std: bool) -> None:
    """GRPO advantages per group (`grpo_advantages`), written to `Trajectory.advantage`.

    A sample whose reward failed (an error or timeout, not an expected zero) gets advantage 0 and no say in its
    group's baseline: nobody's answer is pushed down for a reward that never ran.
    """
    scored = [t for t in trajs if not t.reward_failed]
    groups = {g: i for i, g in enumerate(dict.fromkeys(t.group_id for t in scored))}
    adv = grpo_advantages(
        torch.tensor([t.reward for t in scored], dtype=torch.float64),
        torch.tensor([groups[t.group_id] for t in scored], dtype=torch.long),
        normalize_std=bool(normalize_std),
    ) if scored else torch.zeros(0)
    by_uid = dict(zip((t.uid for t in scored), adv.tolist()))
    for t in trajs:
        t.advantage = by_uid.get(t.uid, 0.0)


def episode_shares(loss_tokens: list[float]) -> list[float]:
    """The weights of an episode's k+1 context segments in the seq-mean losses (`rl.losses.aggregate`), from their
    loss tokens n_s:

        s_seg = n_seg / sum_s n_s    (1/(k+1) each when the episode has no loss token),

    so that sum_seg s_seg * (1/n_seg) sum_{t in seg} x_t = 1/|o_i| sum_{t in o_i} x_t: the episode's segments give
    exactly the paper's per-sequence mean over all of its tokens, and the episode weighs one sequence (V3.2 gives
    no weighting for managed contexts; an episode's weight should not grow with how often its context was reset).
    They sum to 1."""
    total = float(sum(loss_tokens))
    if total <= 0:
        return [1.0 / len(loss_tokens)] * len(loss_tokens)
    return [float(n) / total for n in loss_tokens]


def expand_segments(trajs: list[Trajectory]) -> list[Trajectory]:
    """The samples to train on: every trajectory, each preceded by its earlier context segments (a managed agent
    episode, `Trajectory.segments`), which take the episode's reward, its parts and its advantage. Call after
    `assign_advantages`: a segment is never a sample of its group's baseline (an episode counts once however often
    its context was reset); it trains as a sample of its own (Keep Sampling Mask, Keep Routing, OPSM per segment)
    that weighs its share of the episode (`Trajectory.episode_share`, `episode_shares`; 1 for a sample of one
    segment): under the seq-mean aggregations the episode's loss and gradient are those of one sequence holding all
    of its tokens, and the mini-batch's normaliser counts it once (`rl.batching.minibatch_norm`)."""
    out: list[Trajectory] = []
    for t in trajs:
        parts = [*(t.segments or ()), t]
        for s, share in zip(parts, episode_shares([float(p.loss_mask_or_ones().sum()) for p in parts])):
            s.episode_share = share
        for s in t.segments or ():
            s.reward, s.reward_parts, s.reward_error = t.reward, dict(t.reward_parts), t.reward_error
            s.reward_failed, s.advantage = t.reward_failed, t.advantage
            out.append(s)
        out.append(t)
    return out


def attach_domain_coefficients(trajs: list[Trajectory], domains: Mapping[str, Mapping]) -> None:
    """Each sample takes its domain's KL strength (`domains.<d>.kl_coef`), OPSM threshold (`domains.<d>.opsm_delta`,
    absent or null = off) and, for on-policy distillation, the weights of its GRPO advantage and of its teacher
    (`domains.<d>.reward_coef`, default 1; `domains.<d>.distill_coef`, default 1 where the domain has a `teacher`, else
    0); the loss reads them per sample."""
    for t in trajs:
        d = domains[t.domain]
        t.kl_coef, t.opsm_delta = float(d["kl_coef"]), d.get("opsm_delta")
        t.reward_coef = float(d.get("reward_coef", 1.0))
        t.distill_coef = float(d.get("distill_coef", 1.0)) if d.get("teacher") else 0.0
