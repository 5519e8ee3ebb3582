"""Reward throughput: samples/s for math (math-verify in the process pool) and code (sandboxed tests).

    python benchmarks/reward_speed.py --workers 1 2 [--math 4096] [--code 512]

Math samples: a mix of correct/wrong/equivalent-form answers (fractions, decimals, intervals, sets).
Code samples: the bundled code problems' reference solutions (plus a wrong program every 4th sample).
`--workers N` sets rewards.num_workers (pool processes and concurrent sandboxes of one RewardWorker).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time

import numpy as np

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


def code_batch(n):
    rows = [json.loads(x) for x in (BUNDLED_DIR / "code.jsonl").read_text().splitlines() if x.strip()]
    out = []
    for i in range(n):
        r = rows[i % len(rows)]
        program = "print('wrong')" if i % 4 == 3 else r["solution"]
        out.append(traj(i, "code", f"<think>plan</think>```python\n{program}\n```", {"tests": r["tests"]}))
    return out


def bench(kind, n, workers):
    domains = {"math": [{"name": "math"}], "code": [{"name": "code"}]}
    cfg = {"num_workers": workers, "code": {"wall_s": 10, "cpu_s": 5}}
    t0 = time.perf_counter()
    composer = RewardComposer({kind: domains[kind]}, cfg, 1024)
    start_s = time.perf_counter() - t0
    batch = math_batch(n) if kind == "math" else code_batch(n)
    t0 = time.perf_counter()
    composer.score(batch)
    elapsed = time.perf_counter() - t0
    composer.close()
    errors = sum(t.reward_error is not None for t in batch)
    mean = sum(t.reward for t in batch) / n
    return n / elapsed, elapsed, start_s, mean, errors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--math", type=int, default=4096)
    ap.add_argument("--code", type=int, default=512)
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    print(f"cpus={os.cpu_count()} uid={os.geteuid()}")
    print(f"{'reward':6} {'samples':>7} {'workers':>7} {'samples/s':>10} {'score s':>8} {'start s':>8} "
          f"{'mean':>6} {'errors':>6}")
    for kind, n in (("math", args.math), ("code", args.code)):
        for w in args.workers:
            rate, elapsed, start_s, mean, errors = bench(kind, n, w)
            print(f"{kind:6} {n:7d} {w:7d} {rate:10.1f} {elapsed:8.2f} {start_s:8.2f} {mean:6.3f} {errors:6d}",
                  flush=True)


if __name__ == "__main__":
    main()
