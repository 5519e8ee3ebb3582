"""Per sampled row, what training needs from vLLM's processed distribution (rollout/vllm_capture.py):

    processed [R, V]  (-inf outside the top-k/top-p kept set; logprobs, or logits with any per-row offset)
      -> lp    [R]     log pi_old(sampled id) under the truncated, renormalised distribution
                       (logits: x[tok] - logsumexp(x); logprobs: x[tok])
         ids   [R, K]  the first K kept ids in id order, -1 after the last (inline: most kept sets are small)
         total [R]     the exact number of kept ids
         base  [R]     where the rest of a larger set went: -1 none (total <= K); >= 0 its ids K.. are
                       overflow[base : base + total - K]; -2 the overflow buffer was full (the set is incomplete)

Kept sets are complete whatever their size: a row with more than K kept ids reserves room in a shared GPU
`OverflowBuffer` with one atomic add and writes the rest there, so sets of thousands of ids (a real model at
top_p=0.95) cost memory in proportion to their size and no fixed cap. Only a buffer that fills up between two
flushes leaves sets incomplete, and those rows are reported (base -2), never silently cut.

On CUDA one fused Triton kernel reads each row once (online logsumexp, a running count and a prefix-sum
compaction of the finite ids; a second pass only for rows past K), instead of top-k + cast + logsumexp passes
over the [R, V] tensor, which cost ~14% of decode throughput at V=152k (benchmarks/README.md). Elsewhere (tests,
CPU) the same result in torch.
"""

from __future__ import annotations

import numpy as np
import torch

try:  # vLLM's GPU workers always have triton; the CPU test machines may not
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None

NO_OVERFLOW, LOST = -1, -2  # `base` of a row whose set fits inline / did not fit in the overflow buffer


class OverflowBuffer:
    """Room for the kept ids past the first K of a row, handed out by an atomic counter; emptied at each flush."""

    def __init__(self, capacity: int, device: torch.device | str):
        self.capacity = int(capacity)
        self.ids = torch.empty(self.capacity, dtype=torch.int32, device=device)
        self.counter = torch.zeros(1, dtype=torch.int64, device=device)

    def drain(self) -> tuple[np.ndarray, int]:
        """(the ids written since the last drain, how many were asked for: > capacity means rows were lost)."""
        # Inside vLLM the buffer is created under inference mode (the sampler's); it may be drained outside it.
        with torch.inference_mode():
            asked = int(self.counter.item())
            data = self.ids[: min(asked, self.capacity)].cpu().numpy()
            self.counter.zero_()
        return data, asked


def reduce_rows_torch(processed: torch.Tensor, sampled: torch.Tensor, num_ids: int, logits: bool,
                      overflow: OverflowBuffer | None = None):
    """Reference implementation (and the CPU path); see the module docstring."""
    tok = sampled.reshape(-1).long()
    x = processed.float()
    lp = x.gather(1, tok[:, None]).squeeze(1)
    if logits:
        lp = lp - torch.logsumexp(x, dim=-1)
    if num_ids <= 0:
        return lp, None, None, None
    finite = torch.isfinite(x)
    total = finite.sum(1, dtype=torch.int32)
    pos = finite.cumsum(1) - 1
    sel = finite & (pos < num_ids)
    rows, cols = sel.nonzero(as_tuple=True)
    ids = torch.full((x.shape[0], num_ids), -1, dtype=torch.int32, device=x.device)
    ids[rows, pos[rows, cols]] = cols.to(torch.int32)
    base = torch.full((x.shape[0],), NO_OVERFLOW, dtype=torch.int64, device=x.device)
    if overflow is not None:
        for r in (total > num_ids).nonzero().flatten().tolist():
            rest = finite[r].nonzero().flatten()[num_ids:].to(torch.int32)
            start = int(overflow.counter.item())
            overflow.counter += len(rest)
            if start + len(rest) <= overflow.capacity:
                overflow.ids[start : start + len(rest)] = rest
                base[r] = start
            else:
                base[r] = LOST
    return lp, ids, total, base


if triton is not None:

    @triton.jit
    def _reduce_kernel(x_ptr, stride, V, tok_ptr, lp_ptr, ids_ptr, total_ptr, K, ovf_ptr, base_ptr, counter_ptr, CAP,
                       LOGITS: tl.constexpr, WITH_IDS: tl.constexpr, WITH_OVF: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        base_x = x_ptr + row.to(tl.int64) * stride
        m = tl.full([BLOCK], float("-inf"), tl.float32)  # per-lane running max and scaled sum (online softmax)
        s = tl.zeros([BLOCK], tl.float32)
        count = tl.sum(tl.zeros([BLOCK], tl.int32), axis=0)
        for start in range(0, V, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(base_x + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
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
        lp = tl.load(base_x + tok).to(tl.float32)
        if LOGITS:
            big = tl.max(m, axis=0)
            safe_big = tl.where(big > float("-inf"), big, 0.0)
            lp = lp - (safe_big + tl.log(tl.sum(s * tl.exp(m - safe_big), axis=0)))
        tl.store(lp_ptr + row, lp)
        tl.store(total_ptr + row, count)
        if WITH_OVF:
            need = (count - K).to(tl.int64)
            where = tl.zeros([], tl.int64) - 1  # NO_OVERFLOW
            if need > 0:
                first = tl.atomic_add(counter_ptr, need)
                if first + need <= CAP:
                    where = first
                    seen = tl.sum(tl.zeros([BLOCK], tl.int32), axis=0)
                    for start in range(0, V, BLOCK):  # second pass, only for sets larger than K
                        cols = start + tl.arange(0, BLOCK)
                        x = tl.load(base_x + cols, mask=cols < V, other=float("-inf"))
                        finite = x > float("-inf")
                        f = finite.to(tl.int32)
                        pos = seen + tl.cumsum(f, axis=0) - 1
                        tl.store(ovf_ptr + first + pos - K, cols, mask=finite & (pos >= K))
                        seen += tl.sum(f, axis=0)
                else:
                    where = tl.zeros([], tl.int64) - 2  # LOST: no room left before the next flush
            tl.store(base_ptr + row, where)


def reduce_rows(processed: torch.Tensor, sampled: torch.Tensor, num_ids: int, logits: bool,
                overflow: OverflowBuffer | None = None):
    """(lp, ids, total, base) for every row, the last three None without ids (num_ids 0); the fused kernel on
    CUDA (see the module docstring)."""
    if triton is None or not processed.is_cuda:
        return reduce_rows_torch(processed, sampled, num_ids, logits, overflow)
    if processed.stride(1) != 1:
        processed = processed.contiguous()
    R, V = processed.shape
    dev = processed.device
    tok = sampled.reshape(-1).to(torch.int64)
    lp = torch.empty(R, dtype=torch.float32, device=dev)
    total = torch.empty(R, dtype=torch.int32, device=dev)
    K = max(int(num_ids), 0)
    ids = torch.full((R, max(K, 1)), -1, dtype=torch.int32, device=dev)
    base = torch.full((R,), NO_OVERFLOW, dtype=torch.int64, device=dev)
    with_ovf = K > 0 and overflow is not None
    ovf_ids, counter, cap = (overflow.ids, overflow.counter, overflow.capacity) if with_ovf else (ids, base, 0)
    if R:
        _reduce_kernel[(R,)](processed, processed.stride(0), V, tok, lp, ids, total, max(K, 1), ovf_ids, base, counter,
                             cap, LOGITS=bool(logits), WITH_IDS=K > 0, WITH_OVF=with_ovf, BLOCK=2048, num_warps=8)
    return (lp, ids, total, base) if K > 0 else (lp, None, None, None)


def complete_sets(inline: np.ndarray, inline_count: np.ndarray, total: np.ndarray, base: np.ndarray,
                  overflow: np.ndarray, num_ids: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows' whole kept sets as CSR (flat ids, count per row) from the inline ids (flat, `inline_count` per row)
    and each larger set's rest in `overflow` (from its `base`). A LOST row keeps only its inline part: its count
    then stays below its `total`, which marks it incomplete."""
    extra = np.where(base >= 0, total.astype(np.int64) - num_ids, 0)
    count = inline_count.astype(np.int64) + extra
    out = np.empty(int(count.sum()), dtype=np.int32)
    starts = np.zeros(len(count) + 1, np.int64)
    np.cumsum(count, out=starts[1:])
    in_starts = np.zeros(len(count) + 1, np.int64)
    np.cumsum(inline_count, out=in_starts[1:])
    # inline part of every row, then the overflow part of the rows that have one
    dst = np.repeat(starts[:-1] - in_starts[:-1], inline_count) + np.arange(int(in_starts[-1]))
    out[dst] = inline
    rows = np.nonzero(extra)[0]
    if len(rows):
        n = extra[rows]
        ends = np.cumsum(n)
        local = np.arange(int(ends[-1])) - np.repeat(ends - n, n)
        out[np.repeat(starts[rows] + inline_count[rows], n) + local] = overflow[np.repeat(base[rows], n) + local]
    return out, count
