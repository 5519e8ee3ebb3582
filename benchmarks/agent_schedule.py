"""Agent step time: per-episode scheduling vs lockstep (issue 38), same policy, engine, tasks and seed.

One "step" is one `AgentRunner.run` over `--tasks` tasks x `--n` episodes, as a rollout worker runs an agent domain's
share of a GRPO step. lockstep: every turn of the step waits for the slowest episode's tool calls before any episode
generates again; per_episode: an episode's next turn goes to the engine as soon as its own tool results are back
(vLLM: its engine loop stepped directly, rollout/engine_stream.py). The environment should have uneven tool latency:
the default is code_repo, whose `run_tests` runs the repository's tests in the sandbox (tens to hundreds of ms,
depending on the repository and the tests asked for) while its other tools answer in microseconds.

The schedules alternate (`--reps` times each, after one untimed warm-up step each), the engine is built once, and
the printed table has per schedule: median and mean wall seconds per step, episodes, turns, tool calls, tool seconds
(summed over episodes), success. JSON to `--out`.

    python benchmarks/agent_schedule.py --out /tmp/agent_schedule                   # GPU: vLLM, SmolLM2
    python benchmarks/agent_schedule.py --out /tmp/agent_schedule --tiny --engine hf --tasks 2 --n 2 --reps 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCHEDULES = ("lockstep", "per_episode")


def build_engine(args):
    import torch

    from rl.models import SMOLLM2, resolve_model_path
    from rollout.engines import make_engine

    path = resolve_model_path("embedded:tiny-dense" if args.tiny else (args.model or SMOLLM2))
    engine = args.engine if args.engine != "auto" else ("vllm" if torch.cuda.is_available() else "hf")
    rcfg = {"engine": engine, "device": "auto", "max_batch_size": 64, "gpu_memory_utilization": 0.5,
            "per_request_seed": True, "top_k": 0, "capture": "sampler"}
    dtype = "bfloat16" if engine == "vllm" else "float32"
    return make_engine(rcfg, {"dtype": dtype}, path, record_routes=False, seed=args.seed), engine


def run_step(runner, tasks: list[dict], sp) -> tuple[float, list]:
    requests = [{"group_id": f"t{i}", "domain": "agent", "prompt_ids": [], "prompt_text": "",
                 "sample": {"id": t["id"], "prompt": t["prompt"]}} for i, t in enumerate(tasks)]
    t0 = time.perf_counter()
    trajs = runner.run(requests, sp)
    return time.perf_counter() - t0, trajs


def summarize(walls: list[float], steps: list[list]) -> dict:
    eps = [t.episode for trajs in steps for t in trajs]
    calls = [c for e in eps for c in e["calls"]]
    return {"steps": len(walls), "wall_median_s": round(statistics.median(walls), 3),
            "wall_mean_s": round(statistics.fmean(walls), 3), "walls_s": [round(w, 3) for w in walls],
            "episodes": len(eps), "turns": sum(e["turns"] for e in eps), "tool_calls": len(calls),
            "tool_seconds": round(sum(c["seconds"] for c in calls), 3),
            "tool_seconds_max_call": round(max((c["seconds"] for c in calls), default=0.0), 3),
            "tools": {name: sum(c["tool"] == name for c in calls) for name in sorted({c["tool"] for c in calls})},
            "success": round(statistics.fmean(e["outcome"]["score"] for e in eps), 3) if eps else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--env", default="code_repo")
    ap.add_argument("--model", help="a model path (default SmolLM2-135M-Instruct)")
    ap.add_argument("--tiny", action="store_true", help="the embedded tiny model (CPU check)")
    ap.add_argument("--engine", default="auto", choices=("auto", "vllm", "hf"))
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--n", type=int, default=8, help="episodes per task")
    ap.add_argument("--reps", type=int, default=3, help="timed steps per schedule")
    ap.add_argument("--max-turns", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--demo", action="store_true", default=True, help="show a solved task first (default on)")
    ap.add_argument("--no-demo", dest="demo", action="store_false")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from rollout.agent import AgentConfig, AgentRunner
    from rollout.sampling import SamplingParams

    engine, kind = build_engine(args)
    runners = {s: AgentRunner(engine, engine.tokenizer, AgentConfig(
        env=args.env, max_turns=args.max_turns, max_context_tokens=4096, max_episode_tokens=3072,
        max_tool_output_tokens=384, demo=args.demo, schedule=s)) for s in SCHEDULES}
    tasks = runners["lockstep"].env.tasks()[: args.tasks]
    sp = SamplingParams(n=args.n, temperature=args.temperature, top_p=1.0, max_new_tokens=args.max_new_tokens,
                        seed=args.seed, record_kept_set=False)
    walls: dict[str, list] = {s: [] for s in SCHEDULES}
    steps: dict[str, list] = {s: [] for s in SCHEDULES}
    for s in SCHEDULES:  # warm-up: engine graphs, environment caches
        run_step(runners[s], tasks, sp)
    for rep in range(args.reps):
        for s in SCHEDULES if rep % 2 == 0 else SCHEDULES[::-1]:
            wall, trajs = run_step(runners[s], tasks, sp)
            walls[s].append(wall)
            steps[s].append(trajs)
            print(f"rep {rep} {s}: {wall:.2f} s", flush=True)
    result = {"engine": kind, "env": args.env, "tasks": len(tasks), "n": args.n, "demo": args.demo,
              "max_turns": args.max_turns, "max_new_tokens": args.max_new_tokens,
              **{s: summarize(walls[s], steps[s]) for s in SCHEDULES}}
    lock, per = result["lockstep"]["wall_median_s"], result["per_episode"]["wall_median_s"]
    result["speedup_median"] = round(lock / per, 3) if per else None
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "agent_schedule.json").write_text(json.dumps(result, indent=1))
    print(f"\n{kind}, env {args.env}, {len(tasks)} tasks x {args.n} episodes, {args.reps} timed steps per schedule")
    print("| schedule | median s/step | mean s/step | turns | tool calls | tool s (sum) | longest call s | success |")
    print("|---|---|---|---|---|---|---|---|")
    for s in SCHEDULES:
        r = result[s]
        print(f"| {s} | {r['wall_median_s']} | {r['wall_mean_s']} | {r['turns']} | {r['tool_calls']} | "
              f"{r['tool_seconds']} | {r['tool_seconds_max_call']} | {r['success']} |")
    print(f"lockstep / per_episode (median): {result['speedup_median']}")
    for s in SCHEDULES:
        print(f"{s} tools called: {result[s]['tools']}")
    close = getattr(engine, "close", None)
    for r in runners.values():
        r.close()
    if callable(close):
        close()


if __name__ == "__main__":
    main()
