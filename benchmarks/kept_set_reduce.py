"""GPU time per decode step of the sampler-side capture reduction (rl/kept_set.py): the fused Triton kernel
vs the torch ops it replaced (top-K + cast + logsumexp) and vs its torch reference, on one step's processed
logits: 512 rows x Qwen's vocabulary 151936, bf16, top_k=64 + top_p=0.95, K = 65.

    python benchmarks/kept_set_reduce.py [--rows 512] [--vocab 151936]
"""

from __future__ import annotations

import argparse

import torch


def topk_version(processed, sampled, K):
    """What rollout/vllm_capture.py did before the kernel."""
    tok = sampled.long()
    lp = processed.gather(1, tok[:, None]).squeeze(1).float() - torch.logsumexp(processed.float(), dim=-1)
    vals, ids = torch.topk(processed, K, dim=-1)
    return lp, ids.to(torch.int32).masked_fill_(~torch.isfinite(vals), -1)


def main() -> None:
    from rl.kept_set import KeptIdBuffer, reduce_rows, reduce_rows_torch
    from rollout.sampling import process_logits

    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=151936)
    args = ap.parse_args()
    torch.manual_seed(0)
    logprobs = process_logits(torch.randn(args.rows, args.vocab, device="cuda") * 4, 1.0, 64, 0.95)
    processed = (logprobs + 1.0).to(torch.bfloat16)
    sampled = torch.multinomial(logprobs.exp(), 1).squeeze(1)
    K = 65
    buf = KeptIdBuffer(64 * 2**20, "cuda")

    def fused():
        buf.counter.zero_()  # one decode step's worth of ids, the buffer reused (the capture drains it)
        return reduce_rows(processed, sampled, True, buf)

    def reference():
        buf.counter.zero_()
        return reduce_rows_torch(processed, sampled, True, buf)

    cases = {"fused kernel (whole sets into the kept-id buffer)": fused,
             "top-K + logsumexp (before; first K ids only)": lambda: topk_version(processed, sampled, K),
             "torch reference": reference}
    print(f"{args.rows} rows x {args.vocab} vocab, bf16 logits, top_k=64 top_p=0.95, K={K}, {torch.cuda.get_device_name()}")
    print("| reduction | ms per step |\n|---|---|")
    for name, fn in cases.items():
        for _ in range(3):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(20):
            fn()
        end.record()
        torch.cuda.synchronize()
        print(f"| {name} | {start.elapsed_time(end) / 20:.3f} |")


if __name__ == "__main__":
    main()
