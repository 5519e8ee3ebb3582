"""Process-group and device setup shared by the trainer's actors, and the address helpers of its rendezvous."""

from __future__ import annotations

import importlib
import os
import socket

import torch


def pick_device(name: str) -> str:
    """`trainer.device`: auto (cuda when available) | cpu | cuda."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


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

# trainer.micro_batch_size=auto: the share of the free GPU memory a micro-batch's activations may take (gradient
# checkpointing=auto turns on only past 80%, so auto-sized micro-batches train without recomputation)
AUTO_MICRO_BATCH_MEMORY = 0.6


def free_memory_bytes(device) -> int | None:
    """Bytes this process can still allocate on its GPU (free on the device + cached by torch but unused); None on
    CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


def release_cached_memory(device) -> None:
    """Hand the memory torch's allocator caches back to the GPU: a colocated vLLM wakes up into it after the
    trainer and the reference have run (with trainer.micro_batch_size=auto the cache can hold most of the GPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
