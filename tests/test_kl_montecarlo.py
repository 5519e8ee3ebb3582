"""Monte-Carlo check that the V3.2 importance-weighted K3 gives the exact KL gradient, and the detached one does not.

Setting: one categorical policy over 6 actions, logits theta (a float64 leaf). Actions are sampled from a fixed
pi_old != pi_theta (the off-policy situation of a rollout); the exact objective is
KL(pi_theta || pi_ref) = sum_a pi_theta(a) log(pi_theta(a) / pi_ref(a)).

Tolerances come from the sample itself: the MC gradient is a mean of n i.i.d. per-sample gradients, so each
component's standard error is std/sqrt(n) and a correct estimator lands within a few standard errors.
"""

import torch

from rl.losses import k3_kl, unbiased_k3_kl

D = torch.float64
N_SAMPLES = 200_000
Z = 5.0  # standard errors allowed; P(|N(0,1)| > 5) ~ 6e-7 per component

THETA = torch.tensor([0.5, -0.3, 1.0, 0.0, -1.0, 0.2], dtype=D)
OLD = torch.tensor([0.1, 0.2, 0.6, -0.4, -0.5, 0.5], dtype=D)  # behaviour policy (rollout engine)
REF = torch.tensor([-1.5, 1.2, -0.8, 1.8, 0.6, -1.2], dtype=D)


def _setup():
    theta = THETA.clone().requires_grad_()
    logp = torch.log_softmax(theta, -1)
    old = torch.log_softmax(OLD, -1)
    ref = torch.log_softmax(REF, -1)
    return theta, logp, old, ref


def _exact_kl_grad():
    theta, logp, _, ref = _setup()
    kl = (logp.exp() * (logp - ref)).sum()
    (g,) = torch.autograd.grad(kl, theta)
    return kl.detach(), g


def _detached_ratio_k3(logp, ref, old):
    return torch.exp(logp - old).detach() * k3_kl(logp, ref)


def _per_action_jacobian(estimator):
    """J[a] = d estimator(action=a) / d theta, so a sample's gradient is J[its action]."""
    return torch.autograd.functional.jacobian(
        lambda th: estimator(torch.log_softmax(th, -1), torch.log_softmax(REF, -1), torch.log_softmax(OLD, -1)),
        THETA.clone(),
    )


def _mc(estimator):
    """(value, gradient, per-component standard error) of the sample mean of `estimator` under pi_old."""
    theta, logp, old, ref = _setup()
    gen = torch.Generator().manual_seed(1234)
    actions = torch.multinomial(old.exp(), N_SAMPLES, replacement=True, generator=gen)
    values = estimator(logp[actions], ref[actions], old[actions])
    est = values.mean()
    (g,) = torch.autograd.grad(est, theta)
    per_sample = _per_action_jacobian(estimator)[actions]  # [n, 6]
    # The autograd gradient of the mean must be the mean of the per-sample gradients.
    torch.testing.assert_close(per_sample.mean(0), g, rtol=1e-9, atol=1e-12)
    se_grad = per_sample.std(0) / N_SAMPLES**0.5
    se_value = values.detach().std() / N_SAMPLES**0.5
    return est.detach(), g, se_grad, se_value


def test_setup_is_off_policy_and_kl_nontrivial():
    kl, g = _exact_kl_grad()
    p, q = torch.softmax(THETA, -1), torch.softmax(OLD, -1)
    assert (p - q).abs().sum() > 0.2 and kl > 0.3 and g.abs().max() > 0.1


def test_unbiased_k3_gradient_matches_exact_kl_gradient():
    kl, g_exact = _exact_kl_grad()
    value, g_mc, se_grad, se_value = _mc(unbiased_k3_kl)
    assert abs(value - kl) <= Z * se_value
    err = (g_mc - g_exact).abs()
    assert (err <= Z * se_grad).all(), f"errors {err} vs tolerance {Z * se_grad}"


def test_detached_ratio_gradient_is_biased():
    _, g_exact = _exact_kl_grad()
    _, g_mc, se_grad, _ = _mc(_detached_ratio_k3)
    z = (g_mc - g_exact).abs() / se_grad
    # Far outside the sampling noise: the detached estimator targets a different vector.
    assert z.max() > 10 * Z, f"detached-ratio gradient error only {z.max():.1f} standard errors"


def test_expected_gradients_exactly():
    """No sampling: E_{pi_old}[grad] = sum_a pi_old(a) J[a], exact for the unbiased one, off for the detached."""
    _, g_exact = _exact_kl_grad()
    q = torch.softmax(OLD, -1)
    g_unbiased = (q[:, None] * _per_action_jacobian(unbiased_k3_kl)).sum(0)
    g_detached = (q[:, None] * _per_action_jacobian(_detached_ratio_k3)).sum(0)
    torch.testing.assert_close(g_unbiased, g_exact, rtol=1e-12, atol=1e-14)
    # Detached: E_theta[(1 - pi_ref/pi_theta) grad log pi_theta] = sum_a (pi_theta - pi_ref)(a) grad log pi_theta(a).
    p, r = torch.softmax(THETA, -1), torch.softmax(REF, -1)
    grad_logp = torch.eye(6, dtype=D) - p[None, :]  # row a: d log p_a / d theta
    torch.testing.assert_close(g_detached, ((p - r)[:, None] * grad_logp).sum(0), rtol=1e-12, atol=1e-14)
    assert (g_detached - g_exact).abs().max() > 0.03
