"""Seconds per trainer -> vLLM weight sync of a 0.6B policy (Qwen3-0.6B shape, bf16), end to end through our code:
`VLLMWeightSync.sync()` = RolloutWorker.begin_weight_update (wake weights + start_weight_update) ->
PolicyTrainer.send_weights (ZeRO gather + vLLM IPC/NCCL sender) -> RolloutWorker.end_weight_update
(finish_weight_update + wake KV cache + reset_prefix_cache), all Ray calls included.

    python benchmarks/weight_sync.py [--zero 2 3] [--placement colocated split] [--syncs 5]

colocated: worker and trainer share GPU 0 (0.5 + 0.5), CUDA IPC; "asleep" rows put vLLM to sleep (level 2: the
weights are dropped) before each sync, as in training. split (needs 2 GPUs): worker on its own GPU, NCCL broadcast.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path



def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--zero", nargs="+", type=int, default=[2, 3])
    ap.add_argument("--placement", nargs="+", default=["colocated"])
    ap.add_argument("--syncs", type=int, default=5)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()

    import ray
    import torch

    from launch.placement import GpuPlacement
    from launch.testbed import QWEN3_06B, base_cfg, build_model, chat_prompts
    from launch.weight_sync import VLLMWeightSync
    from rl.models import load_tokenizer
    from rollout.worker import RolloutWorker
    from trainer.policy import PolicyTrainer
    from trainer.dist import open_store

    path = build_model(Path(args.workdir or tempfile.mkdtemp(prefix="wsync-")) / "dense06b", QWEN3_06B)
    gpus = torch.cuda.device_count()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_gpus=gpus, num_cpus=8, include_dashboard=False,
             runtime_env={"env_vars": {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0",
                                                 "DS_ACCELERATOR": "cuda"}})
    tok = load_tokenizer(path)
    requests = [dict(group_id="g0", domain="math", prompt_ids=p, prompt_text="", sample={}) for p in chat_prompts(tok, 2)]
    rows = []
    for placement in args.placement:
        if placement == "split" and gpus < 2:
            print("split placement needs 2 GPUs: skipped", flush=True)
            continue
        share = 0.5 if placement == "colocated" else 1.0
        cfg = base_cfg(path, keep_mask=False, keep_routing=False,
                       rollout=dict(placement=placement, gpu_memory_utilization=0.3, enforce_eager=True,
                                    max_new_tokens=16, n_samples=2, num_gpus=share),
                       trainer=dict(num_gpus=share, micro_batch_size=4))
        pg = GpuPlacement(cfg)  # colocated: worker and trainer in one GPU bundle, as the driver places them
        worker = ray.remote(num_gpus=share, num_cpus=1)(RolloutWorker).options(**pg.options(0)).remote(cfg, path, 0)
        ray.get(worker.ready.remote())
        for zero in args.zero:
            cfg["trainer"]["zero_stage"] = zero
            store = open_store()  # the trainer's rendezvous, alive while it runs
            trainer = ray.remote(num_gpus=share, num_cpus=1)(PolicyTrainer).options(**pg.options(0)).remote(
                cfg, path, 0, 1, "127.0.0.1", store.port)
            ray.get(trainer.ready.remote())
            sync = VLLMWeightSync(cfg, [worker], [trainer])
            t0 = time.perf_counter()
            sync.init()
            init_s = time.perf_counter() - t0
            first = sync.sync()
            awake = [sync.sync() for _ in range(args.syncs)]
            asleep = []
            if sync.sleep_level:
                for _ in range(args.syncs):
                    sync.after_generate()
                    asleep.append(sync.sync())
            trajs = ray.get(worker.generate.remote(requests, 1))  # the engine still works
            assert trajs and all(t.num_response_tokens > 0 for t in trajs)
            row = dict(placement=placement, zero=zero, init_s=round(init_s, 3), first_s=round(first["seconds"], 3),
                       awake_median_s=round(statistics.median(s["seconds"] for s in awake), 4),
                       awake_min_s=round(min(s["seconds"] for s in awake), 4),
                       send_median_s=round(statistics.median(s["send_rank"] for s in awake), 4),
                       asleep_median_s=round(statistics.median(s["seconds"] for s in asleep), 4) if asleep else None,
                       gib=round(first["bytes"] / 2**30, 3), tensors=first["tensors"])
            print("RESULT " + json.dumps(row), flush=True)
            rows.append(row)
            ray.kill(trainer)
            time.sleep(2)
        ray.kill(worker)
        pg.remove()
        time.sleep(3)
    print(f"\nweight sync, 0.6B bf16 policy (Qwen3-0.6B shape), {args.syncs} syncs per row, seconds per sync")
    print("| placement | ZeRO | first | awake median (min) | trainer send median | after sleep(level 2) median | GiB |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['placement']} | {r['zero']} | {r['first_s']} | {r['awake_median_s']} ({r['awake_min_s']}) | "
              f"{r['send_median_s']} | {r['asleep_median_s']} | {r['gib']} |")
    ray.shutdown()


if __name__ == "__main__":
    main()
