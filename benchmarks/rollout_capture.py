"""Rollout throughput on vLLM 0.26 with capture off vs on (processed logprobs + kept sets + MoE routes).

Same prompts and sampling parameters for both (top_p=0.95, top_k=64, 1024 new tokens, 64 prompts x 8 samples),
random-weight models of the Qwen3-0.6B shape (dense) and a ~1.1B Qwen3-MoE (32 experts, top-4). "on" is what a
training run records: `logprobs=K` (K = top_k + 1 = 65, flat), the numpy conversion to kept-set CSR, and for the
MoE `enable_return_routed_experts` (an engine-level switch, so the MoE's "off" and "on" are two engines).
Each engine runs in its own process (vLLM holds its GPU memory until the process ends).

    python benchmarks/rollout_capture.py [--models dense moe] [--prompts 64] [--n 8] [--max-new-tokens 1024]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def child(args) -> None:
    from gpu_helpers import MOE_1B, QWEN3_06B, build_model, chat_prompts

    from rollout.sampling import SamplingParams
    from rollout.vllm_engine import VLLMEngine

    spec = {"dense": QWEN3_06B, "moe": MOE_1B}[args.model]
    path = build_model(Path(args.workdir) / args.model, spec)
    sp = SamplingParams(n=args.n, temperature=1.0, top_p=0.95, top_k=64, max_new_tokens=args.max_new_tokens, seed=None)
    engine = VLLMEngine(path, dtype="bfloat16", gpu_memory_utilization=args.gpu_mem, max_logprobs=65,
                        record_routes=args.routes, max_model_len=2048)
    prompts = chat_prompts(engine.tokenizer, args.prompts)
    for mode in args.modes:
        capture = mode == "on"
        engine.generate(prompts[:16], replace(sp, n=2, max_new_tokens=64), capture=capture)  # warm-up
        t0 = time.perf_counter()
        groups = engine.generate(prompts, sp, capture=capture)
        dt = time.perf_counter() - t0
        gens = [g for grp in groups for g in grp]
        tokens = sum(len(g.response_ids) for g in gens)
        row = dict(model=args.model, capture=mode, routes=args.routes, seconds=round(dt, 3), tokens=tokens,
                   tokens_per_s=round(tokens / dt, 1), convert_seconds=round(engine.last_convert_seconds, 3))
        if capture:
            kept = sum(int(g.mask_offsets[-1]) for g in gens if g.mask_offsets is not None)
            row["kept_ids_per_token"] = round(kept / max(tokens, 1), 2)
            row["mask_truncated_pos_frac"] = round(sum(g.mask_truncated for g in gens) / max(tokens, 1), 4)
            row["has_routes"] = all(g.routed_experts is not None for g in gens) if args.routes else False
        print("RESULT " + json.dumps(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["dense", "moe"])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=1024)
    ap.add_argument("--gpu-mem", type=float, default=0.85)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--model")
    ap.add_argument("--routes", action="store_true")
    ap.add_argument("--modes", nargs="+", default=["off", "on"])
    args = ap.parse_args()
    if args.child:
        return child(args)
    workdir = args.workdir or tempfile.mkdtemp(prefix="rollout-capture-")
    runs = []
    for model in args.models:
        if model == "dense":  # routes do not apply: one engine, both modes
            runs.append(["--model", "dense", "--modes", "off", "on"])
        else:  # routes are an engine switch: off without them, on with them
            runs += [["--model", model, "--modes", "off"], ["--model", model, "--routes", "--modes", "on"]]
    rows = []
    for extra in runs:
        cmd = [sys.executable, __file__, "--child", "--workdir", workdir, "--prompts", str(args.prompts), "--n",
               str(args.n), "--max-new-tokens", str(args.max_new_tokens), "--gpu-mem", str(args.gpu_mem), *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        out = [json.loads(x[7:]) for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode != 0 or not out:
            print(f"FAILED {' '.join(extra)} (rc {proc.returncode})\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}", flush=True)
        for row in out:
            print("RESULT " + json.dumps(row), flush=True)
        rows += out
    print(f"\n{args.prompts} prompts x {args.n} samples, up to {args.max_new_tokens} new tokens, top_p=0.95 top_k=64")
    print("| model | capture | tokens | seconds | tokens/s | conversion s | vs off |")
    print("|---|---|---|---|---|---|---|")
    base = {r["model"]: r["tokens_per_s"] for r in rows if r["capture"] == "off"}
    for r in rows:
        rel = f"{100 * (r['tokens_per_s'] / base[r['model']] - 1):+.1f}%" if r["model"] in base else "n/a"
        what = "on (logprobs K=65 + kept sets" + (" + routes)" if r["routes"] else ")") if r["capture"] == "on" else "off"
        print(f"| {r['model']} | {what} | {r['tokens']} | {r['seconds']} | {r['tokens_per_s']} | {r['convert_seconds']} | {rel} |")


if __name__ == "__main__":
    main()
