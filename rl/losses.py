"""GRPO objective with the DeepSeek-V3.2 stabilisers, on-policy distillation's per-token advantages, and the SFT loss,
as small pure functions over tensors.

Layout (see `rl.trajectory.TrainBatch`): token tensors are flat `[N]` over the generated positions of a
micro-batch, `seq_index[N]` maps each token to its sample `0..B-1`, and per-sample tensors are `[B]`.
`loss_mask[N]` is 1 for policy-generated tokens; everything is aggregated over those only.

Notation: `logprobs` = log pi_theta(o_t) (the trainer's), `old_logprobs` = log pi_old(o_t) (the batch's
`inference_logprobs`: the engine's logprob of the sampled token; with algorithm.old_logprobs=trainer the trainer's
recomputation, and then `sampling_logprobs` = the engine's, which OPSM reads), `ref_logprobs` = log pi_ref(o_t),
`teacher_logprobs` = log pi_teacher(o_t). Every function works in any float dtype; tests run them in float64.
"""

from __future__ import annotations

import torch

# Bound on log-ratios before `exp`. exp(20) ~ 4.9e8 stays finite in float32 (and in its products with
# advantages and gradients), while any real policy ratio is far inside it; without it a token with
# logprobs = -1e4 against old_logprobs = -1 would give exp(1e4) = inf and inf * 0 = NaN in backward. Clamping
# zeroes the gradient beyond the bound, which only touches tokens that are already pathological.
LOG_RATIO_CLAMP = 20.0

AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum")
# An advantage counts as negative for OPSM only below -ADV_TOL: a group mean rounded in float leaves advantages of
# +-1e-17 on samples whose reward equals the mean, which are not negative.
ADV_TOL = 1e-9


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's K3 estimator of KL(pi_theta || pi_ref) per token (samples drawn from pi_theta):

        k3 = pi_ref/pi_theta - log(pi_ref/pi_theta) - 1 = exp(d) - d - 1,  d = ref_logprobs - logprobs.

    Computed in log space; d is clamped to [-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] so that very negative logprobs
    (e.g. -1e4 for a token the reference finds impossible) give a large finite value instead of inf/NaN.
    k3 >= 0 for every d.
    """
    d = (ref_logprobs - logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.expm1(d) - d


def unbiased_k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V3.2 unbiased KL estimate for tokens sampled from pi_old (not pi_theta):

        D_t = (pi_theta/pi_old) * (pi_ref/pi_theta - log(pi_ref/pi_theta) - 1).

    The importance ratio is deliberately NOT detached: E_{pi_old}[ratio * k3] = E_{pi_theta}[k3] = KL(pi_theta||pi_ref)
    as a function of theta, so its gradient is the exact KL gradient. Detaching the ratio gives
    E_theta[grad k3] = sum_a (pi_theta - pi_ref) grad log pi_theta, which is a different (biased) direction.
    """
    ratio = torch.exp((logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return ratio * k3_kl(logprobs, ref_logprobs)


def clipped_pg_loss(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, adv_tok: torch.Tensor, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO/GRPO clipped surrogate per token, with asymmetric ("clip-higher") bounds:

        r_t = pi_theta/pi_old,  loss_t = -min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A).

    Returns (loss_t, clipped_t) where clipped_t is 1.0 where the clipped branch is the active one (its gradient
    is zero), i.e. the usual PPO clip fraction indicator.
    """
    ratio = torch.exp((logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    unclipped = -ratio * adv_tok
    clipped = -ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv_tok
    loss = torch.maximum(unclipped, clipped)
    return loss, (clipped > unclipped).to(logprobs.dtype).detach()


def seq_sum(x: torch.Tensor, seq_index: torch.Tensor, mask: torch.Tensor, B: int) -> torch.Tensor:
    """Per-sequence masked sum: out_i = sum_{t: seq(t)=i} mask_t x_t."""
    out = torch.zeros(B, dtype=x.dtype, device=x.device)
    return out.index_add(0, seq_index, x * mask.to(x.dtype))


def seq_mean(x: torch.Tensor, seq_index: torch.Tensor, mask: torch.Tensor, B: int) -> torch.Tensor:
    """Per-sequence masked mean: out_i = sum_t mask_t x_t / sum_t mask_t, and 0 for empty sequences."""
    total = seq_sum(x, seq_index, mask, B)
    count = torch.zeros(B, dtype=x.dtype, device=x.device).index_add_(0, seq_index, mask.to(x.dtype))
    # Denominator 1 (not a where() on the quotient) for empty rows: 0/0 would put NaN into the backward.
    return total / torch.where(count > 0, count, torch.ones_like(count))


def opsm_keep(
    advantages: torch.Tensor,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    seq_index: torch.Tensor,
    loss_mask: torch.Tensor,
    delta: torch.Tensor,
) -> torch.Tensor:
    """Off-policy sequence masking (DeepSeek-V3.2). Sequence i keeps its policy-gradient term unless

        A_i < 0  and  1/|o_i| sum_t log(pi_old(o_t) / pi_theta(o_t)) > delta_i

    (strict inequalities; A_i < 0 means below -ADV_TOL, float rounding of the group mean aside), pi_old = the
    probability the tokens were sampled with: the inference engine's (`grpo_loss` passes the engine's logprobs here
    also when the ratio's pi_old is the trainer's recomputation), so the statistic sees every source of
    off-policyness: staleness, the engine/trainer gap and the earlier mini-batches' updates. Computed on detached
    logprobs: the mask is a constant of the step. Sequences with no generated token are kept, and delta = +inf never
    masks. Returns bool [B].
    """
    B = advantages.shape[0]
    drift = seq_mean((old_logprobs - logprobs).detach(), seq_index, loss_mask, B)
    has_tokens = torch.zeros(B, dtype=loss_mask.dtype, device=loss_mask.device).index_add_(0, seq_index, loss_mask) > 0
    masked = (advantages < -ADV_TOL) & (drift > delta) & has_tokens
    return ~masked


def aggregate(
    x: torch.Tensor,
    seq_index: torch.Tensor,
    mask: torch.Tensor,
    B: int,
    aggregation: str,
    norm_seqs: float,
    norm_tokens: int,
    episode_share: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce per-token values to this micro-batch's share of the mini-batch objective.

    seq_mean_token_mean (paper, 1/G sum_i 1/|o_i| sum_t): sum_i s_i seq_mean_i / norm_seqs
    token_mean:                                          sum_t mask_t x_t / max(norm_tokens, 1)
    seq_mean_token_sum:                                  sum_i seq_sum_i / norm_seqs
    The norms count the whole mini-batch (all micro-batches, all ranks) so that the micro-batch losses sum to
    the mini-batch loss under gradient accumulation; norm_seqs counts episodes (`rl.batching.minibatch_norm`: the
    sum of the shares).

    s_i = `episode_share` [B] (None = all 1): sequence i's share of its episode's loss tokens. A managed agent
    episode o_i trains as k+1 context segments; with s = n_seg / n_episode, sum_seg s * seq_mean_seg =
    1/|o_i| sum_{t in o_i} x_t and sum_seg seq_sum_seg = sum_{t in o_i} x_t, so the episode weighs what it would
    as one sequence however often its context was reset (`rl.advantages.expand_segments`).
    """
    if aggregation == "seq_mean_token_mean":
        per_seq = seq_mean(x, seq_index, mask, B)
        if episode_share is not None:
            per_seq = per_seq * episode_share.to(per_seq.dtype)
        return per_seq.sum() / norm_seqs
    if aggregation == "token_mean":  # a mini-batch with no loss token (all cut or masked): 0, not 0/0
        return (x * mask.to(x.dtype)).sum() / max(norm_tokens, 1)
    if aggregation == "seq_mean_token_sum":
        return seq_sum(x, seq_index, mask, B).sum() / norm_seqs
    raise ValueError(f"unknown aggregation {aggregation!r}; expected one of {AGGREGATIONS}")


def truncated_is_weight(old_logprobs: torch.Tensor, inference_logprobs: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance sampling (TIS) for samples drawn by an inference engine while pi_old is the trainer's
    recomputation of the same policy:

        w_t = min(pi_old(o_t) / pi_inference(o_t), cap),

    which corrects the policy gradient and the unbiased KL (`grpo_loss`) for the engine/trainer mismatch and the
    staleness of the samples, and bounds their variance. Detached."""
    return torch.exp((old_logprobs - inference_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).clamp(max=cap).detach()


def distill_token_advantages(
    advantages: torch.Tensor,
    seq_index: torch.Tensor,
    old_logprobs: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    reward_coef: torch.Tensor,
    distill_coef: torch.Tensor,
) -> torch.Tensor:
    """On-policy distillation as a per-token advantage (the student samples, the teacher grades every token):

        A_{i,t} = a_i * A_i + c_i * (log pi_teacher(o_t) - log pi_old(o_t)),

    A_i = the sample's GRPO advantage, a_i = `reward_coef` (0: distillation alone), c_i = `distill_coef`. The second
    term is minus the sampled-token estimate of the reverse KL, KL(pi_student || pi_teacher) = E_{o~pi_student}[log
    pi_student(o) - log pi_teacher(o)], at each position. Put into the policy-gradient surrogate (ratio r_t =
    pi_theta/pi_old, r = 1 on-policy), -E[r_t A_{i,t}] has the gradient c * E_{o~pi_theta}[(log pi_theta(o_t) - log
    pi_teacher(o_t)) grad log pi_theta(o_t)] = c * grad_theta KL(pi_theta(.|s_t) || pi_teacher(.|s_t)) at every visited
    state s_t (E[grad log pi] = 0 takes the baseline away); the effect of a token on later states is not credited
    (discount 0, as in Thinking Machines' and slime's on-policy distillation). With Keep Sampling Mask both logprobs
    are renormalised over the sampled kept set (the teacher's forward applies the batch's kept sets), so the KL is
    the one between the truncated distributions the student actually samples from. Detached: a constant of the step.
    Returns [N]."""
    gap = (teacher_logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return ((reward_coef * advantages)[seq_index] + distill_coef[seq_index] * gap).detach()


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    seq_index: torch.Tensor,
    loss_mask: torch.Tensor,
    advantages: torch.Tensor,
    kl_coef: torch.Tensor,
    opsm_delta: torch.Tensor,
    *,
    eps_low: float,
    eps_high: float,
    unbiased_kl: bool = True,
    aggregation: str = "seq_mean_token_mean",
    norm_seqs: float,
    norm_tokens: int,
    is_weight: torch.Tensor | None = None,
    token_advantages: torch.Tensor | None = None,
    sampling_logprobs: torch.Tensor | None = None,
    episode_share: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO loss of one micro-batch with OPSM and a per-sample KL strength:

        L = agg_{i,t}[ M_i * w_t * pg_{i,t} + beta_i * w_t * D_{i,t} ],

    pg = clipped surrogate (`clipped_pg_loss`, ratio pi_theta/pi_old), M_i = `opsm_keep` (applies to the PG term
    only, never to the KL) on mean_t log(pi_sampling/pi_theta), pi_sampling = `sampling_logprobs` (the engine's, the
    probability the tokens were sampled with, as V3.2 defines OPSM; None = `old_logprobs`),
    D = `unbiased_k3_kl` (ratio pi_theta/pi_old; or plain `k3_kl` when unbiased_kl=False, which gets no w_t),
    beta_i = kl_coef[i], agg = `aggregate` (with `episode_share`),
    w_t = `is_weight` (a constant per token, 1 when None): the truncated importance weight pi_old/pi_inference when
    pi_old is recomputed by the trainer (`truncated_is_weight`). Uncapped, w_t * pi_theta/pi_old =
    pi_theta/pi_inference: both terms are then the estimators against the sampling policy,
    E_{pi_inference}[w r k3] = E_{pi_theta}[k3] = KL(pi_theta || pi_ref) with its exact gradient; the cap gives up
    that unbiasedness on the capped tokens for bounded variance, in both terms alike. With w = 1 (no recomputation,
    or tis_cap null) the ratios correct only what separates pi_theta from pi_old. ref_logprobs=None means no
    reference model was run; then every kl_coef must be 0. `token_advantages` [N] (on-policy distillation,
    `distill_token_advantages`) replace A_i in the policy-gradient term; OPSM still takes the sign of `advantages`
    (the caller passes the reward part: the teacher term averages to minus the reverse KL, <= 0, and would count
    almost every distilled sequence as negative).

    Returns (loss, stats); stats are detached: pg_loss / kl_loss (aggregated like the loss, kl_loss includes
    beta, so loss = pg_loss + kl_loss), kl_seq[B] (per-sample mean KL estimate, without beta), opsm_keep[B],
    log_ratio_seq[B] (per-sample mean log(pi_sampling/pi_theta), the OPSM statistic), clip_tok_sum, tok_sum.
    """
    B = advantages.shape[0]
    mask = loss_mask.to(logprobs.dtype)
    adv_tok = advantages[seq_index] if token_advantages is None else token_advantages
    pg_tok, clip_tok = clipped_pg_loss(logprobs, old_logprobs, adv_tok.to(logprobs.dtype), eps_low, eps_high)
    sampled = old_logprobs if sampling_logprobs is None else sampling_logprobs.to(logprobs.dtype)
    keep = opsm_keep(advantages, logprobs, sampled, seq_index, mask, opsm_delta)
    pg_tok = pg_tok * keep[seq_index].to(pg_tok.dtype)
    if is_weight is not None:
        pg_tok = pg_tok * is_weight.detach().to(pg_tok.dtype)

    if ref_logprobs is None:
        if bool((kl_coef != 0).any()):
            raise ValueError("ref_logprobs is None but some kl_coef != 0: the reference model must be run")
        kl_tok = torch.zeros_like(logprobs)
    elif unbiased_kl:
        kl_tok = unbiased_k3_kl(logprobs, ref_logprobs, old_logprobs)
        if is_weight is not None:
            kl_tok = kl_tok * is_weight.detach().to(kl_tok.dtype)
    else:
        kl_tok = k3_kl(logprobs, ref_logprobs)
    kl_term = kl_coef[seq_index].to(logprobs.dtype) * kl_tok

    agg = lambda x: aggregate(x, seq_index, mask, B, aggregation, norm_seqs, norm_tokens, episode_share)  # noqa: E731
    loss = agg(pg_tok + kl_term)
    with torch.no_grad():
        stats = {
            "pg_loss": agg(pg_tok),
            "kl_loss": agg(kl_term),
            "kl_seq": seq_mean(kl_tok, seq_index, mask, B),
            "opsm_keep": keep,
            "log_ratio_seq": seq_mean(sampled - logprobs, seq_index, mask, B),
            "clip_tok_sum": (clip_tok * mask).sum(),
            "tok_sum": mask.sum(),
        }
    return loss, {k: v.detach() for k, v in stats.items()}


def sft_loss(logprobs: torch.Tensor, loss_mask: torch.Tensor, *, norm_tokens: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Supervised fine-tuning: the per-token mean negative log-likelihood of the loss tokens (the assistant's),

        L = -1/N_tok * sum_t m_t log pi_theta(y_t),

    m_t = `loss_mask` (1 on the assistant's tokens, 0 on prompts, tool results and template scaffolding), N_tok =
    `norm_tokens`: the loss tokens of the whole mini-batch (all micro-batches, all ranks), so that the micro-batch
    losses sum to the mini-batch's mean under gradient accumulation; a mini-batch with none gives 0, not 0/0.
    Masked positions contribute nothing, also where their logprob is -inf.

    Returns (loss, stats); stats are detached: nll_loss (= loss: this micro-batch's share of the mean) and tok_sum
    (its loss tokens)."""
    mask = loss_mask.to(logprobs.dtype)
    nll = torch.where(mask > 0, -logprobs, torch.zeros_like(logprobs)) * mask
    loss = nll.sum() / max(int(norm_tokens), 1)
    return loss, {"nll_loss": loss.detach(), "tok_sum": mask.sum().detach()}
