"""GPU weight sync trainer -> vLLM rollout workers with vLLM 0.26's native weight-transfer API.

Two placements (`rollout.placement`):
- colocated: trainer rank i and rollout worker i share GPU i (fractional Ray `num_gpus` in one placement-group
  bundle, vLLM started first). Weights go by CUDA IPC (`IPCWeightTransferEngine.trainer_send_weights`, called by
  every rank: each exports handles of its own parameter memory, they are all-gathered, rank 0 sends them to every
  worker and each worker copies from the handle of its own GPU). vLLM sleeps while the trainer trains
  (`sleep(level)` after each rollout; `wake_up(["weights"])`, sync, `wake_up(["kv_cache"])`).
- split: rollout workers own their GPUs; trainer rank 0 broadcasts over an NCCL group it shares with every vLLM
  worker (`NCCLWeightTransferEngine`, packed buffers). NCCL between two processes on one GPU does not work, so
  colocated always uses IPC.

Per sync, driven by `VLLMWeightSync.sync` (driver side): every worker `begin_weight_update` (wake weights +
`start_weight_update`), every trainer rank `send_weights` (ZeRO-3: all ranks gather the parameters bucket by bucket,
a collective; ZeRO-0/1/2: parameters are whole on each rank and gathering is skipped), every worker
`end_weight_update` (`finish_weight_update`, wake the KV cache, `reset_prefix_cache`).

Names: the trainer's parameters are renamed to the checkpoint layout vLLM loads (`to_checkpoint_format`):
transformers 5 fuses MoE experts into 3-D `experts.gate_up_proj` / `experts.down_proj`, checkpoints (and vLLM's
loaders) keep one `experts.<e>.{gate,up,down}_proj.weight` per expert. The per-expert pieces are views (no copy).
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
from collections.abc import Iterator

import torch

log = logging.getLogger(__name__)

# model_type -> (gate, up, down) names of one expert's projections in the checkpoint layout
_EXPERT_NAMES = {"mixtral": ("w1", "w3", "w2")}
_DEFAULT_EXPERT_NAMES = ("gate_proj", "up_proj", "down_proj")


def to_checkpoint_format(name: str, tensor: torch.Tensor, model_type: str) -> list[tuple[str, torch.Tensor]]:
    """One trainer parameter -> the (name, tensor) pairs of the HF checkpoint layout (views, no copies)."""
    if model_type == "mixtral":
        name = name.replace(".mlp.", ".block_sparse_moe.")
    gate, up, down = _EXPERT_NAMES.get(model_type, _DEFAULT_EXPERT_NAMES)
    if name.endswith(".experts.gate_up_proj") and tensor.dim() == 3:
        base, half = name[: -len("gate_up_proj")], tensor.shape[1] // 2
        out = []
        for e in range(tensor.shape[0]):
            out.append((f"{base}{e}.{gate}.weight", tensor[e, :half]))
            out.append((f"{base}{e}.{up}.weight", tensor[e, half:]))
        return out
    if name.endswith(".experts.down_proj") and tensor.dim() == 3:
        base = name[: -len("down_proj")]
        return [(f"{base}{e}.{down}.weight", tensor[e]) for e in range(tensor.shape[0])]
    return [(name, tensor)]


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


def local_address() -> tuple[str, int]:
    """(this node's IP, a free port) for the NCCL weight-transfer rendezvous."""
    try:
        import ray

        ip = ray.util.get_node_ip_address()
    except Exception:
        ip = "127.0.0.1"
    with socket.socket() as s:
        s.bind(("", 0))
        return ip, s.getsockname()[1]


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
        self.group = None

    def init_nccl(self, master_address: str, master_port: int, world_size: int) -> None:
        """Rank 0 joins the NCCL group of the vLLM workers (call together with their init_weight_transfer_engine)."""
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        self.group = NCCLWeightTransferEngine.trainer_init(
            dict(master_address=master_address, master_port=int(master_port), world_size=int(world_size))
        )

    def send(self, module: torch.nn.Module, workers: list) -> dict:
        """Send every parameter to `workers` (Ray handles of RolloutWorker). Call on every rank under ZeRO-3."""
        t0 = time.perf_counter()
        sending = bool(workers) and (self.backend == "ipc" or self.rank == 0)
        if not sending and self.zero_stage != 3:
            return {"seconds": 0.0, "bytes": 0, "tensors": 0}
        nbytes = ntensors = 0
        for items in iter_weight_buckets(module, self.zero_stage, self.bucket_bytes, self.dtype):
            if not sending:
                continue  # still take part in the ZeRO-3 gathers
            torch.cuda.synchronize()  # the optimizer step must have landed before another process reads
            if self.backend == "ipc":
                self._send_ipc(items, workers)
            else:
                self._send_nccl(items, workers)
            nbytes += sum(t.numel() * t.element_size() for _, t in items)
            ntensors += len(items)
        return {"seconds": time.perf_counter() - t0, "bytes": nbytes, "tensors": ntensors}

    def _send_ipc(self, items, workers) -> None:
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerSendWeightsArgs, IPCWeightTransferEngine

        # A collective over the trainer ranks: each exports handles of its own GPU's copy, vLLM all-gathers them
        # and rank 0 sends every GPU's handles to every worker; a worker opens the one of its own GPU (the
        # colocated placement put worker i on trainer rank i's GPU).
        args = _make_args(IPCTrainerSendWeightsArgs,
                          **{"send_mode|mode": "ray", "llm_handle": list(workers), "packed": self.packed})
        IPCWeightTransferEngine.trainer_send_weights(iter(items), args)

    def _send_nccl(self, items, workers) -> None:
        import ray
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerSendWeightsArgs, NCCLWeightTransferEngine

        if self.group is None:
            raise RuntimeError("NCCL weight sync was not initialised (init_weight_sync('nccl', ...))")
        info = dict(
            names=[n for n, _ in items],
            dtype_names=[str(t.dtype).split(".")[-1] for _, t in items],
            shapes=[list(t.shape) for _, t in items],
            packed=self.packed,
        )
        refs = [w.update_weights.remote(dict(update_info=info)) for w in workers]  # receivers block in broadcast
        args = _make_args(NCCLTrainerSendWeightsArgs, group=self.group, packed=self.packed)
        NCCLWeightTransferEngine.trainer_send_weights(iter(items), args)
        ray.get(refs)


class VLLMWeightSync:
    """Driver side: sets up the transfer and runs one sync across all workers and trainer ranks."""

    def __init__(self, cfg: dict, workers: list, trainers: list):
        r = cfg["rollout"]
        self.workers, self.trainers = workers, list(trainers)  # workers: the pool's live list (restarts replace entries)
        self.placement = str(r.get("placement", "colocated"))
        if self.placement not in ("colocated", "split"):
            raise ValueError(f"rollout.placement must be colocated or split, got {self.placement!r}")
        self.backend = "ipc" if self.placement == "colocated" else "nccl"
        self.tp = int(r.get("tensor_parallel_size", 1))
        self.sleep_level = int(r.get("sleep_level", 2)) if (self.placement == "colocated" and r.get("enable_sleep_mode")) else 0
        if self.placement == "colocated" and (len(self.workers) != len(self.trainers) or self.tp != 1):
            raise ValueError("rollout.placement=colocated needs one rollout worker per trainer rank and "
                             "tensor_parallel_size 1 (rl.config checks this at start)")

    def init(self) -> None:
        import ray

        if self.backend == "nccl":
            addr, port = ray.get(self.trainers[0].weight_sync_address.remote())
            world = 1 + len(self.workers) * self.tp
            refs = [
                w.init_weight_transfer_engine.remote(
                    dict(init_info=dict(master_address=addr, master_port=port, rank_offset=1 + i * self.tp, world_size=world))
                )
                for i, w in enumerate(self.workers)
            ]
            refs += [t.init_weight_sync.remote("nccl", addr, port, world) for t in self.trainers]
        else:
            refs = [w.init_weight_transfer_engine.remote(dict(init_info=dict())) for w in self.workers]
            refs += [t.init_weight_sync.remote("ipc") for t in self.trainers]
        ray.get(refs)

    def reattach(self, worker) -> None:
        """A restarted worker (already loaded through the CPU path) joins the transfer again."""
        import ray

        if self.backend == "ipc":
            ray.get(worker.init_weight_transfer_engine.remote(dict(init_info=dict())))
        else:
            raise RuntimeError(
                "a split-placement vLLM worker restarted: the NCCL weight-transfer group cannot be rejoined; "
                "restart the run with trainer.resume=auto"
            )

    def after_generate(self) -> None:
        """Colocated with sleep mode: free vLLM's GPU memory (weights and KV cache) for training."""
        import ray

        if self.sleep_level:
            ray.get([w.sleep.remote(self.sleep_level) for w in self.workers])

    def sync(self) -> dict:
        import ray

        t0 = time.perf_counter()
        ray.get([w.begin_weight_update.remote() for w in self.workers])
        if self.backend == "ipc":
            targets = [list(self.workers) for _ in self.trainers]  # every rank takes part (see WeightSender)
        else:
            targets = [self.workers] + [[] for _ in self.trainers[1:]]
        stats = ray.get([t.send_weights.remote(targets[i]) for i, t in enumerate(self.trainers)])
        ray.get([w.end_weight_update.remote() for w in self.workers])
        return {"seconds": time.perf_counter() - t0, "send_seconds": max(s["seconds"] for s in stats),
                "bytes": sum(s["bytes"] for s in stats), "tensors": sum(s["tensors"] for s in stats)}
