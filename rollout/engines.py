"""The rollout engines behind one interface, and how the config picks and builds one.

`rollout.engine`: hf (the transformers engine, `rollout/hf_engine.py`: CPU default, any device) | vllm
(`rollout/vllm_engine.py`, GPU) | auto (vLLM when CUDA and vllm are importable, else hf). Both take token ids and
`rollout.sampling.SamplingParams` and return `rollout.sampling.Generation`s; the rollout workers and the rubric
judge's model both build theirs here.
"""

from __future__ import annotations

import torch

from rl.attention import generation_attention
from rl.config import rollout_placement
from rollout.sampling import SamplingParams


def sampling_params(rcfg: dict, seed: int, record_kept_set: bool = True) -> SamplingParams:
    """The rollout's sampling settings (`rollout.*`) for one call; `record_kept_set` = Keep Sampling Mask."""
    return SamplingParams(
        n=int(rcfg["n_samples"]),
        temperature=float(rcfg["temperature"]),
        top_p=float(rcfg["top_p"]),
        top_k=int(rcfg["top_k"]),
        max_new_tokens=int(rcfg["max_new_tokens"]),
        stop_token_ids=list(rcfg.get("stop_token_ids") or []),
        seed=seed,
        record_kept_set=record_kept_set,
    )


def resolve_engine(rcfg: dict) -> str:
    """`rollout.engine`: hf | vllm | auto (vLLM when CUDA and vllm are importable, else hf)."""
    engine = rcfg["engine"]
    if engine == "auto":
        from rollout.vllm_engine import vllm_available

        return "vllm" if vllm_available() else "hf"
    return engine


def make_engine(rcfg: dict, model_cfg: dict, model_path: str, record_routes: bool, seed: int = 0):
    """An engine for `model_path` from the rollout (`rcfg`) and model (`model_cfg`) config sections."""
    engine = resolve_engine(rcfg)
    if engine == "vllm":
        from rollout.vllm_engine import VLLMEngine, default_num_logprobs

        k = rcfg.get("logprobs")
        return VLLMEngine(
            model_path,
            dtype=model_cfg["dtype"],
            tensor_parallel_size=int(rcfg.get("tensor_parallel_size", 1)),
            gpu_memory_utilization=float(rcfg.get("gpu_memory_utilization", 0.4)),
            enable_sleep_mode=bool(rcfg.get("enable_sleep_mode", False)),
            max_logprobs=int(k) if k else default_num_logprobs(int(rcfg["top_k"])),
            record_routes=record_routes,
            weight_transfer_backend="ipc" if rollout_placement(rcfg) == "colocated" else "nccl",
            max_model_len=rcfg.get("max_model_len"),
            enforce_eager=bool(rcfg.get("enforce_eager", False)),
            seed=seed,
            per_request_seed=bool(rcfg.get("per_request_seed", False)),
            capture=str(rcfg.get("capture", "sampler")),
            extra_args=dict(rcfg.get("engine_args") or {}),
            kept_set_buffer_mb=float(rcfg.get("kept_set_buffer_mb") or 256),
            fp32_lm_head=bool(model_cfg.get("fp32_lm_head", False)),
        )
    if engine == "hf":
        from rollout.hf_engine import HFEngine

        device = rcfg["device"]
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        return HFEngine(
            model_path,
            dtype=model_cfg["dtype"],
            device=device,
            attn_implementation=generation_attention(model_cfg.get("attn_implementation")),
            record_routes=record_routes,
            max_batch_size=int(rcfg["max_batch_size"]),
        )
    raise ValueError(f"rollout.engine={engine!r}: unknown engine (available: hf, vllm, auto)")
