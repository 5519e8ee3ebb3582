"""Cold start (issue 37): seconds from the command to the end of step 1, and where they go.

Each run is `python -m launch.train +experiment=<experiment> trainer.total_steps=1 eval.every=0` in a fresh
subprocess (no W&B, no checkpoint), timed from just before the command starts. Every cache a run fills lives under
`--out/caches` (the environment points them there), so the machine's own caches are never touched and a `fresh` run
starts from nothing:

- MIXRL_CACHE: the converted model (SmolLM2's GGUF -> an HF directory) and the embedded models;
- VLLM_CACHE_ROOT: vLLM's torch.compile artefacts (and its other derived state);
- TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR: Inductor's and Triton's compiled kernels;
- PYTHONPYCACHEPREFIX: Python's bytecode of every module imported (a fresh install with `pip --no-compile`, as the
  device machines get, has none). PYTHONDONTWRITEBYTECODE is dropped from the runs' environment, so they write it
  as a user's first run does.

Runs, in the order given (`--runs fresh warm warm`): `fresh` empties those caches first, `warm` keeps what the runs
before it left, `installed` is a fresh run after compiling the installed packages' bytecode into the emptied cache
(what a plain `pip install` leaves on a user's fresh machine; an image installed with `--no-compile`, as the device
machines are, has none): its seconds are printed apart (`bytecode_s`), not counted in the run's. Not emulated: the
OS's page cache (files read before stay in memory) and a fresh Ray / CUDA driver state, so a `fresh` run here is at
best as slow as the first run on a new machine.

What is printed per run: seconds to step 1 (the run's own start-up timeline, launch/startup.py, which counts from
its process's creation), the whole command's wall time, the timeline's milestones, and vLLM's own start-up lines
from the run's log (weights loaded, torch.compile, CUDA-graph capture, the whole engine init; one value per vLLM
instance).

    python benchmarks/cold_start.py --out /tmp/cold                                   # smol_math: fresh, warm
    python benchmarks/cold_start.py --out /tmp/cold --runs installed warm             # as after a plain pip install
    python benchmarks/cold_start.py --out /tmp/cold --runs installed --keep-models    # ... with the model on disk
    python benchmarks/cold_start.py --out /tmp/cold --runs warm --label eager --override rollout.enforce_eager=true
    python benchmarks/cold_start.py --out /tmp/cold --report                          # the table of what --out holds
    python benchmarks/cold_start.py --out /tmp/cold_cpu --experiment mixed_rl         # CPU check, embedded default
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The environment variable of each cache, and its folder under --out/caches.
CACHES = {"MIXRL_CACHE": "mixrl", "VLLM_CACHE_ROOT": "vllm", "TORCHINDUCTOR_CACHE_DIR": "inductor",
          "TRITON_CACHE_DIR": "triton", "PYTHONPYCACHEPREFIX": "pycache"}

# vLLM 0.26's start-up log lines (seconds), one match per vLLM instance.
VLLM_PHASES = {
    "load_weights": r"Loading weights took ([\d.]+) seconds",
    "model_loading": r"Model loading took [\d.]+ Gi?B(?: memory)? and ([\d.]+) seconds",
    "dynamo": r"Dynamo bytecode transform time: ([\d.]+) s",
    "compile": r"torch\.compile took ([\d.]+) s in total",
    "graph_capture": r"Graph capturing finished in ([\d.]+) secs",
    "init_engine": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
}
COMPILE_CACHE_HIT = r"Directly load the compiled graph"


def vllm_phases(log_text: str) -> dict[str, list[float]]:
    """Each vLLM start-up phase's seconds as logged, one per instance (in log order); `compile_cache_hits`: how
    many compiled graphs were loaded from the cache instead of compiled."""
    out: dict[str, list[float]] = {name: [float(m) for m in re.findall(pattern, log_text)]
                                   for name, pattern in VLLM_PHASES.items()}
    out = {name: values for name, values in out.items() if values}
    hits = len(re.findall(COMPILE_CACHE_HIT, log_text))
    if hits:
        out["compile_cache_hits"] = [float(hits)]
    return out


def cache_env(out: Path) -> dict[str, str]:
    return {var: str(out / "caches" / folder) for var, folder in CACHES.items()}


def command(experiment: str, run_dir: Path, overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "launch.train", f"+experiment={experiment}", f"run_dir={run_dir}",
            "trainer.total_steps=1", "eval.every=0", "eval.before_train=false", "trainer.save_last=false",
            "logger.mode=disabled", "logger.progress_bar=false", *overrides]


def installed_packages() -> list[str]:
    """Where this interpreter's packages are installed (site-packages: pure and platform-specific, once each)."""
    paths = sysconfig.get_paths()
    return sorted({paths["purelib"], paths["platlib"]})


def compile_bytecode(env: dict[str, str], folders: list[str]) -> float:
    """Compile every module under `folders` into the run's bytecode cache (env's PYTHONPYCACHEPREFIX), as pip does at
    install; returns the seconds. A file that does not compile (a template, a test fixture) is skipped, as by pip."""
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", *folders], env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return round(time.time() - t0, 1)


def empty_caches(out: Path, keep_models: bool = False) -> None:
    """Empty every cache under out/caches; `keep_models`: but MIXRL_CACHE's models (its folders with a config.json:
    the converted SmolLM2, the embedded models), as a user's checkpoint is on disk before a first run."""
    root = out / "caches"
    kept = root.with_name("caches.models")
    shutil.rmtree(kept, ignore_errors=True)
    mixrl = root / CACHES["MIXRL_CACHE"]
    if keep_models and mixrl.is_dir():
        kept.mkdir(parents=True)
        for folder in mixrl.iterdir():
            if (folder / "config.json").is_file():
                folder.rename(kept / folder.name)
    shutil.rmtree(root, ignore_errors=True)
    if kept.is_dir():
        mixrl.mkdir(parents=True)
        for folder in kept.iterdir():
            folder.rename(mixrl / folder.name)
        kept.rmdir()


def cold_start(out: Path, label: str, kind: str, experiment: str, overrides: list[str], timeout: float,
               packages: list[str] | None = None, keep_models: bool = False) -> dict:
    """One run; `kind` fresh empties the caches first (but the models with `keep_models`), installed also compiles
    `packages` (default: this interpreter's site-packages) into the bytecode cache before the run. Returns its record
    (also written to out/<label>.json)."""
    if kind in ("fresh", "installed"):
        empty_caches(out, keep_models)
    env = {**os.environ, **cache_env(out), "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode is written, as by any user's first run
    for path in cache_env(out).values():
        Path(path).mkdir(parents=True, exist_ok=True)
    bytecode_s = None
    if kind == "installed":
        bytecode_s = compile_bytecode(env, packages or installed_packages())
        print(f"[cold_start] {label}: installed packages' bytecode compiled in {bytecode_s} s (not counted)",
              flush=True)
    run_dir = out / label
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = command(experiment, run_dir, overrides)
    print(f"[cold_start] {label} ({kind}): {' '.join(cmd[1:])}", flush=True)
    t0 = time.time()
    with open(out / f"{label}.log", "w") as log:
        # its own process group: a run past its time is ended whole (Ray, vLLM), not left holding the GPU
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    wall = round(time.time() - t0, 1)
    summary_path = run_dir / "summary.json"
    start_up = json.loads(summary_path.read_text()).get("start_up", {}) if summary_path.exists() else {}
    train_log = run_dir / "train.log"
    record = {"label": label, "kind": kind, "keep_models": keep_models, "experiment": experiment,
              "overrides": overrides, "exit_code": code,
              "bytecode_s": bytecode_s, "wall_s": wall, "step1_s": start_up.get("first_step"), "start_up": start_up,
              "vllm": vllm_phases(train_log.read_text(errors="replace")) if train_log.exists() else {},
              "command": " ".join(cmd[1:])}
    (out / f"{label}.json").write_text(json.dumps(record, indent=1))
    print(f"[cold_start] {label}: step 1 at {record['step1_s']} s, command {wall} s, exit {code}", flush=True)
    return record


def table(records: list[dict]) -> str:
    rows = ["| run | step 1 (s) | command (s) | start-up timeline (s) | vLLM start-up, per instance (s) |",
            "|---|---|---|---|---|"]
    for r in records:
        timeline = ", ".join(f"{k} {v:.1f}" for k, v in r["start_up"].items()) or "-"
        phases = "; ".join(f"{k} {'/'.join(f'{x:g}' for x in v)}" for k, v in r["vllm"].items()) or "-"
        extra = f" ({' '.join(r['overrides'])})" if r["overrides"] else ""
        if r.get("bytecode_s") is not None:
            extra += f" (bytecode compiled before, {r['bytecode_s']:.1f} s)"
        step1 = f"{r['step1_s']:.1f}" if r["step1_s"] is not None else f"none (exit {r['exit_code']})"
        rows.append(f"| {r['label']}: {r['kind']}{extra} | {step1} | {r['wall_s']:.1f} | {timeline} | {phases} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--runs", nargs="+", default=["fresh", "warm"], choices=["fresh", "installed", "warm"])
    ap.add_argument("--label", default="", help="prefix of this invocation's run names (default: none)")
    ap.add_argument("--experiment", default="smol_math")
    ap.add_argument("--override", nargs="*", default=[], help="more Hydra overrides for every run")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run")
    ap.add_argument("--keep-models", action="store_true",
                    help="fresh/installed runs keep the converted and embedded models (a user's HF checkpoint needs "
                         "no conversion); every other cache, the vLLM start plans included, is emptied")
    ap.add_argument("--report", action="store_true", help="print the table of every run --out holds and stop")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report:
        prefix = f"{args.label}_" if args.label else ""
        for i, kind in enumerate(args.runs, 1):
            cold_start(args.out, f"{prefix}{i}_{kind}", kind, args.experiment, list(args.override), args.timeout,
                       keep_models=args.keep_models)
    records = [json.loads(p.read_text()) for p in sorted(args.out.glob("*.json"), key=lambda p: p.stat().st_mtime)]
    print(table(records))


if __name__ == "__main__":
    main()
