"""The reward phase's tail: a Ray `RewardWorker` fed the way a rollout worker feeds it during generation.

Per step, 256 real answers (`--responses`, as benchmarks/reward_speed.py writes them: SmolLM2-135M-Instruct on the
bundled arithmetic) in 32 groups of 8. The shortest `--early` share of them end "during generation": they go to
`prescore` in batches of 8, one batch every `--gap-ms` (a rollout of ~1.2 s at the defaults), without waiting, as
`rollout/worker.py` sends them. The rest (the longest answers: on the real run, the ones that reach the token
limit at the last decode step) arrive only with the share's `score` call, made right after the last batch. Printed
per step: the seconds from that `score` call to the scored share back, which is what `time/reward` measures in a
run (grpo_step.py's smol benchmark: 153-225 of 256 samples scored during generation, a reward phase of 0.3-0.45 s on
an H100 node, whose pool alone scores the 256 answers in 0.09 s).

    python benchmarks/reward_tail.py --responses /tmp/smol.json [--workers 2] [--steps 6] [--early 0.75]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def share(rows: list[dict], step: int, groups: int = 32, n: int = 8):
    from rl.trajectory import Trajectory

    out = []
    for k in range(groups * n):
        r = rows[(step * 37 + k) % len(rows)]
        ids = np.frombuffer(r["response"].encode(), np.uint8).astype(np.int32)  # distinct responses, distinct ids
        out.append(Trajectory(uid=f"s{step}-{k}", group_id=f"s{step}-p{k // n}", domain="math", prompt_ids=[1],
                              response_ids=ids, inference_logprobs=np.zeros(len(ids), np.float32),
                              response_text=r["response"], sample={"answer": r["answer"]}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--responses", required=True)
    ap.add_argument("--workers", type=int, default=2, help="rewards.num_workers (pool processes)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--early", type=float, default=0.75, help="share of the samples sent before the end")
    ap.add_argument("--gap-ms", type=float, default=40.0, help="between two early batches")
    args = ap.parse_args()
    import ray

    from rewards.worker import RewardWorker

    rows = json.loads(Path(args.responses).read_text())
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    cfg = {"domains": {"math": {"rewards": [{"name": "math", "weight": 1.0}]}},
           "rewards": {"num_workers": args.workers}, "rollout": {"max_new_tokens": 192}}
    worker = ray.remote(RewardWorker).remote(cfg)
    assert ray.get(worker.ready.remote())
    tails = []
    for step in range(args.steps):
        trajs = share(rows, step)
        by_length = sorted(trajs, key=lambda t: len(t.response_text))
        early = by_length[: int(args.early * len(trajs))]
        for i in range(0, len(early), 8):
            worker.prescore.remote(early[i : i + 8])  # not awaited, as the rollout worker sends them
            time.sleep(args.gap_ms / 1e3)
        t0 = time.perf_counter()
        scored = ray.get(worker.score.remote(trajs))
        tails.append(time.perf_counter() - t0)
        stats = ray.get(worker.early_stats.remote())
        print(f"step {step}: reward phase {tails[-1]:.3f} s ({len(early)} sent early, {len(trajs) - len(early)} with "
              f"the share; mean reward {np.mean([t.reward for t in scored]):.3f}; early results used so far "
              f"{stats['used']} of {stats['scored']})", flush=True)
    print(f"median of steps 2+: {statistics.median(tails[1:]):.3f} s")
    ray.get(worker.close.remote())
    ray.shutdown()


if __name__ == "__main__":
    main()
