"""Per sampled row, what training needs from vLLM's processed distribution (rollout/vllm_capture.py):

    processed [R, V]  (-inf outside the top-k/top-p kept set; logprobs, or logits with any per-row offset)
      -> lp    [R]     log pi_old(sampled id) under the truncated, renormalised distribution
                       (logits: x[tok] - logsumexp(x); logprobs: x[tok])
         ids   [R, K]  the first K kept ids in id order, -1 after the last (Keep Sampling Mask's kept set)
         total [R]     the exact number of kept ids (a row with total > K was cut: its set is incomplete)

On CUDA one fused Triton kernel reads each row once (online logsumexp, a running count and a prefix-sum
compaction of the finite ids), instead of top-k + cast + logsumexp passes over the [R, V] tensor, which cost
~14% of decode throughput at V=152k (benchmarks/README.md). Elsewhere (tests, CPU) the same result in torch.
"""

from __future__ import annotations

import torch

try:  # vLLM's GPU workers always have triton; the CPU test machines may not
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None


def reduce_rows_torch(processed: torch.Tensor, sampled: torch.Tensor, num_ids: int, logits: bool):
    """Reference implementation (and the CPU path); see the module docstring."""
    tok = sampled.reshape(-1).long()
    x = processed.float()
    lp = x.gather(1, tok[:, None]).squeeze(1)
    if logits:
        lp = lp - torch.logsumexp(x, dim=-1)
    if num_ids <= 0:
        return lp, None, None
    finite = torch.isfinite(x)
    total = finite.sum(1, dtype=torch.int32)
    pos = finite.cumsum(1) - 1
    sel = finite & (pos < num_ids)
    rows, cols = sel.nonzero(as_tuple=True)
    ids = torch.full((x.shape[0], num_ids), -1, dtype=torch.int32, device=x.device)
    ids[rows, pos[rows, cols]] = cols.to(torch.int32)
    return lp, ids, total


if triton is not None:

    @triton.jit
    def _reduce_kernel(x_ptr, stride, V, tok_ptr, lp_ptr, ids_ptr, total_ptr, K,
                       LOGITS: tl.constexpr, WITH_IDS: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        base = x_ptr + row.to(tl.int64) * stride
        m = tl.full([BLOCK], float("-inf"), tl.float32)  # per-lane running max and scaled sum (online softmax)
        s = tl.zeros([BLOCK], tl.float32)
        count = tl.sum(tl.zeros([BLOCK], tl.int32), axis=0)
        for start in range(0, V, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
            finite = x > float("-inf")
            if LOGITS:
                new_m = tl.maximum(m, x)
                safe = tl.where(new_m > float("-inf"), new_m, 0.0)
                s = s * tl.exp(m - safe) + tl.where(finite, tl.exp(x - safe), 0.0)
                m = new_m
            f = finite.to(tl.int32)
            if WITH_IDS:
                pos = count + tl.cumsum(f, axis=0) - 1
                tl.store(ids_ptr + row.to(tl.int64) * K + pos, cols, mask=finite & (pos < K))
            count += tl.sum(f, axis=0)
        tok = tl.load(tok_ptr + row)
        lp = tl.load(base + tok).to(tl.float32)
        if LOGITS:
            big = tl.max(m, axis=0)
            safe_big = tl.where(big > float("-inf"), big, 0.0)
            lp = lp - (safe_big + tl.log(tl.sum(s * tl.exp(m - safe_big), axis=0)))
        tl.store(lp_ptr + row, lp)
        tl.store(total_ptr + row, count)


def reduce_rows(processed: torch.Tensor, sampled: torch.Tensor, num_ids: int, logits: bool):
    """(lp, ids or None, total or None) for every row; the fused kernel on CUDA (see the module docstring)."""
    if triton is None or not processed.is_cuda:
        return reduce_rows_torch(processed, sampled, num_ids, logits)
    if processed.stride(1) != 1:
        processed = processed.contiguous()
    R, V = processed.shape
    tok = sampled.reshape(-1).to(torch.int64)
    lp = torch.empty(R, dtype=torch.float32, device=processed.device)
    total = torch.empty(R, dtype=torch.int32, device=processed.device)
    K = max(int(num_ids), 0)
    ids = torch.full((R, max(K, 1)), -1, dtype=torch.int32, device=processed.device)
    if R:
        _reduce_kernel[(R,)](processed, processed.stride(0), V, tok, lp, ids, total, max(K, 1),
                             LOGITS=bool(logits), WITH_IDS=K > 0, BLOCK=2048, num_warps=8)
    return (lp, ids, total) if K > 0 else (lp, None, None)
