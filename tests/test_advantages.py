"""float64 checks of rl/advantages.py with its defaults (eps, normalize_std through assign_advantages) against
hand computations (issue 41)."""

import numpy as np
import pytest
import torch

from rl.advantages import assign_advantages, attach_domain_coefficients, grpo_advantages
from rl.trajectory import Trajectory

D = torch.float64


def _std_normalised(rewards, groups, eps=1e-6):
    """(r - mean_g) / (std_g + eps) with the population std, one sample at a time (numpy)."""
    out = []
    for r, g in zip(rewards, groups):
        members = np.array([rr for rr, gg in zip(rewards, groups) if gg == g])
        out.append((r - members.mean()) / (members.std() + eps))
    return out


def test_default_eps_is_1e_minus_6():
    """normalize_std=True with the default eps: a group whose std (5e-7) is comparable to eps gives
    (r - mean) / (std + 1e-6) = +-1/3 (eps = 1e-6 exactly, not 1 or -1e-6); an all-equal group (std 0) gives
    exactly 0 and stays finite; an ordinary group is (r - mean) / (std + 1e-6)."""
    rewards = [0.0, 1e-6, 0.25, 0.25, 0.25, 1.0, 0.0, 0.5]
    groups = [0, 0, 1, 1, 1, 2, 2, 2]
    adv = grpo_advantages(torch.tensor(rewards, dtype=D), torch.tensor(groups), normalize_std=True)
    want = _std_normalised(rewards, groups)
    np.testing.assert_allclose(adv.numpy(), want, rtol=1e-12, atol=0)
    assert adv[0].item() == pytest.approx(-1 / 3, rel=1e-9) and adv[1].item() == pytest.approx(1 / 3, rel=1e-9)
    assert torch.isfinite(adv).all() and adv[2:5].tolist() == [0.0, 0.0, 0.0]


def _traj(uid, group, reward, failed=False):
    t = Trajectory(uid=uid, group_id=group, domain="math", prompt_ids=[1, 2], response_ids=[3, 4],
                   inference_logprobs=[-1.0, -1.0])
    t.reward, t.reward_failed = reward, failed
    return t


def test_assign_advantages_with_std_normalisation():
    """assign_advantages(normalize_std=True) relies on grpo_advantages' default eps: each sample gets
    (r - mean_g) / (std_g + 1e-6) over its group's scored samples; a failed reward gets 0 and is left out of its
    group's statistics; an all-equal group and a group of one get 0."""
    trajs = [_traj("a", "g", 1.0), _traj("b", "g", 0.0), _traj("c", "g", 0.5), _traj("x", "g", 9.0, failed=True),
             _traj("d", "h", 0.3), _traj("e", "h", 0.3), _traj("f", "k", 1e-6), _traj("i", "k", 0.0),
             _traj("j", "solo", 2.0)]
    assign_advantages(trajs, normalize_std=True)
    scored = [t for t in trajs if not t.reward_failed]
    want = dict(zip((t.uid for t in scored), _std_normalised([t.reward for t in scored], [t.group_id for t in scored])))
    for t in trajs:
        assert t.advantage == pytest.approx(want.get(t.uid, 0.0), rel=1e-12, abs=0), t.uid
    assert trajs[3].advantage == 0.0 and trajs[4].advantage == 0.0 and trajs[8].advantage == 0.0
    assert trajs[6].advantage == pytest.approx(1 / 3, rel=1e-9)  # std 5e-7: eps is half the denominator
    assign_advantages(trajs, normalize_std=False)
    assert [t.advantage for t in trajs[:4]] == pytest.approx([0.5, -0.5, 0.0, 0.0], abs=1e-15)


def test_attach_domain_coefficients_reads_each_samples_domain():
    trajs = [_traj("a", "g", 1.0), _traj("b", "g", 0.0)]
    trajs[1].domain = "code"
    attach_domain_coefficients(trajs, {"math": {"kl_coef": 0.1, "opsm_delta": 0.5}, "code": {"kl_coef": 0}})
    assert [(t.kl_coef, t.opsm_delta) for t in trajs] == [(0.1, 0.5), (0.0, None)]
    assert isinstance(trajs[1].kl_coef, float)


def test_advantages_are_constants_of_the_rewards():
    rewards = torch.tensor([1.0, 0.0, 0.5], dtype=D, requires_grad=True)
    for normalize in (False, True):
        assert not grpo_advantages(rewards, torch.tensor([0, 0, 1]), normalize_std=normalize).requires_grad


def test_episode_shares_are_loss_token_fractions():
    """A managed episode's context segments weigh their share of its loss tokens (summing to 1), evenly when it has
    none; one segment weighs 1 (issue 68 item 6)."""
    from rl.advantages import episode_shares

    assert episode_shares([5.0]) == [1.0] and episode_shares([0.0]) == [1.0]
    assert episode_shares([2.0, 3.0, 1.0]) == pytest.approx([2 / 6, 3 / 6, 1 / 6])
    assert sum(episode_shares([7.0, 1.0, 13.0])) == pytest.approx(1.0, abs=1e-15)
    assert episode_shares([0.0, 0.0, 0.0, 0.0]) == [0.25] * 4
