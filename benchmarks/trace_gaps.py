"""Where the GPU waits, from a torch.profiler trace: `trainer.profile_step` writes one (run_dir/profile/*.json.gz).

Prints the traced span, the GPU's busy and idle time (kernels, copies and memsets merged over all streams), the
idle time at the start and end of the span, and the idle time between kernels grouped by what the CPU was doing
when each gap began: the innermost CPU event (op, CUDA runtime call or annotation) running at that moment, and the
chain of events around it. A gap under a `cudaStreamSynchronize` is the CPU waiting on nothing but the GPU's queue
draining; under `cudaMalloc`/`cudaFree`, the allocator; under op launches, the CPU not keeping up.

    python benchmarks/trace_gaps.py run_dir/profile/train_step4_rank0.json.gz [--min-gap-us 20] [--top 25]
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
from collections import defaultdict
from pathlib import Path

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
CPU_CATS = {"cpu_op", "cuda_runtime", "cuda_driver", "user_annotation", "python_function"}


def load(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def gaps_of(busy: list[tuple[float, float]], min_gap: float) -> list[tuple[float, float]]:
    return [(b0, a1) for (_, b0), (a1, _) in zip(busy, busy[1:]) if a1 - b0 >= min_gap]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--min-gap-us", type=float, default=20.0, help="shorter idle stretches are not gaps")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    events = [e for e in load(Path(args.trace)) if e.get("ph") == "X" and "dur" in e]
    gpu = merged([(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in GPU_CATS])
    cpu = sorted(((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events if e.get("cat") in CPU_CATS),
                 key=lambda x: x[0])
    if not gpu or not cpu:
        raise SystemExit("no GPU kernels or no CPU events in this trace")
    start, end = min(cpu[0][0], gpu[0][0]), max(max(c[1] for c in cpu), gpu[-1][1])
    busy = sum(b - a for a, b in gpu)
    gaps = gaps_of(gpu, args.min_gap_us)
    starts = [c[0] for c in cpu]
    by_inner: dict[str, float] = defaultdict(float)
    by_chain: dict[str, float] = defaultdict(float)
    for a, b in gaps:
        # every CPU event running at the gap's start; innermost = the shortest
        i = bisect.bisect_right(starts, a)
        around = sorted((c for c in cpu[max(0, i - 5000):i] if c[1] > a), key=lambda c: c[1] - c[0])
        chain = [c[2] for c in around][:3]
        by_inner[chain[0] if chain else "(no CPU event)"] += b - a
        by_chain[" < ".join(chain) if chain else "(no CPU event)"] += b - a
    ms = lambda us: f"{us / 1e3:9.1f} ms"  # noqa: E731
    print(f"span {ms(end - start)}: GPU busy {ms(busy)}, idle {ms(end - start - busy)} "
          f"(before the first kernel {ms(gpu[0][0] - start)}, after the last {ms(end - gpu[-1][1])}, "
          f"{len(gaps)} gaps >= {args.min_gap_us:.0f} us between kernels: {ms(sum(b - a for a, b in gaps))})")
    print(f"\nidle between kernels by the innermost CPU event at the gap's start (top {args.top}):")
    for name, us in sorted(by_inner.items(), key=lambda x: -x[1])[: args.top]:
        print(f"  {ms(us)}  {name[:110]}")
    print(f"\nby the three innermost events (top {args.top}):")
    for name, us in sorted(by_chain.items(), key=lambda x: -x[1])[: args.top]:
        print(f"  {ms(us)}  {name[:150]}")


if __name__ == "__main__":
    main()
