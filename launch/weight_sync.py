"""The driver's side of the GPU weight sync to vLLM rollout workers: set the transfer up, run one sync over every
worker and trainer rank, and put colocated vLLM to sleep while the trainer trains. The trainer's side (what is
sent, and how) is `trainer/weight_sync.py`; the worker's side is `RolloutWorker.begin/end_weight_update`.
"""

from __future__ import annotations

import time

import ray

from rl.config import engines_per_gpu, rollout_placement


def gpu_waves(workers: list, engines: int) -> list[list]:
    """The workers in waves of at most one per GPU (worker i runs on GPU i // `engines` of its placement,
    launch/placement.py), each wave sent the weights on its own: CUDA IPC (colocated) frees a sent buffer once each
    export has been released once, so no two processes may open one handle; NCCL (split) cannot have two ranks of a
    group on one GPU, so each wave has its own group (trainer/weight_sync.py)."""
    return [list(workers[w::engines]) for w in range(engines)]


class VLLMWeightSync:
    """Driver side: sets up the transfer and runs one sync across all workers and trainer ranks."""

    def __init__(self, cfg: dict, workers: list, trainers: list):
        r = cfg["rollout"]
        self.workers, self.trainers = workers, list(trainers)  # workers: the pool's live list (restarts replace entries)
        # The placement rules (each rank's GPU holds its workers, or one tensor-parallel rank of an instance; k
        # instances per rollout GPU when split) were checked at start (launch/placement.py).
        colocated = rollout_placement(r) == "colocated"
        self.backend = "ipc" if colocated else "nccl"
        self.tp = int(r.get("tensor_parallel_size", 1))
        self.sleep_level = int(r.get("sleep_level", 2)) if (colocated and r.get("enable_sleep_mode")) else 0
        self.engines = engines_per_gpu(cfg)  # vLLM instances per GPU

    def init(self) -> None:
        if self.backend == "ipc":
            refs = [w.init_weight_transfer_engine.remote(dict(init_info=dict())) for w in self.workers]
            ray.get(refs + [t.init_weight_sync.remote("ipc") for t in self.trainers])
            return
        # NCCL: one group per wave (trainer rank 0 and one instance per rollout GPU), set up one after another
        for j, wave in enumerate(gpu_waves(self.workers, self.engines)):
            addr, port = ray.get(self.trainers[0].weight_sync_address.remote())
            world = 1 + len(wave) * self.tp
            refs = [w.init_weight_transfer_engine.remote(dict(init_info=dict(
                master_address=addr, master_port=port, rank_offset=1 + i * self.tp, world_size=world)))
                for i, w in enumerate(wave)]
            ray.get(refs + [t.init_weight_sync.remote("nccl", addr, port, world, j) for t in self.trainers])

    def reattach(self, worker) -> None:
        """A restarted worker (already loaded through the CPU path) joins the transfer again."""
        if self.backend == "ipc":
            ray.get(worker.init_weight_transfer_engine.remote(dict(init_info=dict())))
        else:
            raise RuntimeError(
                "a split-placement vLLM worker restarted: the NCCL weight-transfer group cannot be rejoined; "
                "restart the run with trainer.resume=auto"
            )

    def after_generate(self) -> None:
        """Colocated with sleep mode: free vLLM's GPU memory (weights and KV cache) for training."""
        if self.sleep_level:
            ray.get([w.sleep.remote(self.sleep_level) for w in self.workers])

    def sync(self) -> dict:
        """One sync; returns its seconds, its parts' seconds (`time/sync_<part>` in the step's metrics) and what was sent:
        wake = the workers wake their weights and start the update, send = the trainer ranks send (the ranks' own
        share of it: `send_rank`), finish = the workers finish the update, wake the KV cache, reset the prefix cache."""
        t0 = time.perf_counter()
        ray.get([w.begin_weight_update.remote() for w in self.workers])
        t1 = time.perf_counter()
        waves = gpu_waves(self.workers, self.engines)
        if self.backend == "ipc":  # every rank takes part (see WeightSender), one export per wave
            targets = [waves for _ in self.trainers]
        else:  # rank 0 broadcasts to each wave over its group; the others only join ZeRO-3's gathers
            targets = [waves] + [[] for _ in self.trainers[1:]]
        stats = ray.get([t.send_weights.remote(targets[i]) for i, t in enumerate(self.trainers)])
        t2 = time.perf_counter()
        ray.get([w.end_weight_update.remote() for w in self.workers])
        t3 = time.perf_counter()
        return {"seconds": t3 - t0, "wake": t1 - t0, "send": t2 - t1, "send_rank": max(s["seconds"] for s in stats),
                "finish": t3 - t2, "bytes": sum(s["bytes"] for s in stats), "tensors": sum(s["tensors"] for s in stats)}
