"""Bytes per step that the reward workers, the driver and the trainer receive, with the per-token arrays shipped
inside the samples (`rollout.payload_by_reference=false`) and by reference (`true`, the default; issue 36).

The real hops of a step, in a local Ray instance on the CPU: `RolloutWorker` actors generate a step's prompts with the
transformers engine, each share goes straight to a `RewardWorker` (`launch.cluster.RolloutInFlight`, as in training),
the driver collects the scored samples, and a task standing in for one trainer rank receives all of them from the
driver and fetches their arrays (`trainer.payload.fetch_heavy`, as `PolicyTrainer.train_step` does). Each received
value is measured with Ray's own serializer (pickle with out-of-band buffers: an object reference costs its id):
- reward workers: the shares the rollout workers returned (the small early batches of `RewardWorker.prescore`
  carry no arrays either way and are left out);
- driver: the scored samples it collects from the reward workers;
- trainer: the samples the driver sends it, plus the arrays it fetches from the object store.

    python benchmarks/payload_bytes.py                       # tiny MoE (embedded): kept sets and routes
    python benchmarks/payload_bytes.py --model smollm2       # SmolLM2-135M-Instruct: real kept sets, no routes
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ray  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from launch.cluster import ActorPool, RolloutInFlight  # noqa: E402
from rewards.worker import RewardWorker  # noqa: E402
from rl.config import resolve_auto  # noqa: E402
from rl.data import PromptMixture  # noqa: E402
from rl.models import SMOLLM2, load_tokenizer, resolve_model_path  # noqa: E402
from rollout.worker import RolloutWorker  # noqa: E402
from trainer.payload import fetch_heavy  # noqa: E402


def serialized_bytes(value) -> int:
    return ray._private.worker.global_worker.get_serialization_context().serialize(value).total_bytes


@ray.remote(num_cpus=0)
def trainer_rank(trajs: list) -> dict:
    """What one trainer rank gets: the driver's samples (measured by the caller), then their arrays."""
    fetched = fetch_heavy(trajs)
    return {"fetched_bytes": fetched["bytes"], "fetch_s": fetched["seconds"]}


def config(args, by_reference: bool, is_moe: bool) -> dict:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose(config_name="train", overrides=[
            "+experiment=smoke_learn", f"rollout.top_p={args.top_p}", f"rollout.n_samples={args.n}",
            f"rollout.max_new_tokens={args.max_new_tokens}", f"rollout.payload_by_reference={str(by_reference).lower()}",
        ]), resolve=True)
    resolve_auto(cfg, is_moe=is_moe)
    return cfg


def run(args, model_path: str, by_reference: bool, is_moe: bool) -> dict:
    cfg = config(args, by_reference, is_moe)
    rollout_cls, reward_cls = ray.remote(num_cpus=0.5)(RolloutWorker), ray.remote(num_cpus=0.25)(RewardWorker)
    rollout = ActorPool("rollout", lambda i, after: rollout_cls.remote(cfg, model_path, i), args.workers)
    rewards = ActorPool("reward", lambda i, after: reward_cls.remote(cfg), 1)
    rollout.wait_ready()
    rewards.wait_ready()
    mixture = PromptMixture(cfg["domains"], load_tokenizer(model_path), seed=1, max_prompt_tokens=512)
    rows = []
    for step in range(1, args.steps + 1):
        reqs = mixture.next_batch(args.prompts)
        for i, r in enumerate(reqs):
            r["group_id"] = f"s{step}-p{i}"
        t0 = time.perf_counter()
        inflight = RolloutInFlight(rollout, rewards, reqs, step, None)
        scored = inflight.scoring().collect()
        collect_s = time.perf_counter() - t0
        to_rewards = sum(serialized_bytes(ray.get(ref)) for ref in inflight.generate.refs if ref is not None)
        to_driver = serialized_bytes(scored)
        to_trainer = serialized_bytes(scored)  # the driver sends the trainer what it holds
        t0 = time.perf_counter()
        rank = ray.get(trainer_rank.remote(scored))
        rows.append({"samples": len(scored), "tokens": sum(t.num_generated_tokens for t in scored),
                     "rewards": to_rewards, "driver": to_driver, "trainer": to_trainer + rank["fetched_bytes"],
                     "fetched": rank["fetched_bytes"], "fetch_s": rank["fetch_s"],
                     "train_call_s": time.perf_counter() - t0, "collect_s": collect_s})
    for a in rollout.actors + rewards.actors:
        ray.kill(a)
    return {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-moe", help="tiny-moe | tiny-dense | smollm2 | an HF dir")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step")
    ap.add_argument("--n", type=int, default=8, help="samples per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--workers", type=int, default=2, help="rollout workers")
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    path = {"tiny-moe": "embedded:tiny-moe", "tiny-dense": "embedded:tiny-dense", "smollm2": SMOLLM2}.get(args.model,
                                                                                                          args.model)
    model_path = resolve_model_path(path)
    from transformers import AutoConfig

    is_moe = bool(getattr(AutoConfig.from_pretrained(model_path), "num_experts", 0))
    ray.init(num_cpus=max(os.cpu_count() or 2, 2), include_dashboard=False, log_to_driver=False)
    results = {ref: run(args, model_path, ref, is_moe) for ref in (False, True)}
    mb = lambda b: f"{b / 1e6:9.3f}"  # noqa: E731
    print(f"\nmodel {args.model}: {args.prompts} prompts x {args.n} samples, <= {args.max_new_tokens} new tokens, "
          f"top_p {args.top_p}, {args.workers} rollout workers, mean of {args.steps} steps "
          f"({results[True]['samples']:.0f} samples, {results[True]['tokens']:.0f} generated tokens a step)")
    print("| arrays travel | reward workers receive MB | driver receives MB | trainer receives MB (of it fetched) "
          "| trainer's fetch s |")
    print("|---|---|---|---|---|")
    for ref, r in results.items():
        print(f"| {'by reference' if ref else 'with the samples'} | {mb(r['rewards'])} | {mb(r['driver'])} | "
              f"{mb(r['trainer'])} ({mb(r['fetched']).strip()}) | {r['fetch_s']:.3f} |")
    before, after = results[False], results[True]
    print(f"driver: {before['driver'] / after['driver']:.1f}x fewer bytes; reward workers: "
          f"{before['rewards'] / after['rewards']:.1f}x fewer")
    ray.shutdown()


if __name__ == "__main__":
    main()
