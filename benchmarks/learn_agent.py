"""Tool-use learning on a real model (GPU): GRPO on SmolLM2-135M-Instruct in the bundled smoke environment.

`python -m launch.train +experiment=smol_agent` (conf/experiment/smol_agent.yaml): the agent domain alone, 32 tasks
x 8 episodes per step, up to 4 model turns of 64 tokens at T=0.7, Hermes <tool_call> JSON (SmolLM2's template has no
tools, so the format is described in the system message), one solved episode of another task shown first
(`agent.demo`), reward = the environment's verifier (1 when the submitted value is the stored one). Each run goes to
`--out/<name>/`; `--report` prints success (first and last 10 steps), tool calls per episode and s/step, writes the
plot (`--plot`) and, with `--readme`, the section between the markers in benchmarks/README.md.

    python benchmarks/learn_agent.py --out /tmp/learn_agent --steps 50 [--extra key=value ...]
    python benchmarks/learn_agent.py --report --out /tmp/learn_agent --plot benchmarks/learn_agent.png --readme
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from learn_real import plot_curves, write_readme_section  # noqa: E402  (benchmarks/, this script's directory)
from run_env import read_jsonl  # noqa: E402

SUCCESS = "episode/agent/success"  # rl/metrics.py: episode/<domain>/success


def run(out: Path, name: str, steps: int, extra: list[str]) -> None:
    cmd = [sys.executable, "-m", "launch.train", "+experiment=smol_agent", f"run_dir={out / name}",
           f"trainer.total_steps={steps}", "logger.mode=disabled", "logger.progress_bar=false", *extra]
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{name}.log", "w") as log:
        subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False)


def load(out: Path) -> dict[str, list[dict]]:
    runs = {}
    for path in sorted(out.glob("*/metrics.jsonl")):
        runs[path.parent.name] = read_jsonl(path)
    return runs


def report(args) -> None:
    runs = load(Path(args.out))
    mean = lambda xs: sum(xs) / max(len(xs), 1)  # noqa: E731
    lines = ["| run | steps | success, first 10 steps | success, last 10 steps | tool calls per episode, first / last 10 "
             "| s/step (steps 2+) |", "|---|---|---|---|---|---|"]
    for name, rows in runs.items():
        ok = [r.get(SUCCESS, 0.0) for r in rows]
        calls = [r.get("episode/agent/tool_calls") for r in rows]
        calls = [c for c in calls if c is not None]
        secs = [r["time/step"] for r in rows[1:]]
        lines.append(f"| {name} | {len(rows)} | {mean(ok[:10]):.3f} | {mean(ok[-10:]):.3f} | "
                     f"{mean(calls[:10]):.2f} / {mean(calls[-10:]):.2f} | {mean(secs):.2f} |")
    table = "\n".join(lines)
    print(table)
    if args.plot and runs:
        plot_curves(args.plot, {n: ([r["step"] for r in rows], [r.get(SUCCESS, 0.0) for r in rows])
                                for n, rows in runs.items()},
                    "episode success (verifier)", "GRPO tool use on SmolLM2-135M-Instruct, smoke environment")
    if args.readme:
        write_readme_section("learn_agent", "tool-use learning on a real model", args.note, table)

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", default="smol_agent")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--extra", nargs="*", default=[], help="more overrides of +experiment=smol_agent")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--plot")
    ap.add_argument("--readme", action="store_true")
    ap.add_argument("--note", default="", help="text above the table in the README (machine, command)")
    args = ap.parse_args()
    if not args.report:
        run(Path(args.out), args.name, args.steps, args.extra)
    report(args)


if __name__ == "__main__":
    main()
