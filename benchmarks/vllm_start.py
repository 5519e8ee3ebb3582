"""Where one vLLM instance's start goes (issue 37): our VLLMEngine started in a fresh process, its main thread's Python
stack sampled every `--interval` seconds by a thread of its own (`sys._current_frames`: a sample is taken whenever
the main thread lets go of the GIL, as it does waiting in C: a subprocess, a Triton compile, a CUDA call), then
summed per function. (faulthandler's timed dumps, the first way, crashed vLLM's start with SIGSEGV on an H200.)

Each configuration (`--runs`, in the order given) starts SmolLM2-135M-Instruct as a `smol_math` instance has it
(sleep mode, capture=sampler, in-process engine core) with its caches (vLLM's torch.compile artefacts, Inductor's and
Triton's kernels) under `--out/caches/<cache>`: `fresh` empties them first, `warm` keeps what the run before left.
`measure` lets vLLM profile the GPU's memory for its KV-cache size; `sized` gives it the size a `smol_math` sized
start takes (rollout/vllm_start_plan.py). `--engine-args` adds vllm.LLM arguments (e.g. a compilation_config).

    python benchmarks/vllm_start.py --out /tmp/vs --runs a:fresh:measure a:warm:measure b:fresh:sized b:warm:sized
    python benchmarks/vllm_start.py --out /tmp/vs --runs c:fresh:sized --engine-args \\
        '{"compilation_config": {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}}'

A run is `<cache>:<fresh|warm>:<measure|sized>`. Printed: the start's seconds, vLLM's own start-up lines (as
cold_start.py reads them), and the functions the most stack samples were in (innermost frame of vLLM, torch,
Triton or transformers; and the vLLM frame nearest the top, which names the start-up phase).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cold_start import CACHES, vllm_phases  # noqa: E402  (benchmarks/, this script's directory)

# the compiled-artefact caches of cold_start.py (not its model or bytecode caches)
CACHE_VARS = {var: CACHES[var] for var in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
LIBRARIES = ("vllm/", "torch/", "triton/", "transformers/", "rollout/")


class StackSampler:
    """Samples `thread_id`'s stack (outermost frame first, as (file, function)) every `interval` seconds."""

    def __init__(self, interval: float, thread_id: int | None = None):
        import threading

        self.interval, self.target = interval, thread_id or threading.get_ident()
        self.stacks: list[list[tuple[str, str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            frame, frames = sys._current_frames().get(self.target), []
            while frame is not None:
                frames.append((frame.f_code.co_filename, frame.f_code.co_name))
                frame = frame.f_back
            if frames:
                self.stacks.append(frames[::-1])

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def child(args) -> None:
    """One start, in this process: sample the stacks, build the engine, print how long it took."""
    from rl.models import SMOLLM2, resolve_model_path
    from rollout.vllm_engine import VLLMEngine

    path = resolve_model_path(SMOLLM2)
    extra = json.loads(args.engine_args)
    if args.mode == "sized":
        from rollout.vllm_start_plan import device_identity, sized_kv_bytes

        sizing = {"model": path, "dtype": "bfloat16", "gpu_memory_utilization": args.gpu_mem,
                  "max_num_seqs": args.max_num_seqs, "max_model_len": args.max_model_len}
        kv = sized_kv_bytes(sizing, device_identity())
        if kv is None:
            raise SystemExit("these settings give no sized start")
        extra["kv_cache_memory_bytes"] = kv
    t0 = time.perf_counter()
    with StackSampler(args.interval) as sampler:
        VLLMEngine(path, dtype="bfloat16", gpu_memory_utilization=args.gpu_mem, enable_sleep_mode=True,
                   max_logprobs=65, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                   capture="sampler", extra_args=extra)
    seconds = time.perf_counter() - t0
    Path(args.stacks).write_text(json.dumps(sampler.stacks))
    print("START " + json.dumps({"seconds": round(seconds, 2)}), flush=True)
    os._exit(0)


def where(stacks: list[list[tuple[str, str]]], top: int = 12) -> dict[str, list[tuple[str, int]]]:
    """Samples per function: the innermost library frame, and the outermost vLLM frame below vllm.LLM's start."""
    def name(frame):
        f, fn = frame
        for lib in LIBRARIES:
            if lib in f:
                return f"{lib}{f.split(lib, 1)[1]}:{fn}"
        return f"{Path(f).name}:{fn}"

    inner, phase, chains = collections.Counter(), collections.Counter(), collections.Counter()
    for frames in stacks:
        lib = [fr for fr in frames if any(x in fr[0] for x in LIBRARIES)]
        if lib:
            inner[name(lib[-1])] += 1
            chains[";".join(name(fr) for fr in lib)] += 1
        deep = [fr for fr in frames if "vllm/" in fr[0]]
        if len(deep) > 4:
            phase[name(deep[4])] += 1
    return {"innermost": inner.most_common(top), "phase": phase.most_common(top),
            "stacks": chains.most_common(4 * top)}  # whole library chains (flame-graph lines), for a closer look


def run(args, spec: str, index: int) -> dict:
    cache, kind, mode = spec.split(":")
    folder = args.out / "caches" / cache
    if kind == "fresh":
        shutil.rmtree(folder, ignore_errors=True)
    env = {**os.environ, **{var: str(folder / sub) for var, sub in CACHE_VARS.items()}, "PYTHONUNBUFFERED": "1"}
    label = f"{index}_{cache}_{kind}_{mode}"
    stacks, log = args.out / f"{label}.stacks", args.out / f"{label}.log"
    cmd = [sys.executable, __file__, "--child", "--mode", mode, "--stacks", str(stacks), "--interval",
           str(args.interval), "--gpu-mem", str(args.gpu_mem), "--max-num-seqs", str(args.max_num_seqs),
           "--max-model-len", str(args.max_model_len), "--engine-args", args.engine_args]
    t0 = time.time()
    with open(log, "w") as f:
        code = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=args.timeout).returncode
    text = log.read_text(errors="replace")
    start = re.findall(r"START (\{.*\})", text)
    record = {"label": label, "exit_code": code, "process_s": round(time.time() - t0, 1),
              "start_s": json.loads(start[-1])["seconds"] if start else None, "vllm": vllm_phases(text),
              "engine_args": args.engine_args,
              **where(json.loads(stacks.read_text()) if stacks.exists() else [])}
    (args.out / f"{label}.json").write_text(json.dumps(record, indent=1))
    print(f"\n## {label}: engine start {record['start_s']} s (process {record['process_s']} s, exit {code}); "
          f"vLLM {record['vllm']}", flush=True)
    for title in ("phase", "innermost"):
        print(f"  samples x {args.interval} s by {title} frame: " +
              "; ".join(f"{fn} {n}" for fn, n in record[title]), flush=True)
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("/tmp/vllm-start"))
    ap.add_argument("--runs", nargs="+", default=["a:fresh:measure", "a:warm:measure", "b:fresh:sized"])
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between stack samples")
    ap.add_argument("--gpu-mem", type=float, default=0.15, help="gpu_memory_utilization (smol_math's)")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-model-len", type=int, default=768)
    ap.add_argument("--engine-args", default="{}", help="more vllm.LLM arguments, as JSON")
    ap.add_argument("--timeout", type=float, default=400)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="measure", help=argparse.SUPPRESS)
    ap.add_argument("--stacks", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    for spec in args.runs:
        if len(spec.split(":")) != 3 or spec.split(":")[1] not in ("fresh", "warm") or \
                spec.split(":")[2] not in ("measure", "sized"):
            raise SystemExit(f"--runs {spec!r}: expected <cache>:<fresh|warm>:<measure|sized>")
    for i, spec in enumerate(args.runs, 1):
        run(args, spec, i)


if __name__ == "__main__":
    main()
