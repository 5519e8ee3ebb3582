"""`algorithm.on_policy=bitwise`: what the engine's and the trainer's processes must agree on for their logprobs of the
same tokens to be identical bit for bit (issue 39).

The mode runs vLLM in its batch-invariant mode (`VLLM_BATCH_INVARIANT=1`: every kernel reduces each row in an order
that does not depend on how many rows the batch has) and a trainer forward that calls the same kernels on the same
inputs (trainer/bitwise.py). Both sides then also need:
- the same FlashAttention tile for every call (`FA3_MIN_QUERY_ROWS`), on a Hopper GPU (`HOPPER`: FA3);
- a model whose every layer has a batch-invariant kernel on both sides (`unsupported_reason`).

This module imports neither vLLM nor the model code, so the config check at start (rl/config.py) can use it.
"""

from __future__ import annotations

BITWISE = "bitwise"
ON_POLICY_MODES = ("default", BITWISE)  # algorithm.on_policy

# Families whose layers the trainer's bitwise forward reproduces: a pre-norm decoder of RMSNorm, rotary attention
# (default rotary, no scaling), SwiGLU MLP, and a tied or untied LM head.
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")

HOPPER = 9  # CUDA compute capability major: FA3 and the kernel choices checked here (an A100 runs FA2)

# vLLM's FA3 runs a call of at most 64 query rows (its longest query times the query heads per KV head) on one MMA
# warpgroup, whose tile at head size 64 sums keys in blocks of 192 instead of the ordinary causal tile's 128. Both
# sides say their longest query has at least this many tokens, so both always take the ordinary tile
# (rollout/bitwise_engine.py); each query is still masked by its own length.
FA3_MIN_QUERY_ROWS = 65


def gpu_unsupported_reason() -> str | None:
    """None on a Hopper GPU; else why not (the trainer's and the engine's check at start)."""
    import torch

    if not torch.cuda.is_available():
        return "it needs a CUDA GPU"
    major, minor = torch.cuda.get_device_capability()
    if major != HOPPER:
        return (f"it was built and checked on Hopper (sm90: FlashAttention-3); this GPU is sm{major}{minor}, where "
                "vLLM runs other attention and matmul kernels")
    return None


def unsupported_reason(config) -> str | None:
    """None when the trainer's bitwise forward reproduces every layer of this model's engine forward; otherwise the
    layer (or setting) that cannot match, in words for the start-up error."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED_MODEL_TYPES:
        return (f"model type {kind!r}: the bitwise forward reproduces {', '.join(SUPPORTED_MODEL_TYPES)} decoders "
                "(RMSNorm, rotary attention, SwiGLU); this one has other layers")
    from rl.routing import looks_moe

    if looks_moe(config):
        return "routed experts (MoE layers): vLLM's fused MoE kernels have no batch-invariant twin in the trainer"
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        return f"MLP activation {act!r}: only SiLU-and-multiply (vLLM's silu_and_mul kernel) is reproduced"
    rope = getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type not in (None, "default"):
        return f"rotary scaling {rope_type!r}: only the default rotary table is reproduced"
    for knob in ("sliding_window", "final_logit_softcapping", "attn_logit_softcapping"):
        if getattr(config, knob, None) and (knob != "sliding_window" or getattr(config, "use_sliding_window", True)):
            return f"{knob}={getattr(config, knob)!r}: not reproduced by the bitwise attention"
    if getattr(config, "mlp_bias", False):
        return "biases in the MLP: not reproduced"
    return None
