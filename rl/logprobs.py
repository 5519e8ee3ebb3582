"""Token logprobs (and entropy) of the sampled tokens, chunked over positions, with the Keep Sampling Mask.

The LM head over a 150k vocabulary is the largest activation of an RL step: [N, V] float32 logits for N = 8192
tokens is 5 GB, and autograd would keep it (plus its softmax) alive until backward. Here the logits exist one
chunk at a time, in forward and again (recomputed) in backward, so peak extra memory is O(chunk_size * V) plus
one [V, H] gradient accumulator.

Keep Sampling Mask (DeepSeek-V3.2): the engine sampled from a top-p/top-k truncated distribution; at position t
only the ids in K_t (recorded as CSR `kept_ids`/`kept_offsets`) plus the sampled id had non-zero probability. The
training policy is renormalised over the same set so pi_theta and pi_old share one action space:

    log pi_theta(o_t) = z_t[o_t] - logsumexp_{v in K_t u {o_t}} z_t[v],   z_t = (h_t W^T + b) / temperature.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # bf16/fp16 inputs are promoted to float32 for the softmax; float64 inputs (tests) stay float64.
    return torch.promote_types(dtype, torch.float32)


def kept_matrix(
    kept_ids: torch.Tensor,
    offsets_cpu: torch.Tensor,
    targets: torch.Tensor,
    start: int,
    end: int,
    vocab: int,
    invert: bool = False,
) -> torch.Tensor:
    """Dense bool [end-start, V]: True at the kept ids of positions start..end-1 (CSR rows), target always kept.

    invert=True returns the complement (True = masked out), built directly to save a second [rows, V] buffer.
    """
    rows = end - start
    dev = targets.device
    lo, hi = int(offsets_cpu[start]), int(offsets_cpu[end])
    counts = (offsets_cpu[start + 1 : end + 1] - offsets_cpu[start:end]).to(dev)
    row_ids = torch.repeat_interleave(torch.arange(rows, device=dev), counts)
    out = torch.full((rows, vocab), invert, dtype=torch.bool, device=dev)
    out[row_ids, kept_ids[lo:hi].to(device=dev, dtype=torch.long)] = not invert
    out[torch.arange(rows, device=dev), targets[start:end]] = not invert
    return out


def _logits_chunk(hidden, weight, bias, temperature, cdt, s, e):
    """z = (h W^T + b) / T for positions s..e-1 in the compute dtype (no pass over the [c, V] logits to divide by
    T = 1, SFT's: x / 1 is x)."""
    z = F.linear(hidden[s:e], weight, bias).to(cdt)
    return z if temperature == 1.0 else z.div_(temperature)


def _drop_chunk(kept_ids, offsets_cpu, targets, s, e, vocab: int) -> torch.Tensor | None:
    """bool [e-s, V], True outside the kept sets of positions s..e-1; None without kept sets."""
    if offsets_cpu is None:
        return None
    return kept_matrix(kept_ids, offsets_cpu, targets, s, e, vocab, invert=True)


def _mask_chunk(z, kept_ids, offsets_cpu, targets, s, e):
    """-inf outside the kept sets of positions s..e-1 (in place); z unchanged without kept sets."""
    drop = _drop_chunk(kept_ids, offsets_cpu, targets, s, e, z.shape[1])
    return z if drop is None else z.masked_fill_(drop, float("-inf"))


def _entropy_of_exp(e: torch.Tensor, total: torch.Tensor, log_total: torch.Tensor, out: torch.Tensor) -> None:
    """The entropy of softmax(z) per row into `out`, from e = exp(z - max z) (overwritten), its row sums `total` and
    their logs: H = -sum p log p with p = e / total is log(total) - sum(e log e) / total, both terms >= 0 (e <= 1), so
    nothing cancels. In place: one pass over e and no [c, V] buffer, where p = e / total and xlogy(p, p) took two
    passes and a new buffer. xlogy gives 0 (not NaN) where e = 0 (ids outside a kept set)."""
    torch.sub(log_total, e.xlogy_(e).sum(-1).div_(total), out=out)


def _entropy(z: torch.Tensor) -> torch.Tensor:
    """-sum p log p of softmax(z) per row (xlogy: 0, not NaN, where p = 0)."""
    logp = torch.log_softmax(z, dim=-1)
    return -torch.special.xlogy(logp.exp(), logp.exp()).sum(-1)


def _fused_forward(z, targets, drop, inv_t: float, want_entropy: bool, want_full: bool):
    """One chunk's (logp, lse, entropy, full_entropy) from its raw logits z [c, V] (the head's output, any dtype),
    written as whole-tensor expressions for torch.compile to fuse into a few passes over z (the eager path makes
    ~10). drop [c, V] bool: masked out (Keep Sampling Mask), or None. Entropy as log(sum e) - sum_v p_v (z_v - m)
    with e = exp(z - m) (= -sum p log p; relative to the row's max, so large logits do not cancel).
    """
    z = z.to(_compute_dtype(z.dtype)) * inv_t
    full = _entropy(z) if want_full else None
    if drop is not None:
        z = z.masked_fill(drop, float("-inf"))
    m = z.amax(-1, keepdim=True)  # finite: the target is always kept
    e = torch.exp(z - m)
    total = e.sum(-1)
    lse = m.squeeze(-1) + total.log()
    logp = z.gather(1, targets[:, None]).squeeze(1) - lse
    entropy = total.log() - (e * torch.where(e > 0, z - m, 0.0)).sum(-1) / total if want_entropy else None
    return logp, lse, entropy, full


def _fused_backward(z, targets, drop, lse, g, inv_t: float, out_dtype: torch.dtype, want_bias: bool):
    """dL/dz = g (onehot(o) - p) / T for one chunk from its raw logits, fused like `_fused_forward`: (dz in
    `out_dtype` for the GEMMs, its column sums in the compute dtype for the bias, or None)."""
    z = z.to(_compute_dtype(z.dtype)) * inv_t
    p = torch.exp(z - lse[:, None])
    if drop is not None:
        p = p.masked_fill(drop, 0.0)
    onehot = torch.arange(z.shape[1], device=z.device)[None, :] == targets[:, None]
    dz = (onehot.to(p.dtype) - p) * (g * inv_t)[:, None]
    return dz.to(out_dtype), (dz.sum(0) if want_bias else None)


@functools.cache
def _compiled(fn):
    """`fn` through torch.compile, once per process (dynamic shapes: the last chunk is shorter)."""
    return torch.compile(fn, dynamic=True)


def _grad_buffers(ctx, hidden, weight, bias, lse):
    """Zeroed gradient accumulators for the inputs that need one (dW and db in the compute dtype: summing many
    bf16 partial products loses precision)."""
    need_h, need_w, need_b = ctx.needs_input_grad[:3]
    cdt = lse.dtype
    grad_h = torch.empty_like(hidden) if need_h else None
    grad_w = torch.zeros(weight.shape, dtype=cdt, device=weight.device) if need_w else None
    grad_b = torch.zeros(weight.shape[0], dtype=cdt, device=weight.device) if (need_b and bias is not None) else None
    return grad_h, grad_w, grad_b


def _end_forward(ctx, saved: tuple, temperature, chunk_size, logp, entropy, full_entropy) -> tuple:
    """Keep what backward recomputes the logits from (the [c, V] chunks themselves are never kept)."""
    ctx.save_for_backward(*saved)
    ctx.temperature, ctx.chunk_size = temperature, chunk_size
    ctx.mark_non_differentiable(entropy, full_entropy)
    return logp, entropy, full_entropy


# False once torch.addmm(..., out_dtype=) was refused (older torch, or a device without the mixed-dtype GEMM)
_MIXED_ADDMM = [True]


def add_outer(acc: torch.Tensor, dz: torch.Tensor, h: torch.Tensor) -> None:
    """acc += dz^T h, acc [V, H] in the compute dtype (float32), dz [c, V] and h [c, H] in the model's dtype.

    On CUDA the GEMM accumulates into acc itself (cuBLAS with a float32 C and beta = 1: `torch.addmm(out_dtype=)`),
    so a chunk costs one read and one write of acc. The fallback makes a [V, H] partial product in the model's
    dtype, widens it and adds it: for a 152k x 1024 head, ~2.5 GB of memory traffic per chunk (on an H100, ~130 ms
    of a 0.6B model's 1.7 s train step at 1,024-token chunks), and each partial is rounded to bf16 first."""
    if dz.dtype == acc.dtype:
        acc.addmm_(dz.t(), h)
        return
    if acc.is_cuda and _MIXED_ADDMM[0]:
        try:
            torch.addmm(acc, dz.t(), h, out_dtype=acc.dtype, out=acc)
            return
        except torch.OutOfMemoryError:
            raise  # the fallback needs more memory, not less
        except (RuntimeError, TypeError) as e:  # not in this torch/device: the fallback from now on
            _MIXED_ADDMM[0] = False
            log.warning("the LM head's weight gradient falls back to a %s product per chunk, widened and added "
                        "(torch.addmm with out_dtype=%s refused: %s)", dz.dtype, acc.dtype, str(e).splitlines()[0][:200])
    acc += (dz.t() @ h).to(acc.dtype)


def _grads_out(grad_h, grad_w, grad_b, weight, bias) -> tuple:
    """backward's return: the three gradients in the parameters' dtypes, None for the other seven inputs."""
    return (grad_h, grad_w.to(weight.dtype) if grad_w is not None else None,
            grad_b.to(bias.dtype) if grad_b is not None else None, None, None, None, None, None, None, None)


class _ChunkedTokenLogprobs(torch.autograd.Function):
    """logp_t = z_t[o_t] - lse_t over the (masked) vocabulary; only lse [N] is saved for backward.

    Backward per chunk: dL/dz_t = g_t * (onehot(o_t) - softmax(z_t)) / temperature (softmax over the kept set),
    then dL/dh = dz W and dL/dW = dz^T h, dL/db = sum_t dz.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, kept_ids, kept_offsets, temperature, chunk_size, with_entropy,
                compiled):
        N = hidden.shape[0]
        cdt = _compute_dtype(hidden.dtype)
        offsets_cpu = kept_offsets.cpu() if kept_offsets is not None else None
        logp = torch.empty(N, dtype=cdt, device=hidden.device)
        lse = torch.empty(N, dtype=cdt, device=hidden.device)
        entropy = torch.empty(N if with_entropy else 0, dtype=cdt, device=hidden.device)
        # The full-vocabulary entropy is only different (and only costs a pass) when kept sets restrict the softmax.
        full_entropy = torch.empty(N if with_entropy and offsets_cpu is not None else 0, dtype=cdt, device=hidden.device)
        ctx.compiled = compiled
        for s in range(0, N, chunk_size):
            e = min(s + chunk_size, N)
            if compiled:  # the head's GEMM as it is, the softmax statistics fused (`_fused_forward`)
                drop = _drop_chunk(kept_ids, offsets_cpu, targets, s, e, weight.shape[0])
                lp, ls, ent, full = _compiled(_fused_forward)(F.linear(hidden[s:e], weight, bias), targets[s:e], drop,
                                                               1.0 / temperature, with_entropy, bool(full_entropy.numel()))
                logp[s:e], lse[s:e] = lp, ls
                if with_entropy:
                    entropy[s:e] = ent
                if full is not None:
                    full_entropy[s:e] = full
                continue
            z = _logits_chunk(hidden, weight, bias, temperature, cdt, s, e)
            if full_entropy.numel():
                full_entropy[s:e] = _entropy(z)
            z = _mask_chunk(z, kept_ids, offsets_cpu, targets, s, e)
            # logsumexp by hand, in place, so the chunk needs one [c, V] buffer instead of two; results go straight
            # into the outputs (out=), without a copy each
            target_z = z.gather(1, targets[s:e, None]).squeeze(1)
            zmax = z.amax(dim=-1)  # finite: the target is always kept
            total = z.sub_(zmax[:, None]).exp_().sum(-1)
            log_total = total.log()
            torch.add(zmax, log_total, out=lse[s:e])
            torch.sub(target_z, lse[s:e], out=logp[s:e])
            if with_entropy:
                _entropy_of_exp(z, total, log_total, out=entropy[s:e])
            del z
        return _end_forward(ctx, (hidden, weight, bias, targets, kept_ids, kept_offsets, lse), temperature,
                            chunk_size, logp, entropy, full_entropy)

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy, _grad_full_entropy):
        hidden, weight, bias, targets, kept_ids, kept_offsets, lse = ctx.saved_tensors
        N, cdt = hidden.shape[0], lse.dtype
        offsets_cpu = kept_offsets.cpu() if kept_offsets is not None else None
        grad_h, grad_w, grad_b = _grad_buffers(ctx, hidden, weight, bias, lse)
        grad_logp = grad_logp.to(cdt)
        for s in range(0, N, ctx.chunk_size):
            e = min(s + ctx.chunk_size, N)
            g = grad_logp[s:e]
            if ctx.compiled:
                drop = _drop_chunk(kept_ids, offsets_cpu, targets, s, e, weight.shape[0])
                dz_in, dz_sum = _compiled(_fused_backward)(F.linear(hidden[s:e], weight, bias), targets[s:e], drop,
                                                           lse[s:e], g, 1.0 / ctx.temperature, hidden.dtype,
                                                           grad_b is not None)
                z = dz = None
            else:
                z = _mask_chunk(_logits_chunk(hidden, weight, bias, ctx.temperature, cdt, s, e), kept_ids,
                                offsets_cpu, targets, s, e)
                # dz = g * (onehot - p) / T, built in place in the logits buffer (exp(-inf) = 0 off the kept set);
                # each row's target gets g / T added (one scatter: a row has one target)
                gt = g if ctx.temperature == 1.0 else g / ctx.temperature
                dz = z.sub_(lse[s:e, None]).exp_().mul_(-gt[:, None])
                dz.scatter_add_(1, targets[s:e, None], gt[:, None])
                dz_in = dz.to(hidden.dtype)
                dz_sum = dz.sum(0) if grad_b is not None else None
            if grad_h is not None:
                torch.mm(dz_in, weight, out=grad_h[s:e])  # into the rows of grad_h, no copy
            if grad_w is not None:
                add_outer(grad_w, dz_in, hidden[s:e])
            if grad_b is not None:
                grad_b += dz_sum
            del z, dz, dz_in
        return _grads_out(grad_h, grad_w, grad_b, weight, bias)


# The full-vocabulary entropy is a metric only; with the support head it costs a dense row, so every
# FULL_ENTROPY_STRIDE-th position gets one (the others are NaN and left out of the mean).
FULL_ENTROPY_STRIDE = 8
# The support head's chunk (at most `chunk_size`): fewer positions have a smaller union of kept ids. On SmolLM2's
# real kept sets (top_p 0.95, 49k vocabulary) 1024 positions need ~all ids, 256 about half (benchmarks/README.md).
SUPPORT_CHUNK = 256


def support_columns(kept_ids, offsets_cpu, targets, s, e, vocab):
    """The kept-set entries of positions s..e-1 as (U, rows, cols, target_cols): U the sorted ids the chunk needs
    (every kept id and target; None when they are over half the vocabulary, then the whole head is used and cols
    are vocabulary ids), entry k is (row rows[k], column cols[k] of U)."""
    dev = targets.device
    lo, hi = int(offsets_cpu[s]), int(offsets_cpu[e])
    counts = (offsets_cpu[s + 1 : e + 1] - offsets_cpu[s:e]).to(dev)
    rows = torch.repeat_interleave(torch.arange(e - s, device=dev), counts)
    ids = torch.cat([kept_ids[lo:hi].to(device=dev, dtype=torch.long), targets[s:e]])
    rows = torch.cat([rows, torch.arange(e - s, device=dev)])
    U, cols = torch.unique(ids, return_inverse=True)
    if U.numel() > vocab // 2:  # little to save, and the [|U|, H] copy of the head would be large
        U, cols = None, ids
    return U, rows, cols, cols[hi - lo :]


def _support_logits(hidden, weight, bias, temperature, cdt, s, e, U, rows, cols):
    """z over the chunk's support U (or the whole vocabulary), -inf outside each position's kept set."""
    w = weight if U is None else weight.index_select(0, U)
    b = bias if (bias is None or U is None) else bias.index_select(0, U)
    z = F.linear(hidden[s:e], w, b).to(cdt).div_(temperature)
    keep = torch.zeros(z.shape, dtype=torch.bool, device=z.device)
    keep[rows, cols] = True
    return z.masked_fill_(~keep, float("-inf")), w


class _SupportTokenLogprobs(torch.autograd.Function):
    """The Keep Sampling Mask logprob over the kept ids only (DeepSeek-V3.2's renormalised policy):

        log pi_theta(o_t) = z_t[o_t] - logsumexp_{v in K_t u {o_t}} z_t[v],   z_t[v] = (h_t . W_v + b_v) / T,

    computed for the union U of a chunk's kept sets instead of the vocabulary: the head's rows W_U are gathered,
    the logits are [c, |U|] instead of [c, V], and the backward adds dW only to the rows in U (index_add). Same
    value and gradient as `_ChunkedTokenLogprobs` with kept sets; c * |U| * H FLOPs instead of c * V * H.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, kept_ids, kept_offsets, temperature, chunk_size, with_entropy,
                compiled):  # compiled: not used here (its gathers and index_adds are not what torch.compile fuses)
        N, V = hidden.shape[0], weight.shape[0]
        cdt = _compute_dtype(hidden.dtype)
        offsets_cpu = kept_offsets.cpu()
        logp = torch.empty(N, dtype=cdt, device=hidden.device)
        lse = torch.empty(N, dtype=cdt, device=hidden.device)
        entropy = torch.empty(N if with_entropy else 0, dtype=cdt, device=hidden.device)
        full_entropy = torch.full((N if with_entropy else 0,), float("nan"), dtype=cdt, device=hidden.device)
        for s in range(0, N, chunk_size):
            e = min(s + chunk_size, N)
            U, rows, cols, tcols = support_columns(kept_ids, offsets_cpu, targets, s, e, V)
            z, _ = _support_logits(hidden, weight, bias, temperature, cdt, s, e, U, rows, cols)
            target_z = z.gather(1, tcols[:, None]).squeeze(1)
            lse[s:e] = torch.logsumexp(z, dim=-1)
            logp[s:e] = target_z - lse[s:e]
            if with_entropy:
                p = z.sub_(lse[s:e, None]).exp_()
                entropy[s:e] = -torch.special.xlogy(p, p).sum(-1)
                first = -(-s // FULL_ENTROPY_STRIDE) * FULL_ENTROPY_STRIDE
                if first < e:
                    sample = torch.arange(first, e, FULL_ENTROPY_STRIDE, device=hidden.device)
                    full_entropy[sample] = _entropy(F.linear(hidden[sample], weight, bias).to(cdt).div_(temperature))
            del z
        return _end_forward(ctx, (hidden, weight, bias, targets, kept_ids, kept_offsets, lse), temperature,
                            chunk_size, logp, entropy, full_entropy)

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy, _grad_full_entropy):
        hidden, weight, bias, targets, kept_ids, kept_offsets, lse = ctx.saved_tensors
        (N, V), cdt, T = (hidden.shape[0], weight.shape[0]), lse.dtype, ctx.temperature
        offsets_cpu = kept_offsets.cpu()
        grad_h, grad_w, grad_b = _grad_buffers(ctx, hidden, weight, bias, lse)
        grad_logp = grad_logp.to(cdt)
        for s in range(0, N, ctx.chunk_size):
            e = min(s + ctx.chunk_size, N)
            U, rows, cols, tcols = support_columns(kept_ids, offsets_cpu, targets, s, e, V)
            z, w = _support_logits(hidden, weight, bias, T, cdt, s, e, U, rows, cols)
            g = grad_logp[s:e]
            dz = z.sub_(lse[s:e, None]).exp_().mul_(-(g / T)[:, None])  # g * (onehot - p) / T
            dz[torch.arange(e - s, device=dz.device), tcols] += g / T
            dz_in = dz.to(hidden.dtype)
            if grad_h is not None:
                grad_h[s:e] = dz_in @ w
            if grad_w is not None:
                if U is None:
                    add_outer(grad_w, dz_in, hidden[s:e])
                else:
                    grad_w.index_add_(0, U, (dz_in.t() @ hidden[s:e]).to(cdt))
            if grad_b is not None:
                if U is None:
                    grad_b += dz.sum(0)
                else:
                    grad_b.index_add_(0, U, dz.sum(0))
            del z, dz, dz_in
        return _grads_out(grad_h, grad_w, grad_b, weight, bias)


def token_logprobs(
    hidden: torch.Tensor,
    lm_weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    kept_ids: torch.Tensor | None = None,
    kept_offsets: torch.Tensor | None = None,
    lm_bias: torch.Tensor | None = None,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    support_head: bool = False,
    compiled: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """log pi_theta(o_t) for each generated position, from its final hidden state, chunked over positions.

    hidden [N, H] is already gathered at the generated positions (`TrainBatch.logit_index`), lm_weight [V, H],
    targets [N] the sampled ids. With kept_ids (int32 [M]) / kept_offsets (long [N+1], CSR) the log-softmax is
    over K_t u {o_t} (module docstring); an empty K_t leaves only o_t, so logp_t = 0. Gradients flow to hidden,
    lm_weight and lm_bias. with_entropy=True also returns, without gradient, the entropy [N] of the distribution the
    logprob is taken under (the renormalised kept set when there is one) and the full-vocabulary entropy [N] (the
    same tensor without kept sets). Outputs are float32 (float64 when the inputs are float64).
    support_head (with kept sets): the head over each chunk's kept ids only (`_SupportTokenLogprobs`), same values;
    its full-vocabulary entropy is computed at every FULL_ENTROPY_STRIDE-th position and NaN elsewhere.
    compiled (the dense head): each chunk's softmax statistics and logit gradient through torch.compile
    (`_fused_forward`, `_fused_backward`), same values.
    """
    if (kept_ids is None) != (kept_offsets is None):
        raise ValueError("kept_ids and kept_offsets go together")
    if kept_offsets is not None and kept_offsets.shape[0] != hidden.shape[0] + 1:
        raise ValueError(f"kept_offsets has {kept_offsets.shape[0]} entries for {hidden.shape[0]} positions (need N+1)")
    if chunk_size < 1:
        raise ValueError("chunk_size must be >= 1")
    fn = _SupportTokenLogprobs if (support_head and kept_offsets is not None) else _ChunkedTokenLogprobs
    if fn is _SupportTokenLogprobs:
        chunk_size = min(chunk_size, SUPPORT_CHUNK)
    logp, entropy, full_entropy = fn.apply(
        hidden, lm_weight, lm_bias, targets.long(), kept_ids, kept_offsets, float(temperature), int(chunk_size),
        bool(with_entropy), bool(compiled),
    )
    if not with_entropy:
        return logp, None, None
    return logp, entropy, (full_entropy if kept_offsets is not None else entropy)


def token_logprobs_from_logits(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    kept_ids: torch.Tensor | None = None,
    kept_offsets: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unchunked reference: (logp [N], entropy [N]) from full [N, V] logits (temperature already applied).

    Materialises the whole [N, V] buffer; for tests and small inputs only.
    """
    N, V = logits.shape
    if kept_offsets is not None:
        drop = kept_matrix(kept_ids, kept_offsets.cpu(), targets.long(), 0, N, V, invert=True)
        logits = logits.masked_fill(drop, float("-inf"))
    logsm = torch.log_softmax(logits, dim=-1)
    logp = logsm.gather(1, targets.long()[:, None]).squeeze(1)
    entropy = -torch.special.xlogy(logsm.exp(), logsm.exp()).sum(-1)
    return logp, entropy.detach()
