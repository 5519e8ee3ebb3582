"""The trainer's side of the GPU weight sync to vLLM rollout workers (vLLM 0.26's native weight-transfer API);
the driver's side, which runs one sync over every worker and rank, is `launch/weight_sync.py`.

Two placements (`rollout.placement`):
- colocated: trainer rank i and its rollout workers (one or more vLLM instances, `rl.config.engines_per_gpu`)
  share GPU i (fractional Ray `num_gpus` in one placement-group bundle, vLLM started first). Weights go by CUDA IPC
  (`IPCWeightTransferEngine.trainer_send_weights`, called by every rank: each exports handles of its own parameter
  memory, they are all-gathered, rank 0 sends them to every worker and each worker copies from the handle of its
  own GPU, found by the GPU's UUID). Instances sharing a GPU are sent to one after another, in waves of one
  instance per GPU (`launch.weight_sync.gpu_waves`), and packed, each export carries one chunk (`export_groups`):
  torch expects one release per export of a CUDA tensor; a handle opened twice (two instances, or two chunks of one
  staging buffer) is released twice, after which torch never frees the sent buffer (vLLM's packed buffer, 1 GiB a
  sync: a run with two instances per GPU ran out of memory at step 49). vLLM sleeps while the trainer trains
  (`sleep(level)` after each rollout; `wake_up(["weights"])`, sync, `wake_up(["kv_cache"])`).
- split: rollout workers own their GPUs; trainer rank 0 broadcasts over an NCCL group it shares with the vLLM
  workers (`NCCLWeightTransferEngine`, packed buffers). A group cannot hold two processes on one GPU (so colocated
  always uses IPC): with several instances per rollout GPU, each wave of one instance per GPU has its own group, and
  rank 0 broadcasts to the waves one after another.

Per sync, driven by `launch.weight_sync.VLLMWeightSync.sync`: every worker `begin_weight_update` (wake weights +
`start_weight_update`), every trainer rank `send_weights` (ZeRO-3: all ranks gather the parameters bucket by bucket,
a collective; ZeRO-0/1/2: parameters are whole on each rank and gathering is skipped), every worker
`end_weight_update` (`finish_weight_update`, wake the KV cache, `reset_prefix_cache`).

Names: the trainer's parameters are renamed to the checkpoint layout vLLM loads (`rl.models.to_checkpoint_format`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator

import torch

from rl.models import to_checkpoint_format

log = logging.getLogger(__name__)


def iter_weight_buckets(
    module: torch.nn.Module, zero_stage: int, bucket_bytes: int, dtype: torch.dtype | None
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Buckets of checkpoint-format (name, tensor) on the parameters' device.

    ZeRO-3: every rank must consume the generator (each bucket is an all-gather); a bucket's tensors are valid
    until the next one is requested. ZeRO-0/1/2: one bucket with every parameter, no communication.
    """
    model_type = getattr(getattr(module, "config", None), "model_type", "")

    def convert(pairs):
        out = []
        for name, t in pairs:
            t = t.detach()
            if dtype is not None and t.dtype != dtype:
                t = t.to(dtype)
            out.extend(to_checkpoint_format(name, t, model_type))
        return out

    params = list(module.named_parameters())
    if zero_stage != 3:
        yield convert(params)
        return
    import deepspeed

    bucket, size = [], 0
    for i, (name, p) in enumerate(params):
        bucket.append((name, p))
        size += int(getattr(p, "ds_numel", p.numel())) * p.element_size()
        if size >= bucket_bytes or i == len(params) - 1:
            with deepspeed.zero.GatheredParameters([q for _, q in bucket], modifier_rank=None):
                yield convert([(n, q.data) for n, q in bucket])
            bucket, size = [], 0


def export_groups(sizes: list[int], cap: int) -> list[tuple[int, int]]:
    """Consecutive [start, end) ranges of tensors (their sizes in bytes) of at most `cap` bytes each; a tensor larger
    than `cap` is a group of its own. One CUDA-IPC export per group (`WeightSender._send_ipc`)."""
    groups, start, total = [], 0, 0
    for i, size in enumerate(sizes):
        if i > start and total + size > cap:
            groups.append((start, i))
            start, total = i, 0
        total += size
    if start < len(sizes):
        groups.append((start, len(sizes)))
    return groups


def _make_args(cls, **candidates):
    """Build a vLLM trainer-args dataclass from the fields this vLLM version has (0.26 names its IPC transport
    field `send_mode`, some versions `mode`)."""
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in candidates.items():
        for alias in key.split("|"):
            if alias in fields:
                kwargs[alias] = value
                break
    return cls(**kwargs)


class WeightSender:
    """Trainer side (one per PolicyTrainer rank)."""

    def __init__(self, backend: str, rank: int, zero_stage: int, dtype: torch.dtype | None, bucket_mb: float, packed: bool = True):
        if backend not in ("ipc", "nccl"):
            raise ValueError(f"weight sync backend must be ipc or nccl, got {backend!r}")
        self.backend, self.rank, self.zero_stage, self.dtype = backend, rank, zero_stage, dtype
        self.bucket_bytes = int(float(bucket_mb) * 2**20)
        self.packed = packed
        self.groups: list = []  # NCCL: one per wave of workers, in the order of the waves

    def init_nccl(self, master_address: str, master_port: int, world_size: int, wave: int = 0) -> None:
        """Rank 0 joins the NCCL group of wave `wave` of vLLM workers (call together with their
        init_weight_transfer_engine; wave 0 starts the set of groups anew)."""
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        del self.groups[wave:]
        self.groups.append(NCCLWeightTransferEngine.trainer_init(
            dict(master_address=master_address, master_port=int(master_port), world_size=int(world_size))
        ))

    def send(self, module: torch.nn.Module, waves: list[list]) -> dict:
        """Send every parameter to each wave of workers in turn (Ray handles of RolloutWorker, at most one worker per
        GPU in a wave, see the module's docstring; NCCL: wave j over group j). Call on every rank under ZeRO-3."""
        t0 = time.perf_counter()
        sending = any(waves) and (self.backend == "ipc" or self.rank == 0)
        if not sending and self.zero_stage != 3:
            return {"seconds": 0.0, "bytes": 0, "tensors": 0}
        if sending and self.backend == "nccl" and len(self.groups) < len(waves):
            raise RuntimeError(f"NCCL weight sync: {len(waves)} waves of workers but {len(self.groups)} groups "
                               "initialised (init_weight_sync('nccl', ...) once per wave)")
        nbytes = ntensors = 0
        for items in iter_weight_buckets(module, self.zero_stage, self.bucket_bytes, self.dtype):
            if not sending:
                continue  # still take part in the ZeRO-3 gathers
            torch.cuda.synchronize()  # the optimizer step must have landed before another process reads
            for j, workers in enumerate(waves):
                if not workers:
                    continue
                if self.backend == "ipc":
                    self._send_ipc(items, workers)
                else:
                    self._send_nccl(items, workers, self.groups[j])
            nbytes += sum(t.numel() * t.element_size() for _, t in items)
            ntensors += len(items)
        return {"seconds": time.perf_counter() - t0, "bytes": nbytes, "tensors": ntensors}

    def _send_ipc(self, items, workers) -> None:
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerSendWeightsArgs, IPCWeightTransferEngine

        # A collective over the trainer ranks: each exports handles of its own GPU's copy, vLLM all-gathers them
        # and rank 0 sends every GPU's handles to every worker; a worker opens the one of its own GPU (the
        # colocated placement put each worker on a trainer rank's GPU).
        if not self.packed:
            args = _make_args(IPCTrainerSendWeightsArgs, **{"send_mode|mode": "ray", "llm_handle": list(workers)})
            IPCWeightTransferEngine.trainer_send_weights(iter(items), args)
            return
        # packed: vLLM stages tensors in one buffer per call, exported once and sent once per chunk that fills it; a
        # worker releases the export once per chunk, so a call of two chunks (0.6B: 1.1 GiB in vLLM's 1 GiB buffer)
        # never freed its buffer either. One call per group of tensors, its buffer the group's exact size: one chunk.
        sizes = [t.numel() * t.element_size() for _, t in items]
        for start, end in export_groups(sizes, self.bucket_bytes):
            args = _make_args(IPCTrainerSendWeightsArgs,
                              **{"send_mode|mode": "ray", "llm_handle": list(workers), "packed": True,
                                 "packed_buffer_size_bytes": max(sum(sizes[start:end]), 1)})
            IPCWeightTransferEngine.trainer_send_weights(iter(items[start:end]), args)

    def _send_nccl(self, items, workers, group) -> None:
        import ray
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerSendWeightsArgs, NCCLWeightTransferEngine

        info = dict(
            names=[n for n, _ in items],
            dtype_names=[str(t.dtype).split(".")[-1] for _, t in items],
            shapes=[list(t.shape) for _, t in items],
            packed=self.packed,
        )
        refs = [w.update_weights.remote(dict(update_info=info)) for w in workers]  # receivers block in broadcast
        args = _make_args(NCCLTrainerSendWeightsArgs, group=group, packed=self.packed)
        NCCLWeightTransferEngine.trainer_send_weights(iter(items), args)
        ray.get(refs)
