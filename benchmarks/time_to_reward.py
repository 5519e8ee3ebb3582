"""Time to reward (issue 37): wall seconds from the command to a held-out pass@1 target on `smol_math`, cold start
included, for this project (with and without dynamic sampling), TRL's GRPOTrainer and verl on the same task.

Each run starts as a fresh command. Ours is `python -m launch.train +experiment=smol_math` with `eval.every=N`, and
its metrics.jsonl gives `eval/math/pass@1`. TRL is `benchmarks/learn_real.py --trl-child --eval-every N`, and its
steps.jsonl gives `eval_reward`: the mean 0/1 math reward of 4 samples on each of the same 64 held-out prompts,
which is pass@1. A run is watched from outside: the first evaluation at or above `--target` stops the clock, and the
run is stopped. A run that never gets there within `--max-steps` or `--timeout` is reported as not reached, with its
best evaluation.
verl is `benchmarks/verl_peer.py --bench smol --eval-every N` (verl 0.9.1, the smol benchmark's matched settings,
`verl` at its defaults, `verl_best` at its best: see that script): verl's own validation every N steps on the same
64 held-out prompts, 4 samples each at temperature 1, and its file logger's `val-core/<source>/acc/mean@4` gives
pass@1. It needs verl's wheels and at least 13 CPUs (verl_peer.py).
`ours_overlap` is ours with the next step's rollout generating while a step trains (vLLM stays awake on the GPU).
`ours_bitwise` is ours with `algorithm.on_policy=bitwise` (issue 39): with a target no run reaches (e.g. 1.1) every run
goes to `--max-steps`, and the table gives the learning curves side by side with each run's median s/step and its
largest `mismatch/logprob_abs` (0.0 on every step is the mode's claim).

    python benchmarks/time_to_reward.py --out /tmp/ttr --target 0.3 --every 5 --max-steps 60   # ours, ours_ds, trl, verl_best
    python benchmarks/time_to_reward.py --out /tmp/bw --target 1.1 --every 5 --max-steps 20 --runs ours ours_bitwise
    python benchmarks/time_to_reward.py --out /tmp/ttr --target 0.3 --every 5 --max-steps 60 --runs ours trl verl_best
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from run_env import drop_ray_folder, read_jsonl, run_env  # benchmarks/, this script's directory

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("ours", "ours_ds", "ours_overlap", "ours_bitwise", "trl", "verl", "verl_best")
LABELS = {"ours": "ours (smol_math)", "ours_ds": "ours + dynamic sampling (data.dynamic_sampling.enabled)",
          "ours_overlap": "ours, vLLM awake and one step off (rollout.enable_sleep_mode=false, max_staleness=1)",
          "ours_bitwise": "ours, bitwise on-policy (algorithm.on_policy=bitwise)",
          "trl": "TRL 1.16 GRPOTrainer (learn_real.py's settings)",
          "verl": "verl 0.9.1, its defaults (verl_peer.py)", "verl_best": "verl 0.9.1, its best setting (verl_peer.py)"}
RUN_OVERRIDES = {"ours_ds": ["data.dynamic_sampling.enabled=true"], "ours_bitwise": ["algorithm.on_policy=bitwise"],
                 # the next step's rollout generates while this step trains, on the same GPU
                 "ours_overlap": ["rollout.enable_sleep_mode=false", "rollout.max_staleness=1"]}
DEFAULT_RUNS = ("ours", "ours_ds", "trl", "verl_best")
VERL_SETTING = {"verl": "defaults", "verl_best": "best"}
# verl's core validation metric of the held-out prompts (verl_peer.overrides): the mean 0/1 score of its samples.
# Its reward loop files a float score as `acc` too, which then is the core one (`reward` without it)
VERL_PASS_AT_1 = re.compile(r"^val-core/.+/(?:acc|reward)/mean@\d+$")


def command(run: str, run_dir: Path, every: int, max_steps: int, extra: list[str],
            experiment: str = "smol_math") -> list[str]:
    """The run's command line; `extra`: more Hydra overrides for ours, more learn_real.py arguments for TRL;
    `experiment`: ours' experiment (another one for a check on the CPU; its math domain is the one evaluated)."""
    if run == "trl":
        return [sys.executable, str(ROOT / "benchmarks" / "learn_real.py"), "--trl-child", "--out",
                str(run_dir.parent), "--run", run_dir.name, "--steps", str(max_steps), "--eval-every", str(every),
                *extra]
    if run in VERL_SETTING:  # its run's timeout is this script's (it stops the run)
        return [sys.executable, str(ROOT / "benchmarks" / "verl_peer.py"), "--out", str(run_dir.parent), "--bench",
                "smol", "--setting", VERL_SETTING[run], "--name", run_dir.name, "--steps", str(max_steps),
                "--eval-every", str(every), "--timeout", str(10**6), *extra]
    return [sys.executable, "-m", "launch.train", f"+experiment={experiment}", f"run_dir={run_dir}",
            f"trainer.total_steps={max_steps}", f"eval.every={every}", "logger.mode=disabled",
            "logger.progress_bar=false", *RUN_OVERRIDES.get(run, []), *extra]


def evaluations(run: str, run_dir: Path) -> list[tuple[int, float]]:
    """(step, held-out pass@1) of every evaluation the run has written so far."""
    path = run_dir / ("metrics.jsonl" if run.startswith("ours") else "steps.jsonl")
    key = "eval_reward" if run == "trl" else "eval/math/pass@1"
    out = []
    for row in read_jsonl(path):
        if run in VERL_SETTING:  # verl's file logger: {"step", "data": {metric: value}}
            row = {"step": row.get("step"), **{key: v for k, v in (row.get("data") or {}).items()
                                               if VERL_PASS_AT_1.match(k)}}
        if isinstance(row.get(key), (int, float)):
            out.append((int(row["step"]), float(row[key])))
    return out


def step_seconds(run: str, run_dir: Path) -> list[float]:
    """Each training step's own seconds, in step order, from the run's own log: ours' `time/step`, TRL's
    `seconds` (learn_real.py's step callback), verl's `timing_s/step` (its file logger)."""
    if run.startswith("ours"):
        return [r["time/step"] for r in read_jsonl(run_dir / "metrics.jsonl")
                if isinstance(r.get("time/step"), (int, float))]
    rows = read_jsonl(run_dir / "steps.jsonl")
    if run in VERL_SETTING:
        rows = [{"step": r.get("step"), "seconds": (r.get("data") or {}).get("timing_s/step")} for r in rows]
    timed = {r["step"]: r["seconds"] for r in rows
             if isinstance(r.get("step"), int) and isinstance(r.get("seconds"), (int, float))}
    return [timed[k] for k in sorted(timed)]


def train_stats(run: str, run_dir: Path) -> dict:
    """The median s/step over the steps after the first, the first step's own seconds (start-up compiles land
    there), and for ours the largest and smallest train-inference logprob mismatch of any step."""
    seconds = step_seconds(run, run_dir)
    times = sorted(seconds[1:]) or seconds
    mismatch = [r["mismatch/logprob_abs"] for r in read_jsonl(run_dir / "metrics.jsonl")
                if isinstance(r.get("mismatch/logprob_abs"), (int, float))] if run.startswith("ours") else []
    return {"s_per_step": round(times[len(times) // 2], 3) if times else None,
            "first_step_s": round(seconds[0], 3) if seconds else None,
            "mismatch_max": max(mismatch) if mismatch else None, "mismatch_min": min(mismatch) if mismatch else None,
            "steps": len(seconds)}


def first_reaching(evals: list[tuple[int, float, float]], target: float) -> tuple[int, float, float] | None:
    """The first (step, pass@1, seconds) at or above `target`."""
    return next((e for e in evals if e[1] >= target), None)


def stop(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """Ctrl-C to the run's process group (our runs close their actors), up to `grace` seconds for it to end, then
    SIGKILL to whatever of the group is left (a straggler holding the GPU would spoil the next run's cold start)."""
    try:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the whole group has already ended
        pass
    proc.wait()


def time_to_reward(run: str, out: Path, target: float, every: int, max_steps: int, timeout: float,
                   extra: list[str], poll: float = 1.0, experiment: str = "smol_math") -> dict:
    """Start the run, watch its evaluations, stop it at the first one at or above `target`; the seconds count from
    just before the command starts (each evaluation's seconds: when the watcher first saw it, <= `poll` late)."""
    run_dir = out / run
    if run_dir.exists():  # an earlier run's evaluations would be read as this one's
        print(f"[time_to_reward] {run}: removing the earlier run in {run_dir}", flush=True)
        shutil.rmtree(run_dir)
    cmd = command(run, run_dir, every, max_steps, extra, experiment)
    seen: list[tuple[int, float, float]] = []
    t0 = time.time()
    with open(out / f"{run}.log", "w") as log:
        # SIGINT restored: a shell's background job (a batch script's `cmd &`) starts with it ignored, and the run
        # would inherit that and go on to its last step when `stop` asks it to end (seen on the device)
        env = run_env("ray-ttr-")  # a Ray folder of its own (runs side by side on one machine), the project importable
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            while time.time() - t0 < timeout:
                for step, value in evaluations(run, run_dir)[len(seen):]:
                    seen.append((step, value, round(time.time() - t0, 1)))
                    print(f"[time_to_reward] {run}: step {step} pass@1 {value:.3f} at {seen[-1][2]:.0f} s", flush=True)
                if first_reaching(seen, target) or proc.poll() is not None:
                    break
                time.sleep(poll)
        finally:
            stop(proc)
    # stopped at its target: a clean end whatever the signal's exit code
    drop_ray_folder(env, 0 if first_reaching(seen, target) else proc.returncode)
    if proc.returncode and not seen:  # it failed before any evaluation: say why here, not only in its log
        tail = (out / f"{run}.log").read_text(errors="replace").strip().splitlines()[-15:]
        print(f"[time_to_reward] {run}: exited {proc.returncode} before any evaluation; its log ends:\n  "
              + "\n  ".join(tail), flush=True)
    hit = first_reaching(seen, target)
    best = max(seen, key=lambda e: e[1]) if seen else None
    return {"run": run, "target": target, "reached": hit is not None, "seconds": hit[2] if hit else None,
            "step": hit[0] if hit else None, "best_pass@1": best[1] if best else None,
            "evaluations": [list(e) for e in seen], "exit_code": proc.returncode, "command": " ".join(cmd[1:]),
            **train_stats(run, run_dir)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--target", type=float, required=True, help="held-out pass@1 to reach")
    ap.add_argument("--runs", nargs="+", default=list(DEFAULT_RUNS), choices=RUNS)
    ap.add_argument("--every", type=int, default=5, help="steps between held-out evaluations")
    ap.add_argument("--max-steps", type=int, default=60)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    ap.add_argument("--ours-extra", default="", help="more Hydra overrides for our runs, one string")
    ap.add_argument("--trl-extra", default="", help="more learn_real.py arguments for TRL, one string "
                    "(--trl-extra='--vllm-mem 0.4')")
    ap.add_argument("--experiment", default="smol_math", help="our runs' experiment (its math domain is evaluated)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for run in args.runs:  # one after the other: each one's cold start on a machine nothing else uses
        extra = shlex.split(args.trl_extra if run == "trl" else "" if run in VERL_SETTING else args.ours_extra)
        results.append(time_to_reward(run, args.out, args.target, args.every, args.max_steps, args.timeout, extra,
                                      experiment=args.experiment))
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\n| run | held-out pass@1 >= {args.target} after | at step | best pass@1 | pass@1 by step | "
          "median s/step (step 1's own) | mismatch/logprob_abs min-max |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        when = f"{r['seconds']:.0f} s" if r["reached"] else "not reached"
        best = f"{r['best_pass@1']:.3f}" if r["best_pass@1"] is not None else "-"
        label = LABELS[r["run"]].replace("smol_math", args.experiment)
        curve = " ".join(f"{step}:{value:.3f}" for step, value, _ in r["evaluations"]) or "-"
        pace = f"{r['s_per_step']:.2f}" if r.get("s_per_step") is not None else "-"
        if r.get("first_step_s") is not None:
            pace += f" ({r['first_step_s']:.1f})"
        gap = f"{r['mismatch_min']:.4g}-{r['mismatch_max']:.4g}" if r.get("mismatch_max") is not None else "-"
        print(f"| {label} | {when} | {r['step'] or '-'} | {best} | {curve} | {pace} | {gap} |")


if __name__ == "__main__":
    main()
