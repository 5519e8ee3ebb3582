"""Train-inference mismatch on a real model, with and without the float32 LM head (`model.fp32_lm_head`), and its cost.

SmolLM2-135M-Instruct in bf16 on vLLM 0.26 (sampler capture) samples 64 bundled arithmetic prompts x 4 at T=1,
top_p=1.0, up to 192 tokens; the trainer's forward (`trainer.forward.forward_logprobs`, bf16 body) then scores
the same tokens at the same weights. Reported: mean |log pi_trainer - log pi_vllm| over all sampled tokens and by
the trainer's full-vocabulary entropy at the position (< 0.5, 0.5-2, > 2), for each (vLLM head, trainer head)
pair; vLLM tokens/s with each head; the trainer's forward+backward time of the batch with each head.
One vLLM engine per process (`--child`).

    python benchmarks/mismatch_real.py [--prompts 64] [--n 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

SYSTEM = "Solve the problem. Put the final answer in \\boxed{}."


def child(args) -> None:
    import numpy as np
    import torch

    from rl.data import BUNDLED_DIR
    from rl.models import SMOLLM2, load_causal_lm, resolve_model_path
    from rl.trajectory import Trajectory, collate
    from rollout.sampling import SamplingParams
    from rollout.vllm_engine import VLLMEngine
    from trainer.forward import forward_logprobs

    path = resolve_model_path(SMOLLM2)
    engine = VLLMEngine(path, dtype="bfloat16", gpu_memory_utilization=0.3, capture="sampler",
                        fp32_lm_head=args.vllm_fp32, record_routes=False)
    tok = engine.tokenizer
    rows = [json.loads(x) for x in (BUNDLED_DIR / "math.jsonl").read_text().splitlines()[: args.prompts]]
    prompts = [tok(tok.apply_chat_template([{"role": "system", "content": SYSTEM},
                                            {"role": "user", "content": r["question"]}], tokenize=False,
                                           add_generation_prompt=True), add_special_tokens=False)["input_ids"]
               for r in rows]
    sp = SamplingParams(n=args.n, temperature=1.0, top_p=1.0, max_new_tokens=192, seed=None)
    engine.generate(prompts[:8], sp)  # warm-up
    t0 = time.perf_counter()
    groups = engine.generate(prompts, sp)
    dt = time.perf_counter() - t0
    trajs = [Trajectory(uid=f"{i}-{j}", group_id=str(i), domain="math", prompt_ids=p, response_ids=g.response_ids,
                        inference_logprobs=g.inference_logprobs)
             for i, (p, gens) in enumerate(zip(prompts, groups)) for j, g in enumerate(gens)]
    tokens = sum(t.num_response_tokens for t in trajs)
    print("RESULT " + json.dumps({"kind": "vllm", "vllm_fp32_head": args.vllm_fp32, "tokens": tokens,
                                  "tokens_per_s": round(tokens / dt, 1)}), flush=True)
    model = load_causal_lm(path, "bfloat16", "sdpa", "cuda")
    for trainer_fp32 in (False, True):
        diffs, ents, secs = [], [], []
        for start in range(0, len(trajs), 32):
            batch = collate(trajs[start : start + 32], tok.pad_token_id).to("cuda")
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            out = forward_logprobs(model, batch, temperature=1.0, with_entropy=True, fp32_head=trainer_fp32)
            out.logprobs.sum().backward()
            torch.cuda.synchronize()
            secs.append(time.perf_counter() - t1)
            model.zero_grad(set_to_none=True)
            diffs.append((out.logprobs.detach().float() - batch.inference_logprobs).abs().cpu().numpy())
            ents.append(out.full_entropy.float().cpu().numpy())
        d, e = np.concatenate(diffs), np.concatenate(ents)
        row = {"kind": "pair", "vllm_fp32_head": args.vllm_fp32, "trainer_fp32_head": trainer_fp32,
               "mean_abs": round(float(d.mean()), 4), "max_abs": round(float(d.max()), 3),
               "low_entropy": round(float(d[e < 0.5].mean()), 4) if (e < 0.5).any() else None,
               "mid_entropy": round(float(d[(e >= 0.5) & (e <= 2)].mean()), 4) if ((e >= 0.5) & (e <= 2)).any() else None,
               "high_entropy": round(float(d[e > 2].mean()), 4) if (e > 2).any() else None,
               "tokens": int(len(d)), "train_fwd_bwd_s": round(sum(secs[1:]) / max(len(secs) - 1, 1), 4)}
        print("RESULT " + json.dumps(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--vllm-fp32", action="store_true")
    args = ap.parse_args()
    if args.child:
        return child(args)
    rows = []
    for fp32 in (False, True):
        cmd = [sys.executable, __file__, "--child", "--prompts", str(args.prompts), "--n", str(args.n)]
        cmd += ["--vllm-fp32"] if fp32 else []
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        got = [json.loads(x[7:]) for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        for r in got:
            print(json.dumps(r), flush=True)
        if proc.returncode or not got:
            print(f"FAILED vllm_fp32={fp32} (rc {proc.returncode})\n{proc.stderr[-4000:]}", flush=True)
        rows += got
    print("\n| vLLM LM head | trainer LM head | mean abs dlogp | entropy < 0.5 | 0.5-2 | > 2 | max | trainer fwd+bwd s / 32 samples |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["kind"] == "pair":
            h = lambda x: "fp32" if x else "bf16"  # noqa: E731
            print(f"| {h(r['vllm_fp32_head'])} | {h(r['trainer_fp32_head'])} | {r['mean_abs']} | {r['low_entropy']} | "
                  f"{r['mid_entropy']} | {r['high_entropy']} | {r['max_abs']} | {r['train_fwd_bwd_s']} |")
    for r in rows:
        if r["kind"] == "vllm":
            print(f"vLLM {'fp32' if r['vllm_fp32_head'] else 'bf16'} LM head: {r['tokens_per_s']} tokens/s ({r['tokens']} tokens)")


if __name__ == "__main__":
    main()
