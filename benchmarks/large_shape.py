"""Mixed RL on a model whose training state does not fit one GPU (issue 36): a random-weight Qwen3-30B-A3B shape cut
to 8 layers (all 128 experts, top-8, 5.6B parameters; ~16 bytes a parameter of mixed-precision Adam state, ~90 GB)
or a Qwen3-4B shape, trained by `python -m launch.train +experiment=mixed_rl` over the GPUs of one machine:
ZeRO-3 trainer ranks, one vLLM instance over all of them (tensor parallel, colocated, asleep while training), Keep
Routing and Keep Sampling Mask on, the KL reference partitioned over the ranks (`trainer.ref_placement=sharded`),
the rubric judge a small vLLM model on a share of GPU 0.

Prints per step the seconds of each phase, MFU over the active parameters (perf/mfu counts the experts a token
visits, rl/flops.py), the trainer's peak memory and the peak memory of every GPU (nvidia-smi, sampled each second:
trainer, vLLM and reference together), mismatch/routing_frac and mismatch/logprob_abs, and the weight sync.

    python benchmarks/large_shape.py --shape moe30b --layers 8 --steps 8        # on two GPUs
    python benchmarks/large_shape.py --shape dense4b --steps 8
    python benchmarks/large_shape.py --shape moe30b --layers 24 --gpus 4 --offload --steps 10   # on four GPUs

With --offload the optimizer state lives in host memory (`trainer.offload_optimizer=cpu`); the peak host memory
(MemTotal - MemAvailable) is printed with the GPUs'. kv_cache_tokens: the KV cache each vLLM instance (rollout and
judge) sized, shared by the sequences it runs at once.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launch.testbed import MOE_SMALL, QWEN3_4B, QWEN3_30B_A3B, build_model, parameter_count, with_layers  # noqa: E402
from rl.models import cache_root  # noqa: E402
from run_env import read_jsonl  # noqa: E402  (benchmarks/, this script's directory)

SHAPES = {"moe30b": QWEN3_30B_A3B, "dense4b": QWEN3_4B}
KEYS = ["time/step", "time/rollout", "time/generate", "time/ref", "time/train", "time/sync", "time/sync_send",
        "perf/mfu", "perf/train_tflops_per_gpu", "memory/trainer_peak_gib", "mismatch/logprob_abs",
        "mismatch/routing_frac", "opsm/masked_frac", "response_length/mean", "throughput/rollout_tokens_per_s",
        "reward/mean", "kl/logic", "perf/micro_batches", "perf/gradient_checkpointing"]


def host_memory_used() -> int:
    """MiB of host memory in use (MemTotal - MemAvailable: every process, page cache not counted)."""
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])) // 1024


def kv_cache_tokens(log: Path) -> list[int]:
    """The KV cache vLLM sized for each instance ("GPU KV cache size: N tokens" in the run's log), shared by all the
    sequences it runs at once: with the batch's size it bounds how long their responses can grow without preemption
    (one sequence is capped by max_model_len too)."""
    if not log.exists():
        return []
    return [int(m.replace(",", "")) for m in re.findall(r"GPU KV cache size: ([\d,]+) tokens", log.read_text(errors="replace"))]


def gpu_memory_used() -> list[int]:
    """MiB in use on each GPU (every process), from nvidia-smi."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    return [int(x) for x in out.split()]


class PeakMemory(threading.Thread):
    """The most memory each GPU held while the run ran, sampled every `every` seconds."""

    def __init__(self, every: float = 1.0):
        super().__init__(daemon=True)
        self.every, self.peak, self.host_peak, self.stop = every, [], 0, threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                used = gpu_memory_used()
                self.host_peak = max(self.host_peak, host_memory_used())
            except (OSError, subprocess.CalledProcessError):
                return
            self.peak = [max(a, b) for a, b in zip(self.peak or used, used)]
            self.stop.wait(self.every)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="moe30b")
    ap.add_argument("--layers", type=int, default=None, help="cut the shape to this many decoder layers")
    ap.add_argument("--gpus", type=int, default=2, help="trainer ranks = GPUs = tensor-parallel size of vLLM")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step (x --n samples)")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--rollout-memory", type=float, default=0.3, help="rollout.gpu_memory_utilization")
    ap.add_argument("--offload", action="store_true",
                    help="trainer.offload_optimizer=cpu (the optimizer state in host memory, ~20 bytes a parameter; "
                         "torch threads per rank = the host's cores / --gpus)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "large_shape")
    ap.add_argument("--timeout", type=int, default=3000)
    ap.add_argument("--override", nargs="*", default=[], help="more Hydra overrides")
    args = ap.parse_args()

    spec = with_layers(SHAPES[args.shape], args.layers)
    total, active = parameter_count(spec)
    name = f"{args.shape}-L{spec['num_hidden_layers']}"
    print(f"[large_shape] {name}: {total / 1e9:.2f}B parameters, {active / 1e9:.2f}B active per token", flush=True)
    t0 = time.perf_counter()
    model = build_model(cache_root() / "large" / name, spec)
    judge = build_model(cache_root() / "large" / "judge-moe-small", MOE_SMALL)
    print(f"[large_shape] models ready in {time.perf_counter() - t0:.0f} s", flush=True)

    run_dir = args.out / name
    cmd = [sys.executable, "-m", "launch.train", "+experiment=mixed_rl", "rollout=vllm", f"run_dir={run_dir}",
           f"model.path={model}", "model.dtype=bfloat16", "trainer.device=cuda", "logger.progress_bar=false",
           f"trainer.total_steps={args.steps}", "trainer.save_every=0", "trainer.save_last=false", "eval.every=0",
           "rollout.placement=colocated", f"trainer.num_processes={args.gpus}", "rollout.num_workers=1",
           f"rollout.tensor_parallel_size={args.gpus}", "rollout.num_gpus=0.4", "trainer.num_gpus=0.4",
           f"rollout.gpu_memory_utilization={args.rollout_memory}", "rollout.enforce_eager=true",
           "trainer.zero_stage=3", "trainer.ref_placement=sharded", "trainer.micro_batch_size=auto",
           "rollout.top_k=32", f"rollout.max_new_tokens={args.max_new_tokens}",
           f"data.prompts_per_step={args.prompts}", f"rollout.n_samples={args.n}",
           f"rewards.judge.model={judge}", "rewards.judge.num_gpus=0.1", "rewards.judge.gpu_memory_utilization=0.05",
           *(["trainer.offload_optimizer=cpu", f"trainer.threads={max(1, (os.cpu_count() or 1) // args.gpus)}"]
             if args.offload else []),
           *args.override]
    print("[large_shape] " + " ".join(cmd[1:]), flush=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "DS_ACCELERATOR": "cuda"}
    peak = PeakMemory()
    peak.start()
    t1 = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / f"{name}.log", "w") as log:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout)
    wall = time.perf_counter() - t1
    peak.stop.set()
    metrics = run_dir / "metrics.jsonl"
    rows = read_jsonl(metrics)
    for r in rows:
        print(f"[large_shape] step {r['step']}: " + ", ".join(
            f"{k}={r[k]:.4g}" if isinstance(r.get(k), float) else f"{k}={r.get(k)}" for k in KEYS), flush=True)
    summary = {"shape": name, "parameters": total, "active_parameters": active, "rc": proc.returncode,
               "steps": len(rows), "wall_s": round(wall, 1), "peak_gpu_mib": peak.peak,
               "peak_host_mib": peak.host_peak, "kv_cache_tokens": kv_cache_tokens(run_dir / "train.log")}
    if rows:
        later = rows[1:] or rows  # the first step pays the compile/warm-up costs
        for k in KEYS:
            vals = [r[k] for r in later if isinstance(r.get(k), (int, float))]
            if vals:
                summary[f"mean {k}"] = round(sum(vals) / len(vals), 4)
        summary["max mismatch/logprob_abs"] = max(r.get("mismatch/logprob_abs") or 0 for r in rows)
        summary["max mismatch/routing_frac"] = max(r.get("mismatch/routing_frac") or 0 for r in rows)
    print("[large_shape] " + json.dumps(summary), flush=True)
    (args.out / f"{name}.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    if proc.returncode:
        print(f"[large_shape] launch.train exited {proc.returncode}; the end of {args.out / f'{name}.log'}:")
        print((args.out / f"{name}.log").read_text()[-6000:])
        sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
