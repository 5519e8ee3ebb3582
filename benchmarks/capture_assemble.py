"""CPU cost of the sampler capture after generation (rollout/vllm_capture.py): `merge_chunks` (in vLLM's engine
process at collect), the bytes that then cross to the rollout worker, and `assemble` (rows -> per completion),
on synthetic rows shaped like a real rollout.

The rows are what `SamplerCapture.flush` produces for N requests decoded for T steps, flushed every 64 steps.
Kept-set sizes are drawn from a log-normal fitted to SmolLM2-135M-Instruct at T=1, top_p=0.95 on the H100
(benchmarks/README.md: median 36-48, p90 761-939, p99 ~3,000, max ~10,000 ids; vocabulary 49,152), so a run
holds about as many kept ids as the measured one (~40M for 256 x 512 tokens).

    python benchmarks/capture_assemble.py [--requests 256] [--steps 512] [--repeats 3] [--id-bits 16|32]
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rl.kept_set import id_dtype  # noqa: E402
from rollout.vllm_capture import FLUSH_EVERY, assemble, merge_chunks  # noqa: E402

VOCAB = 49152


def kept_set_sizes(rng: np.random.Generator, n: int) -> np.ndarray:
    """Log-normal sizes, median 42, p90 ~600, mean ~300, clipped to [1, vocab]."""
    return np.clip(np.exp(rng.normal(np.log(42.0), 2.05, n)), 1, VOCAB).astype(np.int64)


def synthetic_chunks(requests: int, steps: int, dtype: np.dtype, seed: int = 0) -> tuple[list[dict], list[tuple[str, int, np.ndarray]]]:
    """Flushed chunks of `requests` requests (prompt length 40) decoded `steps` steps, and the completions."""
    rng = np.random.default_rng(seed)
    names = [f"{i}_req-{i}" for i in range(requests)]
    prompt = 40
    tokens = rng.integers(0, VOCAB, size=(requests, steps)).astype(np.int32)
    chunks = []
    for first in range(0, steps, FLUSH_EVERY):
        width = min(FLUSH_EVERY, steps - first)
        total = kept_set_sizes(rng, width * requests)
        start = np.concatenate([[0], np.cumsum(total)[:-1]])
        flat = rng.integers(0, VOCAB, size=int(total.sum())).astype(dtype)
        step_of_row = np.repeat(np.arange(first, first + width), requests)
        req_of_row = np.tile(np.arange(requests), width)
        flat[start] = tokens[req_of_row, step_of_row].astype(dtype)  # the sampled id lies in its set
        chunks.append(dict(
            tok=tokens[req_of_row, step_of_row], lp=rng.normal(-1, 1, width * requests).astype(np.float32),
            total=total.astype(np.int32), start=start, flat=flat, req=[names[r] for r in req_of_row],
            keep=np.ones(width * requests, bool), index=(prompt + step_of_row).astype(np.int64),
        ))
    completions = [(names[r], prompt, tokens[r]) for r in range(requests)]
    return chunks, completions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--steps", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--id-bits", type=int, choices=(16, 32), default=None,
                    help="how the ids leave the GPU (default: what the capture does for this vocabulary)")
    args = ap.parse_args()
    dtype = id_dtype(VOCAB) if args.id_bits is None else np.dtype(np.uint16 if args.id_bits == 16 else np.int32)
    chunks, completions = synthetic_chunks(args.requests, args.steps, dtype)
    ids = sum(len(c["flat"]) for c in chunks)
    print(f"{args.requests} requests x {args.steps} tokens, {ids:,} kept ids ({ids / (args.requests * args.steps):.0f} "
          f"per token), ids as {chunks[0]['flat'].dtype}", flush=True)
    print("| repeat | merge_chunks s | pickled MB | pickle + unpickle s | assemble s | samples' kept ids: MB, pickle + "
          "unpickle s |")
    print("|---|---|---|---|---|---|")
    for rep in range(args.repeats):
        t0 = time.perf_counter()
        rows = merge_chunks(chunks, with_ids=True)
        t1 = time.perf_counter()
        blob = pickle.dumps(rows, protocol=5)
        rows = pickle.loads(blob)
        t2 = time.perf_counter()
        out = assemble(rows, completions)
        t3 = time.perf_counter()
        assert sum(len(o["kept_ids"]) for o in out) == ids
        # what then travels with the samples (rollout worker -> reward worker -> driver -> trainer: once per hop)
        sample_blob = pickle.dumps([(o["kept_ids"], o["kept_offsets"]) for o in out], protocol=5)
        pickle.loads(sample_blob)
        t4 = time.perf_counter()
        print(f"| {rep + 1} | {t1 - t0:.3f} | {len(blob) / 2**20:.0f} | {t2 - t1:.3f} | {t3 - t2:.3f} | "
              f"{len(sample_blob) / 2**20:.0f}, {t4 - t3:.3f} |", flush=True)


if __name__ == "__main__":
    main()
