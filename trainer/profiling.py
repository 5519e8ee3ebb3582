"""`trainer.profile_step`: one train step of a run under torch.profiler, written beside the run's logs.

The N-th `train_step` of each trainer rank (1-based, counted in that process: a resumed run counts from its
resume) runs under `torch.profiler` with input shapes recorded, and the rank writes to `run_dir/profile/`:
- `train_step<N>_rank<r>.txt`: the step's wall time, its GPU time, the CUDA runtime calls that make the CPU wait
  or launch (launches, stream syncs, mallocs/frees), and the top ops by GPU time, by GPU time per input shape
  (which tensor an elementwise op works on) and by CPU time;
- `train_step<N>_rank<r>.json.gz`: the Chrome/Perfetto trace (https://ui.perfetto.dev opens it).
The profiled step is slower than the others (the profiler's own overhead, and writing the trace: its train phase
took 42 s instead of ~2 s on the 0.6B benchmark); its metrics are logged as usual, so leave it out of comparisons.
`benchmarks/train_profile.py --profile` prints the same tables for a step outside a run.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

import torch

# CUDA runtime calls worth counting: each launch costs CPU time, each sync/malloc/free makes the CPU wait
RUNTIME_CALLS = ("cudaLaunchKernel", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMalloc", "cudaFree",
                 "cudaMemcpyAsync")


def _device_time(event) -> float:
    """An averaged event's self GPU time in microseconds (the attribute's name moved across torch versions)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return 0.0


def profile_tables(prof, cuda: bool, wall_s: float | None = None, rows: int = 25) -> str:
    """The report of one profiled region (see the module docstring), as text."""
    events = prof.key_averages()
    lines = []
    if wall_s is not None:
        lines.append(f"wall time: {wall_s:.3f} s")
    if cuda:
        # kernels are the events with GPU time and no CPU time of their own; ops count their kernels again
        kernels = sum(_device_time(e) for e in events if e.self_cpu_time_total == 0)
        lines.append(f"GPU time in kernels: {kernels / 1e6:.3f} s")
    counts = {e.key: e.count for e in events if e.key in RUNTIME_CALLS}
    lines.append("runtime calls: " + ", ".join(f"{k} {counts.get(k, 0)}" for k in RUNTIME_CALLS))
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    lines += ["", f"top {rows} by {'GPU' if cuda else 'CPU'} time:",
              events.table(sort_by=sort, row_limit=rows, max_name_column_width=70)]
    if cuda:
        by_shape = prof.key_averages(group_by_input_shape=True)
        lines += ["", f"top {rows} by GPU time and input shapes:",
                  by_shape.table(sort_by=sort, row_limit=rows, max_name_column_width=50, max_shapes_column_width=70)]
        lines += ["", f"top {rows} by CPU time:",
                  events.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=70)]
    return "\n".join(lines)


@contextmanager
def profiled(out: Path | None, device):
    """Run the block under torch.profiler and write `out`.txt and `out`.json.gz; a no-op when out is None."""
    if out is None:
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.device(device).type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    t0 = time.perf_counter()
    with profile(activities=activities, record_shapes=True) as prof:
        yield
        if cuda:
            torch.cuda.synchronize(device)
    wall = time.perf_counter() - t0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_name(out.name + ".txt").write_text(profile_tables(prof, cuda, wall) + "\n")
    prof.export_chrome_trace(str(out.with_name(out.name + ".json.gz")))
