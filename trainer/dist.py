"""Process-group and device setup shared by the trainer's actors, the address helpers of its rendezvous, and the
GPU-memory helpers both actors size their micro-batches with."""

from __future__ import annotations

import importlib
import os
import socket

import torch

from rl.batching import micro_batch_count
from rl.memory import head_logit_bytes, max_tokens_within
from rl.models import torch_dtype


def pick_device(name: str) -> str:
    """`trainer.device`: auto (cuda when available) | cpu | cuda."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def wait_for(after) -> None:
    """Return once every Ray call in `after` has returned. An actor that takes GPU memory waits so in its constructor
    for the actors that must measure the GPU's free memory before it (colocated vLLM instances, a vLLM judge), after
    its imports and host-side loading, which so overlap theirs. The calls come inside a list: Ray would otherwise
    wait for them before starting the actor at all."""
    if after:
        import ray

        ray.get(list(after))


def free_port(host: str = "") -> int:
    """A TCP port that was free a moment ago on this machine (for a rendezvous about to be opened)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def node_address() -> str:
    """This node's IP as Ray knows it (what other nodes can reach), else loopback."""
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:
        return "127.0.0.1"


def open_store() -> "torch.distributed.TCPStore":
    """A rendezvous store for the trainer ranks, listening on a port the OS picks as it binds (port 0). A port found
    free beforehand and bound later can be taken in between by another process of the node (Ray starts many).
    Its `port` is where the ranks connect (`init_process_group`); it serves while the object lives."""
    from deepspeed.constants import default_pg_timeout

    return torch.distributed.TCPStore("0.0.0.0", 0, None, True, timeout=default_pg_timeout, wait_for_workers=False)


def init_process_group(rank: int, world_size: int, master_addr: str, master_port: int, device: str) -> None:
    """torch.distributed through the store at `master_addr:master_port` (`open_store`), then DeepSpeed, which finds
    it initialized and keeps it. A process that already has a process group keeps it (tests build several
    trainers in one process)."""
    init_process_group_env(rank, world_size, master_addr, master_port, device)
    backend = "gloo" if device == "cpu" else "nccl"
    if not torch.distributed.is_initialized():
        from deepspeed.constants import default_pg_timeout  # what DeepSpeed's own init uses (DEEPSPEED_TIMEOUT)
        from packaging.version import Version

        store = torch.distributed.TCPStore(master_addr, master_port, None, False, timeout=default_pg_timeout)
        bind = {}
        # As DeepSpeed: several NCCL ranks bind their GPU at init, except on the torch versions where that hangs
        # (2.6.0 < torch < 2.7.1, pytorch#153960)
        if device == "cuda" and world_size > 1 and not Version("2.6.0") < Version(torch.__version__) < Version("2.7.1"):
            bind["device_id"] = torch.device("cuda", 0)
        torch.distributed.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                             timeout=default_pg_timeout, **bind)
    import deepspeed

    deepspeed.init_distributed(dist_backend=backend)


def init_process_group_env(rank: int, world_size: int, master_addr: str, master_port: int, device: str) -> None:
    """DeepSpeed reads these even for one process (otherwise it goes looking for mpi4py)."""
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK="0",  # Ray gives each GPU actor its own CUDA_VISIBLE_DEVICES
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
    )
    if device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        # The shared-memory comm op JIT-compiles for minutes on first use; gloo is enough for us.
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None


def partition_zero3(module: torch.nn.Module, config: dict) -> None:
    """ZeRO-3's partitions of a model loaded whole on the CPU, made one parameter at a time: deepspeed.initialize
    would first move the whole model to this rank's GPU (a 30B model's 61 GB next to the reference and a colocated
    vLLM). `zero.Init` moves the parameters only, and initialize then skips its own move of the module, so the
    buffers (a DeepSeek-V3 router's score-correction bias, rotary tables) follow here."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    deepspeed.zero.Init(module=module, config_dict_or_path=config)
    move_buffers(module, torch.device(get_accelerator().current_device_name()))


def move_buffers(module: torch.nn.Module, device) -> None:
    """Every buffer of `module` and its submodules to `device`, registered as before (persistent or not)."""
    for sub in module.modules():
        for name, buf in sub._buffers.items():
            if buf is not None and buf.device != torch.device(device):
                sub._buffers[name] = buf.to(device)


# trainer.micro_batch_size=auto: the samples per micro-batch on CPU, where there is no GPU memory to fit (on a GPU
# `trainer.micro_batch_memory` says what share of the free memory a micro-batch's activations may take)
AUTO_MICRO_BATCH_CPU = 8


def free_memory_bytes(device) -> int | None:
    """Bytes this process can still allocate on its GPU (free on the device + cached by torch but unused); None on
    CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


def memory_gib(device) -> dict[str, float]:
    """What a step's memory metrics show (GiB; {} on CPU): `gpu_free` this process can still allocate (what
    micro_batch_size=auto sizes from), `gpu_others` what this GPU holds outside this process's torch allocator (a
    colocated vLLM asleep, the reference, CUDA contexts and NCCL buffers), `gpu_peak` the most this process allocated
    since the last `reset_peak_memory_stats`."""
    device = torch.device(device)
    if device.type != "cuda":
        return {}
    free, total = torch.cuda.mem_get_info(device)
    reserved, allocated = torch.cuda.memory_reserved(device), torch.cuda.memory_allocated(device)
    return {"gpu_free": (free + reserved - allocated) / 2**30, "gpu_others": (total - free - reserved) / 2**30,
            "gpu_peak": torch.cuda.max_memory_allocated(device) / 2**30}


# Free memory a colocated vLLM needs beyond its share to wake up: the weight sync's buckets, CUDA's own allocations
WAKE_MARGIN_BYTES = 2 << 30


def release_cached_memory(device, engine_share: float | None = None) -> bool:
    """Hand memory torch's allocator caches back to the GPU when a colocated vLLM (asleep now) would otherwise not
    find room to wake up into: `engine_share` (rl.config.engine_memory_share) of the GPU plus WAKE_MARGIN_BYTES.
    Only what is missing goes back (`hand_back`): each cached segment handed back is a cudaFree, which waits for the
    GPU, and the next step allocates it again with a cudaMalloc (handing the whole cache back cost ~0.13 s of CPU a
    step on the 0.6B benchmark, benchmarks/README.md). engine_share None: the whole cache. Returns whether it
    handed anything back."""
    device = torch.device(device)
    if device.type != "cuda":
        return False
    if engine_share is None:
        torch.cuda.empty_cache()
        return True
    free, total = torch.cuda.mem_get_info(device)
    missing = int(engine_share * total + WAKE_MARGIN_BYTES - free)
    if missing <= 0:
        return False
    hand_back(device, missing)
    return True


def segments_to_keep(free_segments: list[int], missing: int) -> list[int]:
    """Of the cached segments with nothing allocated in them (sizes in bytes), the ones to keep when `missing` bytes
    must go back: the largest go first (the fewest cudaFree/cudaMalloc pairs), the rest stay cached."""
    keep = sorted(free_segments, reverse=True)
    while keep and missing > 0:
        missing -= keep.pop(0)
    return keep


def hand_back(device, missing: int) -> None:
    """Free at least `missing` bytes of torch's cache on `device` (whole free segments), keep the rest cached: the
    segments to keep are held by a tensor each while `empty_cache` frees the others. Only segments of the current
    stream's default pool can be held that way (the allocator serves a tensor from its own stream's blocks); free
    segments of other streams or pools go back and count towards `missing`. Should a holding tensor land elsewhere,
    or the allocator not describe its segments (another allocator backend), too little may go back: then the whole
    cache goes."""
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    sizes, other = [], 0
    try:
        stream = torch.cuda.current_stream(device).cuda_stream
        for seg in torch.cuda.memory_snapshot():
            if seg.get("device") != index or int(seg["allocated_size"]) != 0:
                continue
            if (seg.get("segment_type") == "large" and seg.get("stream") == stream and not seg.get("is_expandable")
                    and not any(seg.get("segment_pool_id") or ())):
                sizes.append(int(seg["total_size"]))
            else:
                other += int(seg["total_size"])
    except (RuntimeError, KeyError, TypeError, ValueError):
        sizes = []  # nothing is held: everything free goes back
    free_before = torch.cuda.mem_get_info(device)[0]
    try:
        holders = [torch.empty(n, dtype=torch.uint8, device=device) for n in segments_to_keep(sizes, missing - other)]
    except torch.OutOfMemoryError:
        holders = []
    torch.cuda.empty_cache()
    del holders
    if torch.cuda.mem_get_info(device)[0] - free_before < missing:
        torch.cuda.empty_cache()


def agreed_counts(counts: list[int], samples: list[int], device) -> list[int]:
    """Micro-batch (or forward) counts every rank runs, one per batch: as many as any rank needs, but no more than the
    smallest share of that batch has samples. A collective over all ranks: ZeRO reduces gradients every micro-step,
    and ZeRO-3 gathers every layer's partitions from all ranks in each forward, so a rank that ran one fewer would
    leave the others waiting."""
    k = len(counts)
    both = torch.tensor(list(counts) + [-n for n in samples], device=device, dtype=torch.long)
    torch.distributed.all_reduce(both, op=torch.distributed.ReduceOp.MAX)
    return [min(int(a), -int(b)) for a, b in zip(both[:k].tolist(), both[k:].tolist())]


def auto_micro_batch_counts(batches: list[list], layout: str, device, model_config, dtype: str,
                            head: dict, memory_share: float, forward_only: bool = False,
                            max_tokens: int | None = None) -> tuple[list[int], int | None]:
    """trainer.micro_batch_size=auto: for each batch the fewest micro-batches (`rl.batching.micro_batch_count`)
    whose activations (rl/memory.py; `forward_only`: of a forward without autograd, the reference's) fit
    `memory_share` (trainer.micro_batch_memory) of the GPU memory free now (a colocated vLLM is asleep);
    AUTO_MICRO_BATCH_CPU samples each on CPU. `max_tokens` (trainer.micro_batch_tokens): a fixed token budget per
    micro-batch instead (packed: its total tokens; padded: rows x the longest), on any device. Also returns the
    token budget the counts were cut by (None on the CPU without one), for `micro_batches(..., max_tokens=)`."""
    if max_tokens:
        return [micro_batch_count(b, int(max_tokens), layout) for b in batches], int(max_tokens)
    free = free_memory_bytes(device)
    if free is None:
        return [-(-len(b) // AUTO_MICRO_BATCH_CPU) for b in batches], None
    dtype_bytes = torch_dtype(dtype).itemsize
    budget = max_tokens_within(model_config, memory_share * free, dtype_bytes, int(head["chunk_size"]),
                               head_logit_bytes(head, dtype_bytes), forward_only)
    return [micro_batch_count(b, budget, layout) for b in batches], budget
