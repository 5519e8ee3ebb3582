"""The driver's side of the GPU weight sync to vLLM rollout workers: set the transfer up, run one sync over every
worker and trainer rank, and put colocated vLLM to sleep while the trainer trains. The trainer's side (what is
sent, and how) is `trainer/weight_sync.py`; the worker's side is `RolloutWorker.begin/end_weight_update`.
"""

from __future__ import annotations

import time

import ray

from rl.config import ROLLOUT_DEFAULTS, engines_per_gpu, rollout_placement


class WeightSyncTimeout(RuntimeError):
    """A call of the weight sync (or of putting colocated vLLM to sleep) that did not return within
    `rollout.weight_sync_timeout_s`: the message names each worker or rank still in it and the call."""


def sync_timeout_s(rcfg: dict) -> float | None:
    """`rollout.weight_sync_timeout_s` (null: wait for ever); a config without the key gets the YAML's default."""
    value = rcfg.get("weight_sync_timeout_s", ROLLOUT_DEFAULTS["weight_sync_timeout_s"])
    return None if value is None else float(value)


def wait_all(calls: list[tuple[str, str, ray.ObjectRef]], timeout_s: float | None) -> list:
    """The results of `calls` ((who, method, ref): "rollout worker 1", "begin_weight_update", its ref), in order. One
    that has not returned within `timeout_s` of the wait ends it with `WeightSyncTimeout` naming it (a worker that
    died raises its own error, as `ray.get` does)."""
    refs = [ref for _, _, ref in calls]
    if timeout_s is not None and refs:
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s, fetch_local=False)
        if pending:
            ray.get(ready)  # one that failed (a worker that died) is the likelier cause: its own error first
            late = set(pending)
            stuck = "; ".join(f"{who} did not return from {method}" for who, method, ref in calls if ref in late)
            raise WeightSyncTimeout(
                f"weight sync: {stuck} within {timeout_s:g} s (rollout.weight_sync_timeout_s). It is hung, or waits "
                "on one that is (a trainer rank sends to the rollout workers; look for them in run_dir/train.log), or "
                "the transfer is slower than this (raise the timeout for a very large model). Restart with "
                "trainer.resume=auto to continue from the last checkpoint"
            )
    return ray.get(refs)


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
        self.tp = int(r.get("tensor_parallel_size", ROLLOUT_DEFAULTS["tensor_parallel_size"]))
        sleeps = colocated and r.get("enable_sleep_mode", ROLLOUT_DEFAULTS["enable_sleep_mode"])
        self.sleep_level = int(r.get("sleep_level", ROLLOUT_DEFAULTS["sleep_level"])) if sleeps else 0
        self.engines = engines_per_gpu(cfg)  # vLLM instances per GPU
        self.timeout_s = sync_timeout_s(r)  # each wait below; past it, WeightSyncTimeout names who is stuck where

    def _workers(self, method: str, *args, workers: list | None = None) -> list:
        """`method(*args)` on each rollout worker (default: all), as `wait_all` calls."""
        workers = self.workers if workers is None else workers
        return [(f"rollout worker {self._index(w)}", method, getattr(w, method).remote(*args)) for w in workers]

    def _index(self, worker) -> int:
        return next((i for i, w in enumerate(self.workers) if w is worker), -1)

    def _ranks(self, method: str, args_of) -> list:
        """`method(*args_of(rank))` on each trainer rank, as `wait_all` calls."""
        return [(f"trainer rank {i}", method, getattr(t, method).remote(*args_of(i)))
                for i, t in enumerate(self.trainers)]

    def init(self) -> None:
        if self.backend == "ipc":
            wait_all(self._workers("init_weight_transfer_engine", dict(init_info=dict()))
                     + self._ranks("init_weight_sync", lambda i: ("ipc",)), self.timeout_s)
            return
        # NCCL: one group per wave (trainer rank 0 and one instance per rollout GPU), set up one after another
        for j, wave in enumerate(gpu_waves(self.workers, self.engines)):
            (addr, port), = wait_all([("trainer rank 0", "weight_sync_address",
                                       self.trainers[0].weight_sync_address.remote())], self.timeout_s)
            world = 1 + len(wave) * self.tp
            calls = [(f"rollout worker {self._index(w)}", "init_weight_transfer_engine",
                      w.init_weight_transfer_engine.remote(dict(init_info=dict(
                          master_address=addr, master_port=port, rank_offset=1 + i * self.tp, world_size=world))))
                     for i, w in enumerate(wave)]
            wait_all(calls + self._ranks("init_weight_sync", lambda i: ("nccl", addr, port, world, j)), self.timeout_s)

    def reattach(self, worker) -> None:
        """A restarted worker (already loaded through the CPU path) joins the transfer again."""
        if self.backend == "ipc":
            wait_all(self._workers("init_weight_transfer_engine", dict(init_info=dict()), workers=[worker]),
                     self.timeout_s)
        else:
            raise RuntimeError(
                "a split-placement vLLM worker restarted: the NCCL weight-transfer group cannot be rejoined; "
                "restart the run with trainer.resume=auto"
            )

    def after_generate(self) -> None:
        """Colocated with sleep mode: free vLLM's GPU memory (weights and KV cache) for training."""
        if self.sleep_level:
            wait_all(self._workers("sleep", self.sleep_level), self.timeout_s)

    def sync(self) -> dict:
        """One sync; returns its seconds, its parts' seconds (`time/sync_<part>` in the step's metrics) and what was sent:
        wake = the workers wake their weights and start the update, send = the trainer ranks send (the ranks' own
        share of it: `send_rank`), finish = the workers finish the update, wake the KV cache, reset the prefix cache."""
        t0 = time.perf_counter()
        wait_all(self._workers("begin_weight_update"), self.timeout_s)
        t1 = time.perf_counter()
        waves = gpu_waves(self.workers, self.engines)
        if self.backend == "ipc":  # every rank takes part (see WeightSender), one export per wave
            targets = [waves for _ in self.trainers]
        else:  # rank 0 broadcasts to each wave over its group; the others only join ZeRO-3's gathers
            targets = [waves] + [[] for _ in self.trainers[1:]]
        stats = wait_all(self._ranks("send_weights", lambda i: (targets[i],)), self.timeout_s)
        t2 = time.perf_counter()
        wait_all(self._workers("end_weight_update"), self.timeout_s)
        t3 = time.perf_counter()
        return {"seconds": t3 - t0, "wake": t1 - t0, "send": t2 - t1, "send_rank": max(s["seconds"] for s in stats),
                "finish": t3 - t2, "bytes": sum(s["bytes"] for s in stats), "tensors": sum(s["tensors"] for s in stats)}
