"""Per sampled row, what training needs from vLLM's processed distribution (rollout/vllm_capture.py):

    processed [R, V]  (-inf outside the top-k/top-p kept set; logprobs, or logits with any per-row offset)
      -> lp    [R]     log pi_old(sampled id) under the truncated, renormalised distribution
                       (logits: x[tok] - logsumexp(x); logprobs: x[tok])
         total [R]     the exact number of kept ids
         start [R]     where the row's kept ids went in the shared `KeptIdBuffer`: ids[start : start + total], in id
                       order; -2 (LOST) when the buffer had no room left for them (the set is not recorded)

Kept sets are complete whatever their size: each row reserves room for its whole set in one GPU buffer with one
atomic add and writes its ids there, so sets of thousands of ids (a real model at top_p=0.95) cost memory in
proportion to their size and there is no fixed cap. The buffer is CSR already (rows' ids back to back, located by
`start`), so moving it to the CPU is one copy of the used part, with no compaction of padded rows. Only a buffer
that fills up between two flushes leaves sets unrecorded, and those rows are reported (LOST), never silently cut.

On CUDA one fused Triton kernel does it per row: one pass for the online logsumexp and the count, one atomic
reservation, one pass that writes the finite ids (a prefix-sum compaction per block), instead of top-k + cast +
logsumexp passes over the [R, V] tensor, which cost ~14% of decode throughput at V=152k (benchmarks/README.md).
Elsewhere (tests, CPU) the same result in torch.
"""

from __future__ import annotations

import numpy as np
import torch

try:  # vLLM's GPU workers always have triton; the CPU test machines may not
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None

LOST = -2  # `start` of a row whose set found no room in the buffer


def id_dtype(vocab_size: int | None) -> np.dtype:
    """How kept ids leave the GPU: 16 bits when every id of the vocabulary fits (up to 65,536 ids: SmolLM2, Llama 2,
    Mistral), which halves the bytes copied, sent between processes and gathered per sample; else 32 bits."""
    return np.dtype(np.uint16) if vocab_size is not None and vocab_size <= 2**16 else np.dtype(np.int32)


class KeptIdBuffer:
    """Room for the rows' kept ids, handed out by an atomic counter; emptied at each drain. `vocab_size`: drained ids
    come out as `id_dtype(vocab_size)` (int32 when not given)."""

    def __init__(self, capacity: int, device: torch.device | str, vocab_size: int | None = None):
        self.capacity = int(capacity)
        self.ids = torch.empty(self.capacity, dtype=torch.int32, device=device)
        self.counter = torch.zeros(1, dtype=torch.int64, device=device)
        self.out_dtype = id_dtype(vocab_size)

    def drain(self) -> tuple[np.ndarray, int]:
        """(the ids written since the last drain, how many were asked for: > capacity means rows were lost)."""
        # Inside vLLM the buffer is created under inference mode (the sampler's); it may be drained outside it.
        with torch.inference_mode():
            asked = int(self.counter.item())
            used = self.ids[: min(asked, self.capacity)]
            if self.out_dtype == np.uint16:  # narrowed on the device: ids >= 2**15 wrap to negative int16, same bits
                data = used.to(torch.int16).cpu().numpy().view(np.uint16)
            else:
                data = used.to("cpu", copy=True).numpy()  # a copy on CPU too
            self.counter.zero_()
        return data, asked


def reduce_rows_torch(processed: torch.Tensor, sampled: torch.Tensor, logits: bool,
                      buffer: KeptIdBuffer | None = None):
    """Reference implementation (and the CPU path); see the module docstring. Rows reserve in row order, as if the
    kernel's atomic adds ran one row after the other."""
    tok = sampled.reshape(-1).long()
    x = processed.float()
    lp = x.gather(1, tok[:, None]).squeeze(1)
    if logits:
        lp = lp - torch.logsumexp(x, dim=-1)
    if buffer is None:
        return lp, None, None
    finite = torch.isfinite(x)
    total = finite.sum(1, dtype=torch.int32)
    first = int(buffer.counter.item())
    ends = first + total.to(torch.int64).cumsum(0)
    starts = ends - total
    fits = ends <= buffer.capacity  # a prefix of the rows: the counter only grows
    ids = (finite & fits[:, None]).nonzero()[:, 1].to(torch.int32)  # row-major: each row's ids back to back
    buffer.ids[first : first + len(ids)] = ids.to(buffer.ids.device)
    buffer.counter += int(total.sum())
    start = torch.where(fits, starts, torch.full_like(starts, LOST))
    return lp, total, start


if triton is not None:

    @triton.jit
    def _reduce_kernel(x_ptr, stride, V, tok_ptr, lp_ptr, total_ptr, buf_ptr, start_ptr, counter_ptr, CAP,
                       LOGITS: tl.constexpr, WITH_IDS: tl.constexpr, BLOCK: tl.constexpr):
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
            count += tl.sum(finite.to(tl.int32), axis=0)
        tok = tl.load(tok_ptr + row)
        lp = tl.load(base_x + tok).to(tl.float32)
        if LOGITS:
            big = tl.max(m, axis=0)
            safe_big = tl.where(big > float("-inf"), big, 0.0)
            lp = lp - (safe_big + tl.log(tl.sum(s * tl.exp(m - safe_big), axis=0)))
        tl.store(lp_ptr + row, lp)
        if WITH_IDS:
            tl.store(total_ptr + row, count)
            first = tl.atomic_add(counter_ptr, count.to(tl.int64))
            where = tl.zeros([], tl.int64) - 2  # LOST: no room left before the next drain
            if first + count <= CAP:
                where = first
                seen = tl.sum(tl.zeros([BLOCK], tl.int32), axis=0)
                for start in range(0, V, BLOCK):  # second pass: the finite ids, compacted, in id order
                    cols = start + tl.arange(0, BLOCK)
                    x = tl.load(base_x + cols, mask=cols < V, other=float("-inf"))
                    finite = x > float("-inf")
                    f = finite.to(tl.int32)
                    pos = seen + tl.cumsum(f, axis=0) - 1
                    tl.store(buf_ptr + first + pos, cols, mask=finite)
                    seen += tl.sum(f, axis=0)
            tl.store(start_ptr + row, where)


def reduce_rows(processed: torch.Tensor, sampled: torch.Tensor, logits: bool, buffer: KeptIdBuffer | None = None):
    """(lp, total, start) for every row, the last two None without a buffer (logprobs only); the fused kernel on
    CUDA (see the module docstring)."""
    if triton is None or not processed.is_cuda:
        return reduce_rows_torch(processed, sampled, logits, buffer)
    if processed.stride(1) != 1:
        processed = processed.contiguous()
    R, V = processed.shape
    dev = processed.device
    tok = sampled.reshape(-1)
    lp = torch.empty(R, dtype=torch.float32, device=dev)
    if buffer is None:
        total = start = None
        args = (lp, lp, lp, lp, 0)  # unused pointers (WITH_IDS off)
    else:
        total = torch.empty(R, dtype=torch.int32, device=dev)
        start = torch.empty(R, dtype=torch.int64, device=dev)
        args = (total, buffer.ids, start, buffer.counter, buffer.capacity)
    if R:
        _reduce_kernel[(R,)](processed, processed.stride(0), V, tok, lp, *args, LOGITS=bool(logits),
                             WITH_IDS=buffer is not None, BLOCK=2048, num_warps=8)
    return lp, total, start
