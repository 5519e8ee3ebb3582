"""What OPSM, the ratio, the TIS weight and the unbiased KL read under each pi_old choice (issue 68 item 2), through
`trainer.objectives.grpo` on hand-built float64 batches.

algorithm.old_logprobs=inference: pi_old = the engine's logprobs everywhere (V3.2). old_logprobs=trainer: the ratio
and the KL's ratio are against the trainer's recomputed pi_old, the TIS weight min(pi_old/pi_engine, cap) multiplies
the policy-gradient term and the KL term alike, and OPSM's statistic is still mean_t log(pi_engine/pi_theta): the
sampling probability, as V3.2 defines it, so staleness and the engine/trainer gap stay visible to it."""

import math

import pytest
import torch

from rl.losses import aggregate, clipped_pg_loss, k3_kl, opsm_keep, truncated_is_weight, unbiased_k3_kl
from rl.trajectory import TrainBatch
from trainer.objectives import distill, grpo

D = torch.float64
ACFG = dict(clip_eps_low=0.2, clip_eps_high=0.28, unbiased_kl=True, loss_aggregation="seq_mean_token_mean",
            tis_cap=2.0)


def _batch(lens, inference, advantages, kl_coef, opsm_delta, ref=None, old=None, mask=None):
    """A float64 TrainBatch of len(lens) sequences with the given per-token and per-sample values (the token-id
    fields are placeholders: the objective reads the logprobs it is given)."""
    N, B = sum(lens), len(lens)
    seq = torch.cat([torch.full((n,), i, dtype=torch.long) for i, n in enumerate(lens)])
    f = lambda x: None if x is None else torch.as_tensor(x, dtype=D)  # noqa: E731
    return TrainBatch(
        input_ids=torch.zeros((B, 1), dtype=torch.long), logit_index=torch.arange(N), targets=torch.zeros(N, dtype=torch.long),
        seq_index=seq, loss_mask=f(mask) if mask is not None else torch.ones(N, dtype=D),
        inference_logprobs=f(inference), advantages=f(advantages), kl_coef=f(kl_coef), opsm_delta=f(opsm_delta),
        kept_ids=None, kept_offsets=None, routed_experts=None, route_valid=None, num_seqs=B, domains=["math"] * B,
        ref_logprobs=f(ref), old_logprobs=f(old),
        reward_coef=torch.ones(B, dtype=D), distill_coef=torch.zeros(B, dtype=D),
    )


def test_opsm_reads_the_engines_logprobs_when_the_trainer_recomputes_pi_old():
    """A stale or FP8 sample: the engine gave its tokens logprob -0.5, the trainer's recomputed pi_old and the
    current policy -3.0 (the trainer's forward now finds them far less likely than the sampler did). Sequence 0
    has A < 0 and mean_t log(pi_engine/pi_theta) = 2.5 > delta = 1: OPSM drops its policy-gradient term, as it does
    with old_logprobs=inference. On main it read log(pi_old/pi_theta) = 0 and kept it. Sequence 1 (A > 0) and
    sequence 2 (engine below the trainer: log-ratio -2.5) are kept either way."""
    lens = [3, 3, 2]
    theta = torch.tensor([-3.0] * 6 + [-0.5, -0.5], dtype=D)
    inference = [-0.5] * 6 + [-3.0, -3.0]
    kw = dict(advantages=[-1.0, 1.0, -1.0], kl_coef=[0.0] * 3, opsm_delta=[1.0] * 3)
    recomputed = _batch(lens, inference, old=theta.tolist(), **kw)
    engine = _batch(lens, inference, **kw)
    for acfg in (ACFG, {**ACFG, "tis_cap": None}):
        _, stats = grpo(theta.clone(), recomputed, acfg, (3, 8))
        assert stats["opsm_keep"].tolist() == [False, True, True]
        assert stats["log_ratio_seq"].tolist() == pytest.approx([2.5, 2.5, -2.5])
    _, stats = grpo(theta.clone(), engine, ACFG, (3, 8))
    assert stats["opsm_keep"].tolist() == [False, True, True]
    # the masked sequence contributes no policy gradient: only sequence 1's (kept, TIS-weighted) term is left
    logp = theta.clone().requires_grad_()
    loss, _ = grpo(logp, recomputed, ACFG, (3, 8))
    (g,) = torch.autograd.grad(loss, logp)
    assert g[:3].abs().max() == 0 and g[3:6].abs().min() > 0


def test_the_kl_under_a_recomputed_pi_old_carries_the_tis_weight():
    """old_logprobs=trainer: D_t = w_t * (pi_theta/pi_old) * k3, w_t = min(pi_old/pi_engine, cap) (detached), the
    same weight as the policy-gradient term: uncapped, w * pi_theta/pi_old = pi_theta/pi_engine, the V3.2 estimator
    against the sampling policy (unbiased for samples of the engine); the cap bounds its variance like the PG's.
    tis_cap=null: no weight on either term (the ratio corrects the drift between mini-batches only)."""
    lens = [2, 3]
    theta = torch.tensor([-1.0, -2.0, -0.3, -0.7, -1.5], dtype=D)
    old = [-1.1, -1.9, -0.4, -0.6, -1.2]
    inference = [-1.3, -1.1, -0.5, -2.0, -1.2]
    ref = [-0.8, -2.5, -0.9, -0.2, -1.0]
    batch = _batch(lens, inference, advantages=[0.0, 0.0], kl_coef=[0.5, 0.25], opsm_delta=[math.inf] * 2,
                   ref=ref, old=old)
    for cap in (2.0, 100.0, None):
        acfg = {**ACFG, "tis_cap": cap}
        logp = theta.clone().requires_grad_()
        loss, stats = grpo(logp, batch, acfg, (2, 5))
        (g,) = torch.autograd.grad(loss, logp)
        lp = theta.clone().requires_grad_()
        w = torch.ones(5, dtype=D) if cap is None else torch.tensor(
            [min(math.exp(o - i), cap) for o, i in zip(old, inference)], dtype=D)
        d = w * torch.exp(lp - torch.tensor(old, dtype=D)) * k3_kl(lp, torch.tensor(ref, dtype=D))
        want = aggregate(batch.kl_coef[batch.seq_index] * d, batch.seq_index, batch.loss_mask, 2,
                         "seq_mean_token_mean", 2, 5)
        (want_g,) = torch.autograd.grad(want, lp)
        torch.testing.assert_close(loss.detach(), want.detach(), rtol=1e-14, atol=0)
        torch.testing.assert_close(g, want_g, rtol=1e-14, atol=0)
        if cap == 100.0:  # no weight at the cap: the KL's ratio is against the engine's logprobs
            against_engine = unbiased_k3_kl(theta, torch.tensor(ref, dtype=D), torch.tensor(inference, dtype=D))
            torch.testing.assert_close(stats["kl_seq"], torch.stack([against_engine[:2].mean(), against_engine[2:].mean()]),
                                       rtol=1e-14, atol=0)


def _grpo_of_main(logprobs, b, acfg, norm):
    """`trainer.objectives.grpo` with old_logprobs=inference as main computed it before issue 68 (its composition of
    the pure functions, written out): pi_old = the engine's logprobs in the ratio, OPSM and the unbiased KL."""
    mask, B = b.loss_mask, b.num_seqs
    old = b.inference_logprobs
    pg, _ = clipped_pg_loss(logprobs, old, b.advantages[b.seq_index], acfg["clip_eps_low"], acfg["clip_eps_high"])
    pg = pg * opsm_keep(b.advantages, logprobs, old, b.seq_index, mask, b.opsm_delta)[b.seq_index].to(D)
    kl = b.kl_coef[b.seq_index] * unbiased_k3_kl(logprobs, b.ref_logprobs, old)
    return aggregate(pg + kl, b.seq_index, mask, B, acfg["loss_aggregation"], *norm)


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum"])
def test_old_logprobs_inference_is_unchanged(aggregation):
    """The default path (old_logprobs=inference: no recomputed pi_old, no TIS weight): loss and gradient equal,
    bit for bit in float64, main's composition on random batches with OPSM masking some sequences."""
    g = torch.Generator().manual_seed(68)
    acfg = {**ACFG, "loss_aggregation": aggregation}
    for trial in range(6):
        lens = torch.randint(1, 9, (7,), generator=g).tolist()
        N = sum(lens)
        theta = -torch.rand(N, generator=g, dtype=D) * 3
        b = _batch(lens, (-torch.rand(N, generator=g, dtype=D) * 3).tolist(),
                   advantages=torch.randn(7, generator=g, dtype=D).tolist(),
                   kl_coef=[0.0, 0.1, 0.0, 0.3, 0.05, 0.0, 1.0],
                   opsm_delta=(torch.rand(7, generator=g, dtype=D) * 0.4 - 0.2).tolist(),
                   ref=(-torch.rand(N, generator=g, dtype=D) * 3).tolist(),
                   mask=(torch.rand(N, generator=g) > 0.2).to(D).tolist())
        if trial % 2:  # as collate builds it: every sample a whole episode (share 1)
            b.episode_share = torch.ones(7, dtype=torch.float64)
        norm = (7, int(b.loss_mask.sum()))
        lp1, lp2 = theta.clone().requires_grad_(), theta.clone().requires_grad_()
        loss, stats = grpo(lp1, b, acfg, norm)
        want = _grpo_of_main(lp2, b, acfg, norm)
        assert not stats["opsm_keep"].all()  # some sequences masked: OPSM is exercised
        assert torch.equal(loss.detach(), want.detach())
        assert torch.equal(torch.autograd.grad(loss, lp1)[0], torch.autograd.grad(want, lp2)[0])
        assert "is_weight_sum" not in stats


def test_distill_opsm_reads_the_engines_logprobs_too():
    """On-policy distillation goes through the same objective: with a recomputed pi_old its OPSM statistic is the
    engine's log-ratio as well."""
    theta = torch.tensor([-3.0, -3.0], dtype=D)
    b = _batch([2], [-0.5, -0.5], advantages=[-1.0], kl_coef=[0.0], opsm_delta=[1.0], old=[-3.0, -3.0])
    _, stats = distill(theta, b, ACFG, (1, 2))
    assert stats["opsm_keep"].tolist() == [False]


def test_truncated_is_weight_is_min_of_ratio_and_cap():
    w = truncated_is_weight(torch.tensor([-1.0, -1.0, -3.0], dtype=D), torch.tensor([-1.0, -3.0, -1.0], dtype=D), 2.0)
    assert w.tolist() == pytest.approx([1.0, 2.0, math.exp(-2.0)])
