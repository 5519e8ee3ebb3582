"""float64 checks of rl/losses.py against formulas written out directly (loops / numpy)."""

import math

import numpy as np
import pytest
import torch

from rl.advantages import grpo_advantages
from rl.losses import (
    aggregate,
    clipped_pg_loss,
    grpo_loss,
    k3_kl,
    opsm_keep,
    seq_mean,
    unbiased_k3_kl,
)

D = torch.float64


def t(x, dtype=D):
    return torch.tensor(x, dtype=dtype)


# ---------------------------------------------------------------- advantages


def test_grpo_advantages_mean_and_std():
    rewards = [1.0, 0.0, 0.5, 2.0, 3.0, 7.0]
    groups = [5, 5, 5, 9, 9, 42]  # arbitrary ids, last group has one sample
    adv = grpo_advantages(t(rewards), torch.tensor(groups))
    adv_std = grpo_advantages(t(rewards), torch.tensor(groups), normalize_std=True, eps=1e-6)
    for i, (r, g) in enumerate(zip(rewards, groups)):
        members = np.array([rr for rr, gg in zip(rewards, groups) if gg == g])
        assert adv[i].item() == pytest.approx(r - members.mean(), abs=1e-12)
        assert adv_std[i].item() == pytest.approx((r - members.mean()) / (members.std() + 1e-6), abs=1e-12)
    assert adv[5].item() == 0.0 and adv_std[5].item() == 0.0  # group of one


def test_grpo_advantages_of_equal_rewards_are_exactly_zero():
    rewards = t([0.1] * 7 + [0.7] * 3)  # 7 x 0.1 has a rounded mean: 0.1 - mean(...) would be ~1e-17
    adv = grpo_advantages(rewards, torch.tensor([0] * 7 + [1] * 3))
    assert torch.equal(adv, torch.zeros(10, dtype=D))
    assert float((t([0.1] * 7) - t([0.1] * 7).mean()).abs().max()) > 0  # the rounding this guards against


def test_grpo_advantages_constant_group_is_zero():
    adv = grpo_advantages(t([1.0, 1.0, 1.0, 0.0]), torch.tensor([0, 0, 0, 1]), normalize_std=True)
    assert torch.equal(adv, torch.zeros(4, dtype=D))


# ---------------------------------------------------------------- KL estimators


def test_k3_matches_formula_and_nonnegative():
    logp = t([-0.1, -2.0, -5.0, -0.7, -3.3])
    ref = t([-0.3, -1.0, -5.0, -4.0, -0.2])
    got = k3_kl(logp, ref)
    want = [math.exp(r - lp) - (r - lp) - 1 for lp, r in zip(logp.tolist(), ref.tolist())]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-15)
    assert (got >= 0).all() and got[2] == 0


def test_unbiased_k3_matches_formula_and_ratio_has_gradient():
    logp = t([-0.1, -2.0, -0.7]).requires_grad_()
    ref, old = t([-0.3, -1.0, -4.0]), t([-0.2, -2.5, -0.6])
    got = unbiased_k3_kl(logp, ref, old)
    want = [
        math.exp(lp - o) * (math.exp(r - lp) - (r - lp) - 1)
        for lp, r, o in zip(logp.tolist(), ref.tolist(), old.tolist())
    ]
    np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-12)
    # d/dlogp [e^{lp-o} (e^{r-lp} - r + lp - 1)] = e^{lp-o} (e^{r-lp} - r + lp - 1) + e^{lp-o} (1 - e^{r-lp})
    (g,) = torch.autograd.grad(got.sum(), logp)
    want_g = [
        math.exp(lp - o) * (math.exp(r - lp) - (r - lp) - 1) + math.exp(lp - o) * (1 - math.exp(r - lp))
        for lp, r, o in zip(logp.tolist(), ref.tolist(), old.tolist())
    ]
    np.testing.assert_allclose(g.numpy(), want_g, rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kl_very_negative_logprobs_are_finite(dtype):
    logp = torch.tensor([-1e4, -1.0, -1e4, -0.5], dtype=dtype, requires_grad=True)
    ref = torch.tensor([-1.0, -1e4, -1e4, -1e4], dtype=dtype)
    old = torch.tensor([-1.0, -1e4, -1.0, -0.5], dtype=dtype)
    for val in (k3_kl(logp, ref), unbiased_k3_kl(logp, ref, old)):
        (g,) = torch.autograd.grad(val.sum(), logp)
        assert torch.isfinite(val).all() and torch.isfinite(g).all()


# ---------------------------------------------------------------- clipped PG


def test_clipped_pg_asymmetric_clip():
    eps_low, eps_high = 0.2, 0.28
    ratios = [0.5, 0.9, 1.25, 1.5, 0.5, 0.9, 1.25, 1.5]
    advs = [1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0]
    logp = t([math.log(r) for r in ratios]).requires_grad_()
    old = torch.zeros(8, dtype=D)
    loss, clipped = clipped_pg_loss(logp, old, t(advs), eps_low, eps_high)
    for i, (r, a) in enumerate(zip(ratios, advs)):
        rc = min(max(r, 1 - eps_low), 1 + eps_high)
        assert loss[i].item() == pytest.approx(-min(r * a, rc * a), abs=1e-12)
        assert clipped[i].item() == float(rc * a < r * a)
    # A>0 clips only above 1+eps_high (1.25 < 1.28 is not clipped, 1.5 is); A<0 only below 1-eps_low.
    assert clipped.tolist() == [0, 0, 0, 1, 1, 0, 0, 0]
    (g,) = torch.autograd.grad(loss.sum(), logp)
    assert (g[clipped.bool()] == 0).all() and (g[~clipped.bool()] != 0).all()


def test_clipped_pg_huge_logratio_finite():
    logp = t([-1e4, 0.0]).requires_grad_()
    loss, _ = clipped_pg_loss(logp, t([0.0, -1e4]), t([1.0, -1.0]), 0.2, 0.2)
    (g,) = torch.autograd.grad(loss.sum(), logp)
    assert torch.isfinite(loss).all() and torch.isfinite(g).all()


# ---------------------------------------------------------------- seq_mean / OPSM


def test_seq_mean_with_empty_and_all_masked_rows():
    # sample 1 has no tokens at all, sample 2 has tokens but all masked
    seq = torch.tensor([0, 0, 0, 2, 2, 3])
    x = t([1.0, 2.0, 4.0, 100.0, 200.0, 5.0]).requires_grad_()
    mask = t([1, 0, 1, 0, 0, 1])
    out = seq_mean(x, seq, mask, 4)
    assert out.tolist() == [2.5, 0.0, 0.0, 5.0]
    (g,) = torch.autograd.grad(out.sum(), x)
    assert g.tolist() == [0.5, 0.0, 0.5, 0.0, 0.0, 1.0]


def _opsm_ref(adv, logp, old, seq, mask, delta):
    keep = []
    for i in range(len(adv)):
        toks = [j for j in range(len(seq)) if seq[j] == i and mask[j] > 0]
        if not toks:
            keep.append(True)
            continue
        drift = sum(old[j] - logp[j] for j in toks) / len(toks)
        keep.append(not (adv[i] < 0 and drift > delta[i]))
    return keep


def test_opsm_against_loop_and_edges():
    g = torch.Generator().manual_seed(0)
    B, N = 12, 80
    seq = torch.sort(torch.randint(0, B - 1, (N,), generator=g)).values  # sample B-1 is empty
    logp = -torch.rand(N, generator=g, dtype=D) * 3
    old = -torch.rand(N, generator=g, dtype=D) * 3
    mask = (torch.rand(N, generator=g) > 0.2).to(D)
    adv = torch.randn(B, generator=g, dtype=D)
    delta = torch.rand(B, generator=g, dtype=D) * 0.5 - 0.25
    delta[3] = float("inf")
    keep = opsm_keep(adv, logp, old, seq, mask, delta)
    assert keep.dtype == torch.bool
    args = (adv, logp, old, seq, mask, delta)
    assert keep.tolist() == _opsm_ref(*(a.tolist() for a in args))
    assert keep[adv >= 0].all() and keep[B - 1] and keep[3]
    assert not keep.all()  # the test data does mask something


def test_opsm_positive_advantage_never_masked_and_inf_never_masks():
    seq = torch.tensor([0, 0, 1, 1])
    logp, old = t([-50.0, -50.0, -50.0, -50.0]), t([-0.1, -0.1, -0.1, -0.1])  # drift ~ 50
    assert opsm_keep(t([1.0, 0.0]), logp, old, seq, torch.ones(4, dtype=D), t([0.0, 0.0])).all()
    inf = float("inf")
    assert opsm_keep(t([-1.0, -1.0]), logp, old, seq, torch.ones(4, dtype=D), t([inf, inf])).all()
    assert not opsm_keep(t([-1.0, -1.0]), logp, old, seq, torch.ones(4, dtype=D), t([1.0, 1.0])).any()


def test_opsm_exact_threshold_is_strict():
    # drift = mean(old - logp) = 0.5 exactly (binary-exact numbers); masked only when drift > delta.
    seq = torch.tensor([0, 0, 1, 1, 2, 2])
    logp, old = t([-1.0, -2.0] * 3), t([-0.5, -1.5] * 3)
    keep = opsm_keep(t([-1.0] * 3), logp, old, seq, torch.ones(6, dtype=D), t([0.5, 0.4999999, 0.5000001]))
    assert keep.tolist() == [True, False, True]


def test_opsm_ignores_masked_tokens_in_the_mean():
    seq = torch.tensor([0, 0])
    logp, old = t([-1.0, -100.0]), t([-1.0, -0.1])  # only the unmasked token counts: drift = 0
    assert opsm_keep(t([-1.0]), logp, old, seq, t([1.0, 0.0]), t([0.1])).all()


# ---------------------------------------------------------------- full loss


def _grpo_loss_ref(logp, old, ref, seq, mask, adv, beta, delta, eps_low, eps_high, unbiased, aggregation, G, T):
    """Direct transcription of the objective with Python loops."""
    B = len(adv)
    keep = _opsm_ref(adv, logp, old, seq, mask, delta)
    total = 0.0
    per_seq = [[] for _ in range(B)]
    for j in range(len(seq)):
        i = seq[j]
        r = math.exp(logp[j] - old[j])
        rc = min(max(r, 1 - eps_low), 1 + eps_high)
        pg = -min(r * adv[i], rc * adv[i]) * (1.0 if keep[i] else 0.0)
        if ref is None:
            kl = 0.0
        else:
            d = ref[j] - logp[j]
            kl = math.exp(d) - d - 1
            if unbiased:
                kl *= r
        per_seq[i].append((pg + beta[i] * kl) * mask[j])
        total += (pg + beta[i] * kl) * mask[j]
    if aggregation == "token_mean":
        return total / T
    out = 0.0
    for i in range(B):
        n = sum(mask[j] for j in range(len(seq)) if seq[j] == i)
        s = sum(per_seq[i])
        out += (s / n if n > 0 else 0.0) if aggregation == "seq_mean_token_mean" else s
    return out / G


def _random_batch(seed, B=6, N=60):
    g = torch.Generator().manual_seed(seed)
    seq = torch.sort(torch.randint(0, B - 1, (N,), generator=g)).values  # last sample empty
    mask = (torch.rand(N, generator=g) > 0.25).to(D)
    mask[seq == 0] = 0.0  # sample 0: tokens, all masked
    old = -torch.rand(N, generator=g, dtype=D) * 2
    logp = (old + 0.3 * torch.randn(N, generator=g, dtype=D)).clamp(max=0).requires_grad_()
    ref = -torch.rand(N, generator=g, dtype=D) * 2
    adv = torch.randn(B, generator=g, dtype=D)
    adv[1] = -abs(adv[1])
    beta = torch.rand(B, generator=g, dtype=D) * 0.1
    delta = torch.full((B,), float("inf"), dtype=D)
    delta[1] = -1.0  # forces OPSM on sample 1 (negative advantage, drift > -1)
    return logp, old, ref, seq, mask, adv, beta, delta


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum"])
@pytest.mark.parametrize("unbiased", [True, False])
def test_grpo_loss_against_loop(aggregation, unbiased):
    logp, old, ref, seq, mask, adv, beta, delta = _random_batch(1)
    G, T = 16, 200  # mini-batch totals, larger than this micro-batch
    kw = dict(eps_low=0.2, eps_high=0.28, unbiased_kl=unbiased, aggregation=aggregation, norm_seqs=G, norm_tokens=T)
    loss, stats = grpo_loss(logp, old, ref, seq, mask, adv, beta, delta, **kw)
    want = _grpo_loss_ref(
        logp.tolist(), old.tolist(), ref.tolist(), seq.tolist(), mask.tolist(), adv.tolist(), beta.tolist(),
        delta.tolist(), 0.2, 0.28, unbiased, aggregation, G, T,
    )
    assert loss.item() == pytest.approx(want, rel=1e-12, abs=1e-14)
    assert (stats["pg_loss"] + stats["kl_loss"]).item() == pytest.approx(loss.item(), rel=1e-12, abs=1e-14)
    assert not stats["opsm_keep"][1] and stats["opsm_keep"][0] and stats["opsm_keep"][-1]
    assert stats["tok_sum"].item() == mask.sum().item()
    assert stats["kl_seq"].shape == (6,) and stats["kl_seq"][-1] == 0 and stats["kl_seq"][0] == 0
    assert all(not v.requires_grad for v in stats.values())
    (g,) = torch.autograd.grad(loss, logp)
    assert torch.isfinite(g).all() and (g[mask == 0] == 0).all()


def test_grpo_loss_opsm_masks_pg_not_kl():
    # one sequence, negative advantage, strongly off-policy -> PG dropped, KL gradient remains
    seq = torch.zeros(3, dtype=torch.long)
    logp = t([-3.0, -3.0, -3.0]).requires_grad_()
    old, ref = t([-0.1, -0.1, -0.1]), t([-1.0, -1.0, -1.0])
    kw = dict(eps_low=0.2, eps_high=0.2, norm_seqs=1, norm_tokens=3)
    loss, stats = grpo_loss(logp, old, ref, seq, torch.ones(3, dtype=D), t([-1.0]), t([0.0]), t([0.5]), **kw)
    assert not stats["opsm_keep"][0] and stats["pg_loss"].item() == 0 and loss.item() == 0
    loss, stats = grpo_loss(logp, old, ref, seq, torch.ones(3, dtype=D), t([-1.0]), t([0.5]), t([0.5]), **kw)
    want = 0.5 * unbiased_k3_kl(logp, ref, old).mean()
    assert loss.item() == pytest.approx(want.item(), rel=1e-12)


def test_grpo_loss_without_ref():
    logp, old, _, seq, mask, adv, _, delta = _random_batch(2)
    kw = dict(eps_low=0.2, eps_high=0.2, norm_seqs=6, norm_tokens=60)
    zeros = torch.zeros(6, dtype=D)
    loss, stats = grpo_loss(logp, old, None, seq, mask, adv, zeros, delta, **kw)
    assert stats["kl_loss"].item() == 0 and loss.item() == pytest.approx(stats["pg_loss"].item())
    with pytest.raises(ValueError):
        grpo_loss(logp, old, None, seq, mask, adv, zeros + 0.1, delta, **kw)


def test_micro_batch_losses_sum_to_mini_batch_loss():
    logp, old, ref, seq, mask, adv, beta, delta = _random_batch(3, B=8, N=90)
    for aggregation in ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum"):
        kw = dict(eps_low=0.2, eps_high=0.3, aggregation=aggregation, norm_seqs=8, norm_tokens=int(mask.sum()))
        full, _ = grpo_loss(logp, old, ref, seq, mask, adv, beta, delta, **kw)
        parts = 0.0
        for lo, hi in ((0, 3), (3, 8)):
            sel = (seq >= lo) & (seq < hi)
            sl = slice(lo, hi)
            part, _ = grpo_loss(
                logp[sel], old[sel], ref[sel], seq[sel] - lo, mask[sel], adv[sl], beta[sl], delta[sl], **kw
            )
            parts = parts + part
        assert parts.item() == pytest.approx(full.item(), rel=1e-12)


def test_all_masked_and_empty_batch_is_zero_and_finite():
    logp = t([-1e4, -2.0]).requires_grad_()
    seq = torch.tensor([0, 0])
    kw = dict(eps_low=0.2, eps_high=0.2, norm_seqs=2, norm_tokens=1)
    loss, stats = grpo_loss(
        logp, t([-1.0, -1.0]), t([-1e4, -1.0]), seq, t([0.0, 0.0]), t([1.0, -1.0]), t([0.1, 0.1]), t([0.0, 0.0]), **kw
    )
    (g,) = torch.autograd.grad(loss, logp)
    assert loss.item() == 0 and (g == 0).all() and stats["tok_sum"] == 0


def test_aggregate_rejects_unknown_mode():
    with pytest.raises(ValueError):
        aggregate(t([1.0]), torch.tensor([0]), t([1.0]), 1, "sum", 1, 1)


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum"])
def test_a_minibatch_without_loss_tokens_gives_zero_loss_and_zero_gradient(aggregation):
    logprobs = t([-1.0, -2.0, -0.5]).requires_grad_()
    loss, _ = grpo_loss(logprobs, t([-1.1, -1.9, -0.4]), t([-1.0, -1.0, -1.0]), torch.tensor([0, 0, 1]),
                        t([0.0, 0.0, 0.0]), t([1.0, -1.0]), t([0.1, 0.1]), t([0.5, 0.5]), eps_low=0.2, eps_high=0.2,
                        aggregation=aggregation, norm_seqs=2, norm_tokens=0)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logprobs.grad, torch.zeros(3, dtype=D))


def test_opsm_ignores_advantages_that_are_zero_up_to_rounding():
    lp, old = t([-3.0, -3.0]), t([-1.0, -1.0])  # drift 2 > delta: only the sign of A decides
    keep = opsm_keep(t([-1e-17, -0.5]), lp, old, torch.tensor([0, 1]), t([1.0, 1.0]), t([0.5, 0.5]))
    assert keep.tolist() == [True, False]


def test_truncated_importance_weight():
    from rl.losses import truncated_is_weight

    w = truncated_is_weight(t([-1.0, -1.0, -3.0]), t([-1.0, -2.0, -1.0]), cap=2.0)
    torch.testing.assert_close(w, t([1.0, 2.0, math.exp(-2.0)]))  # e^1 > 2 is capped


def test_importance_weight_scales_the_policy_gradient_and_the_unbiased_kl():
    """The TIS weight (pi_old recomputed by the trainer) corrects both terms for the engine's sampling (issue 68;
    it scaled the policy gradient only before); the plain K3, which corrects no off-policyness, takes none."""
    kw = dict(eps_low=0.2, eps_high=0.2, aggregation="token_mean", norm_seqs=1, norm_tokens=2)
    args = (t([-1.0, -2.0]), t([-1.1, -1.9]), t([-1.5, -1.5]), torch.tensor([0, 0]), t([1.0, 1.0]), t([1.0]),
            t([0.3]), t([float("inf")]))
    _, plain = grpo_loss(*args, **kw)
    _, weighted = grpo_loss(*args, **kw, is_weight=t([0.5, 0.5]))
    assert weighted["pg_loss"].item() == pytest.approx(0.5 * plain["pg_loss"].item())
    assert weighted["kl_loss"].item() == pytest.approx(0.5 * plain["kl_loss"].item())
    _, plain_k3 = grpo_loss(*args, **kw, unbiased_kl=False)
    _, weighted_k3 = grpo_loss(*args, **kw, unbiased_kl=False, is_weight=t([0.5, 0.5]))
    assert weighted_k3["kl_loss"].item() == pytest.approx(plain_k3["kl_loss"].item())


# ---------------------------------------------------------------- issue 41: values no earlier test checked


def test_grpo_loss_stats_against_loop():
    """Every stat of grpo_loss against a hand computation on a batch that has clipped tokens both inside and
    outside the loss mask (so the clip count is the masked share, not all clipped tokens) and an OPSM-masked
    sample: clip_tok_sum, tok_sum, log_ratio_seq (mean log(pi_old/pi_theta) per sample, OPSM's statistic, with
    pi_old = the sampling logprobs: old_logprobs when no sampling_logprobs are given),
    kl_seq, opsm_keep, and pg_loss / kl_loss each on its own."""
    logp, old, ref, seq, mask, adv, beta, delta = _random_batch(1)
    eps_low, eps_high, G, T = 0.2, 0.28, 16, 200
    kw = dict(eps_low=eps_low, eps_high=eps_high, aggregation="seq_mean_token_mean", norm_seqs=G, norm_tokens=T)
    _, stats = grpo_loss(logp, old, ref, seq, mask, adv, beta, delta, **kw)
    lp, o, r, s, m, a = logp.tolist(), old.tolist(), ref.tolist(), seq.tolist(), mask.tolist(), adv.tolist()
    B = len(a)
    clipped = []
    for j in range(len(s)):
        ratio = math.exp(lp[j] - o[j])
        rc = min(max(ratio, 1 - eps_low), 1 + eps_high)
        clipped.append(rc * a[s[j]] < ratio * a[s[j]])
    assert any(c and m[j] == 0 for j, c in enumerate(clipped)) and any(c and m[j] > 0 for j, c in enumerate(clipped))
    assert stats["clip_tok_sum"].item() == sum(1.0 for j, c in enumerate(clipped) if c and m[j] > 0)
    assert stats["tok_sum"].item() == sum(m)
    want_log_ratio, want_kl = [], []
    for i in range(B):
        toks = [j for j in range(len(s)) if s[j] == i and m[j] > 0]
        want_log_ratio.append(sum(o[j] - lp[j] for j in toks) / len(toks) if toks else 0.0)
        kl = [math.exp(lp[j] - o[j]) * (math.exp(r[j] - lp[j]) - (r[j] - lp[j]) - 1) for j in toks]
        want_kl.append(sum(kl) / len(kl) if kl else 0.0)
    assert any(v > 0 for v in want_log_ratio) and any(v < 0 for v in want_log_ratio)
    np.testing.assert_allclose(stats["log_ratio_seq"].numpy(), want_log_ratio, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(stats["kl_seq"].numpy(), want_kl, rtol=1e-12, atol=1e-15)
    assert stats["opsm_keep"].tolist() == _opsm_ref(a, lp, o, s, m, delta.tolist())
    no_kl = [0.0] * B
    want_pg = _grpo_loss_ref(lp, o, r, s, m, a, no_kl, delta.tolist(), eps_low, eps_high, True,
                             "seq_mean_token_mean", G, T)
    want_all = _grpo_loss_ref(lp, o, r, s, m, a, beta.tolist(), delta.tolist(), eps_low, eps_high, True,
                              "seq_mean_token_mean", G, T)
    assert stats["pg_loss"].item() == pytest.approx(want_pg, rel=1e-12, abs=1e-15)
    assert stats["kl_loss"].item() == pytest.approx(want_all - want_pg, rel=1e-10, abs=1e-15)
    assert stats["kl_loss"].item() > 0


def test_opsm_keeps_samples_without_loss_tokens_even_when_the_threshold_is_negative():
    """The docstring's 'sequences with no generated token are kept', on the case where it matters: A < 0 and a
    finite delta below their drift of 0 (an empty sequence's mean). Sample 0 has tokens, all outside the loss
    mask; sample 1 has no token at all; sample 2 (with tokens) is the control that the same A and delta mask."""
    seq = torch.tensor([0, 0, 2, 2])
    logp, old = t([-1.0, -1.0, -2.0, -2.0]), t([-1.0, -1.0, -1.0, -1.0])  # sample 2's drift = 1
    mask = t([0.0, 0.0, 1.0, 1.0])
    adv, delta = t([-1.0, -1.0, -1.0]), t([-0.5, -0.5, -0.5])
    assert opsm_keep(adv, logp, old, seq, mask, delta).tolist() == [True, True, False]
    assert _opsm_ref(adv.tolist(), logp.tolist(), old.tolist(), seq.tolist(), mask.tolist(), delta.tolist()) == [
        True, True, False]


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_a_minibatch_with_one_loss_token_gets_its_whole_loss(aggregation):
    """A mini-batch with a single loss token (norm_tokens = norm_seqs = 1): the loss is that token's value, for
    every aggregation (token_mean divides by max(norm_tokens, 1) = 1)."""
    x = t([3.0, 5.0, 7.0])
    seq, mask = torch.tensor([0, 0, 0]), t([0.0, 1.0, 0.0])
    assert aggregate(x, seq, mask, 1, aggregation, 1, 1).item() == 5.0
    # and through the whole loss: one token, ratio 1 (no clip), A = 2, no KL -> pg = -r A = -2
    loss, stats = grpo_loss(t([-1.0, -1.0]), t([-1.0, -1.0]), None, torch.tensor([0, 0]), t([1.0, 0.0]), t([2.0]),
                            t([0.0]), t([float("inf")]), eps_low=0.2, eps_high=0.2, aggregation=aggregation,
                            norm_seqs=1, norm_tokens=1)
    assert loss.item() == -2.0 and stats["pg_loss"].item() == -2.0 and stats["tok_sum"].item() == 1.0


def test_log_ratios_are_clamped_at_20():
    """LOG_RATIO_CLAMP = 20 as documented (exp(20) ~ 4.9e8 stays finite in float32): K3 at |d| = 1e4 is K3 at
    d = +-20, and the truncated importance weight of a log ratio of -1e4 is exp(-20), not 0."""
    from rl.losses import LOG_RATIO_CLAMP, truncated_is_weight

    assert LOG_RATIO_CLAMP == 20.0
    got = k3_kl(t([-1e4, 0.0]), t([0.0, -1e4]))  # d = ref - logp = +1e4, -1e4
    np.testing.assert_allclose(got.numpy(), [math.expm1(20) - 20, math.expm1(-20) + 20], rtol=1e-15)
    w = truncated_is_weight(t([-1e4, 0.0]), t([0.0, -1e4]), cap=2.0)
    assert w.tolist() == [math.exp(-20.0), 2.0]


def test_importance_weights_are_constants():
    """truncated_is_weight is detached (its docstring), and grpo_loss detaches is_weight: no gradient reaches
    pi_old through the weight, and the policy gradient is the one of a constant weight."""
    from rl.losses import truncated_is_weight

    old = t([-1.0, -2.0]).requires_grad_()
    assert not truncated_is_weight(old, t([-1.5, -1.5]), cap=2.0).requires_grad
    args = (t([-1.1, -1.9]), t([-1.5, -1.5]), torch.tensor([0, 0]), t([1.0, 1.0]), t([1.0]), t([0.3]),
            t([float("inf")]))
    kw = dict(eps_low=0.2, eps_high=0.2, aggregation="token_mean", norm_seqs=1, norm_tokens=2)
    weight = t([0.5, 1.5]).requires_grad_()
    logp = t([-1.0, -2.0]).requires_grad_()
    loss, _ = grpo_loss(logp, *args, **kw, is_weight=weight)
    loss.backward()
    assert weight.grad is None
    logp2 = t([-1.0, -2.0]).requires_grad_()
    loss2, _ = grpo_loss(logp2, *args, **kw, is_weight=t([0.5, 1.5]))
    loss2.backward()
    torch.testing.assert_close(logp.grad, logp2.grad, rtol=0, atol=0)


def test_opsm_negative_advantage_is_strictly_below_minus_tolerance():
    """A counts as negative only below -ADV_TOL: A = -ADV_TOL itself is kept, A = -2 ADV_TOL is masked."""
    from rl.losses import ADV_TOL

    lp, old = t([-3.0, -3.0]), t([-1.0, -1.0])  # drift 2 > delta
    keep = opsm_keep(t([-ADV_TOL, -2 * ADV_TOL]), lp, old, torch.tensor([0, 1]), t([1.0, 1.0]), t([0.5, 0.5]))
    assert keep.tolist() == [True, False]


# ---------------------------------------------------------------- pi_old choices, episode shares (issue 68)


def test_opsm_reads_sampling_logprobs_not_the_ratios_pi_old():
    """grpo_loss(sampling_logprobs=...): OPSM's statistic (and log_ratio_seq) is mean_t log(pi_sampling/pi_theta)
    whatever pi_old the ratio uses; the ratio and clipping still read old_logprobs. None = old_logprobs."""
    seq = torch.zeros(3, dtype=torch.long)
    logp, old, engine = t([-3.0] * 3), t([-3.0] * 3), t([-0.5] * 3)
    kw = dict(eps_low=0.2, eps_high=0.2, norm_seqs=1, norm_tokens=3)
    args = (seq, torch.ones(3, dtype=D), t([-1.0]), t([0.0]), t([1.0]))
    _, same = grpo_loss(logp, old, None, *args, **kw)
    _, stats = grpo_loss(logp, old, None, *args, sampling_logprobs=engine, **kw)
    assert same["opsm_keep"].tolist() == [True] and stats["opsm_keep"].tolist() == [False]
    assert stats["log_ratio_seq"].item() == pytest.approx(2.5) and stats["clip_tok_sum"].item() == 0


def test_unbiased_kl_carries_the_importance_weight():
    """With is_weight w: D_t = w_t * (pi_theta/pi_old) * k3_t, w detached; uncapped (w = pi_old/pi_engine) that is
    the estimator against the engine's logprobs, with the same gradient. The plain K3 takes no weight."""
    logp = t([-1.0, -2.0, -0.3]).requires_grad_()
    old, engine, ref = t([-1.2, -1.7, -0.2]), t([-0.9, -2.4, -0.6]), t([-0.5, -2.2, -1.0])
    seq, mask = torch.zeros(3, dtype=torch.long), torch.ones(3, dtype=D)
    kw = dict(eps_low=0.2, eps_high=0.2, norm_seqs=1, norm_tokens=3)
    args = (seq, mask, t([0.0]), t([0.7]), t([math.inf]))
    w = torch.exp(old - engine)
    loss, _ = grpo_loss(logp, old, ref, *args, is_weight=w, sampling_logprobs=engine, **kw)
    want = 0.7 * unbiased_k3_kl(logp, ref, engine).mean()
    assert loss.item() == pytest.approx(want.item(), rel=1e-12)
    (g,) = torch.autograd.grad(loss, logp)
    (want_g,) = torch.autograd.grad(want, logp)
    torch.testing.assert_close(g, want_g, rtol=1e-12, atol=0)
    plain, _ = grpo_loss(logp, old, ref, *args, is_weight=w, unbiased_kl=False, **kw)
    assert plain.item() == pytest.approx(0.7 * k3_kl(logp, ref).mean().item(), rel=1e-12)


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum"])
def test_aggregate_with_episode_shares_against_a_loop(aggregation):
    """seq_mean_token_mean: sum_i s_i seq_mean_i / norm_seqs; seq_mean_token_sum: sum_i seq_sum_i / norm_seqs (the
    share only enters its normaliser); token_mean ignores shares. Shares of 1 change nothing, bit for bit."""
    g = torch.Generator().manual_seed(5)
    seq = torch.sort(torch.randint(0, 6, (40,), generator=g)).values
    x = torch.randn(40, generator=g, dtype=D)
    mask = (torch.rand(40, generator=g) > 0.3).to(D)
    share = t([0.25, 0.75, 1.0, 0.5, 0.5, 1.0])
    got = aggregate(x, seq, mask, 6, aggregation, 4.0, 50, share)
    want = 0.0
    for i in range(6):
        vals = [x[j].item() for j in range(40) if seq[j] == i and mask[j] > 0]
        if aggregation == "seq_mean_token_mean":
            want += share[i].item() * (sum(vals) / len(vals) if vals else 0.0) / 4.0
        elif aggregation == "seq_mean_token_sum":
            want += sum(vals) / 4.0
        else:
            want += sum(vals) / 50
    assert got.item() == pytest.approx(want, rel=1e-12, abs=1e-15)
    ones = aggregate(x, seq, mask, 6, aggregation, 4.0, 50, torch.ones(6, dtype=D))
    assert torch.equal(ones, aggregate(x, seq, mask, 6, aggregation, 4.0, 50))
