"""Peak memory and time (forward + backward) of chunked `token_logprobs` with Keep Sampling Mask vs a naive version.

Naive = the usual unchunked code: full [N, V] float32 logits, -inf fill outside the kept sets, log_softmax over the
whole vocabulary, gather. Both variants compute the same logprobs and the gradients of hidden and lm_weight.

    python benchmarks/logprob_memory.py                       # defaults: 8192 tokens, vocab 151936, hidden 1024
    python benchmarks/logprob_memory.py --tokens 2048         # fits a 24 GB CPU box easily

CUDA: torch.cuda.max_memory_allocated above the memory held after allocating the inputs (reset between variants).
CPU: each variant runs in a fresh subprocess; peak = ru_maxrss after the run minus ru_maxrss after allocating the
inputs. Exits 1 if the chunked peak is more than --max-ratio (default 1/4) of the naive peak.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

from rl.logprobs import kept_matrix, token_logprobs


def make_inputs(args, device):
    g = torch.Generator(device="cpu").manual_seed(0)
    dtype = getattr(torch, args.dtype)
    N, V, H, K = args.tokens, args.vocab, args.hidden, args.kept
    # In-place scaling: a temporary copy would raise ru_maxrss above what stays allocated and hide that much of
    # the measured peak on CPU.
    hidden = torch.randn(N, H, generator=g).div_(H**0.25).to(device, dtype).requires_grad_()
    weight = torch.randn(V, H, generator=g).div_(H**0.25).to(device, dtype).requires_grad_()
    targets = torch.randint(0, V, (N,), generator=g).to(device)
    kept_ids = torch.randint(0, V, (N * K,), generator=g, dtype=torch.int32).to(device)
    kept_offsets = (torch.arange(N + 1) * K).to(device)
    return hidden, weight, targets, kept_ids, kept_offsets


def run_chunked(args, hidden, weight, targets, kept_ids, kept_offsets):
    logp, *_ = token_logprobs(
        hidden, weight, targets, temperature=args.temperature, kept_ids=kept_ids, kept_offsets=kept_offsets,
        chunk_size=args.chunk_size,
    )
    logp.sum().backward()


def run_naive(args, hidden, weight, targets, kept_ids, kept_offsets):
    N, V = hidden.shape[0], weight.shape[0]
    logits = (hidden @ weight.T).float() / args.temperature
    keep = kept_matrix(kept_ids, kept_offsets.cpu(), targets, 0, N, V)
    logits.masked_fill_(~keep, float("-inf"))  # in place: the kindest naive version
    del keep
    logp = torch.log_softmax(logits, dim=-1).gather(1, targets[:, None]).squeeze(1)
    del logits
    logp.sum().backward()


VARIANTS = {"chunked": run_chunked, "naive": run_naive}


def measure(args, variant, device):
    """Returns (peak bytes above the inputs, seconds) of one forward+backward of `variant`."""
    inputs = make_inputs(args, device)
    fn = VARIANTS[variant]
    if device.type == "cuda":
        for _ in range(args.warmup):
            fn(args, *inputs)
            inputs[0].grad = inputs[1].grad = None
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(args.repeats):
            inputs[0].grad = inputs[1].grad = None
            fn(args, *inputs)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - t0) / args.repeats
        return torch.cuda.max_memory_allocated() - base, seconds
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    t0 = time.perf_counter()
    fn(args, *inputs)
    seconds = time.perf_counter() - t0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base, seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--kept", type=int, default=64, help="kept-set size per position (Keep Sampling Mask)")
    p.add_argument("--chunk-size", type=int, default=1024)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="input dtype; default bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--warmup", type=int, default=1, help="CUDA only")
    p.add_argument("--repeats", type=int, default=3, help="CUDA only")
    p.add_argument("--max-ratio", type=float, default=0.25)
    p.add_argument("--variants", default="chunked,naive")
    p.add_argument("--_child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    device = torch.device(args.device)
    args.dtype = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")

    if args._child:  # CPU subprocess: one variant, result as one JSON line
        peak, seconds = measure(args, args._child, device)
        print(json.dumps({"peak": peak, "seconds": seconds}))
        return 0

    results = {}
    for variant in args.variants.split(","):
        if device.type == "cuda":
            torch.cuda.empty_cache()
            results[variant] = measure(args, variant, device)
        else:
            cmd = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--_child", variant]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"{variant}: failed (rc {proc.returncode})\n{proc.stderr[-2000:]}", file=sys.stderr)
                results[variant] = None
                continue
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            results[variant] = (r["peak"], r["seconds"])

    logits_gib = args.tokens * args.vocab * 4 / 2**30
    print(
        f"device={device.type} dtype={args.dtype} tokens={args.tokens} vocab={args.vocab} hidden={args.hidden} "
        f"kept={args.kept} chunk_size={args.chunk_size}  (one [N,V] fp32 buffer = {logits_gib:.2f} GiB)"
    )
    print(f"{'variant':<10} {'peak MiB':>12} {'fwd+bwd s':>10}")
    for variant, r in results.items():
        print(f"{variant:<10} {'failed':>12}" if r is None else f"{variant:<10} {r[0] / 2**20:>12.1f} {r[1]:>10.3f}")
    if results.get("chunked") and results.get("naive"):
        ratio = results["chunked"][0] / max(results["naive"][0], 1)
        print(f"ratio chunked/naive: peak {ratio:.3f}  time {results['chunked'][1] / results['naive'][1]:.2f}")
        if ratio > args.max_ratio:
            print(f"FAIL: chunked peak is more than {args.max_ratio} of the naive peak", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
