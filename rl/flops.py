"""Model FLOPs of the transformer body, from the model's config alone, for `perf/mfu`.

"Body" = the decoder layers: attention projections, attention scores, the MLP or the routed experts a token
actually visits. The embedding lookup, the LM head and norms are left out (the LM head's cost depends on how the
trainer computes log-probs, not on the model; norms and RoPE are memory-bound). This is the convention of the
PaLM paper's MFU (appendix B) with the attention term made causal:

    forward FLOPs of a sequence of T tokens = 2 * P_active * T + A * T (T + 1) / 2

where P_active is the number of weights one token multiplies through (for an MoE layer: the router, the top-k
routed experts and the shared experts, not all experts) and A = 2 * L * H * (d_qk + d_v) is the cost of one
(query, key) pair over all layers (QK^T and the weighted sum of V, 2 FLOPs per multiply-add). Training costs
3x the forward (backward = 2x); activation recomputation is not counted (MFU counts model FLOPs, not hardware
FLOPs). Attention is counted dense causal for every model (sliding windows and DeepSeek-V3.2's sparse attention
with its indexer are not modelled: an upper bound for those).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from rl.routing import UnsupportedMoEError, moe_layer_indices

log = logging.getLogger(__name__)

# Dense bf16 tensor-core peaks (TFLOP/s, no sparsity) by a substring of torch.cuda.get_device_name(); the first
# match wins, so the more specific names come first.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H200", 989.0), ("H800", 989.0), ("H20", 148.0),
    ("GH200", 989.0), ("B200", 2250.0), ("B100", 1750.0), ("A100", 312.0), ("A800", 312.0), ("L40S", 362.0),
)


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU from its name, None when it is not in the table (set trainer.peak_tflops)."""
    for key, tflops in PEAK_BF16_TFLOPS:
        if key in device_name:
            return tflops
    return None


def config_get(config, *names, default=None):
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


@dataclass(frozen=True)
class BodyFlops:
    linear_per_token: float  # 2 * P_active: FLOPs of the weight multiplies of one token through every layer
    attn_per_pair: float  # A: FLOPs of one (query, key) pair over every layer

    def forward(self, seq_len: int) -> float:
        """Forward FLOPs of one causal sequence of `seq_len` tokens."""
        return self.linear_per_token * seq_len + self.attn_per_pair * seq_len * (seq_len + 1) / 2

    def train(self, seq_len: int) -> float:
        """Forward + backward FLOPs of one sequence (backward = 2x forward)."""
        return 3.0 * self.forward(seq_len)


def body_flops(config) -> BodyFlops:
    """FLOPs coefficients of a decoder-only model's body from its HF config (Llama/Qwen-style GQA attention or
    DeepSeek MLA; gated MLPs; Qwen-MoE, OLMoE, Mixtral and DeepSeek MoE layers). Raises ValueError when the config
    lacks what the count needs."""
    d, layers = config_get(config, "hidden_size"), config_get(config, "num_hidden_layers")
    heads = config_get(config, "num_attention_heads")
    if not (d and layers and heads):
        raise ValueError("the model config has no hidden_size / num_hidden_layers / num_attention_heads")
    if config_get(config, "kv_lora_rank"):  # DeepSeek multi-head latent attention
        nope, rope, d_v = config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim
        d_qk, q_rank, kv_rank = nope + rope, config_get(config, "q_lora_rank"), config.kv_lora_rank
        q = d * q_rank + q_rank * heads * d_qk if q_rank else d * heads * d_qk
        attn = q + d * (kv_rank + rope) + kv_rank * heads * (nope + d_v) + heads * d_v * d
    else:
        head_dim = config_get(config, "head_dim", default=d // heads)
        kv_heads = config_get(config, "num_key_value_heads", default=heads)
        d_qk = d_v = head_dim
        attn = d * head_dim * (heads + 2 * kv_heads) + heads * head_dim * d
    try:
        moe_layers = set(moe_layer_indices(config) or ())
    except UnsupportedMoEError as e:
        raise ValueError(str(e)) from e
    dense_mlp = 3 * d * config.intermediate_size
    moe_mlp = 0
    if moe_layers:
        experts = config_get(config, "num_experts", "num_local_experts", "n_routed_experts")
        expert_ff = config_get(config, "moe_intermediate_size", "intermediate_size")
        moe_mlp = d * experts + config.num_experts_per_tok * 3 * d * expert_ff
        moe_mlp += 3 * d * expert_ff * (config_get(config, "n_shared_experts", default=0) or 0)  # DeepSeek
        shared_ff = config_get(config, "shared_expert_intermediate_size", default=0) or 0  # Qwen2-MoE: one gated expert
        moe_mlp += (3 * d * shared_ff + d) if shared_ff else 0
    mlp = sum(moe_mlp if i in moe_layers else dense_mlp for i in range(layers))
    return BodyFlops(linear_per_token=2.0 * (layers * attn + mlp), attn_per_pair=2.0 * layers * heads * (d_qk + d_v))


def load_body_flops(model_path: str) -> BodyFlops | None:
    """`body_flops` of a model directory's config; None (with a warning: perf/mfu is then not logged) when the
    config cannot be counted."""
    from transformers import AutoConfig

    try:
        return body_flops(AutoConfig.from_pretrained(model_path))
    except ValueError as e:
        log.warning("perf/mfu is not logged: the model's FLOPs cannot be counted (%s)", e)
        return None


def resolve_peak_tflops(setting, device_name: str) -> float | None:
    """trainer.peak_tflops: a number is used as it is; "auto" looks the trainer's GPU up (None on CPU or for a GPU
    not in PEAK_BF16_TFLOPS, with a warning for the latter); null turns perf/mfu off."""
    if setting is None:
        return None
    if setting != "auto":
        return float(setting)
    if device_name == "cpu":
        return None
    peak = peak_tflops(device_name)
    if peak is None:
        log.warning("perf/mfu is not logged: no bf16 peak known for %r; set trainer.peak_tflops to its dense bf16 "
                    "TFLOP/s", device_name)
    return peak


@dataclass(frozen=True)
class PerfMeter:
    """Per-step throughput and MFU of the train and reference phases from the step's trajectories and timings.

    Every trained token is counted (prompt + response: the trainer runs the whole sequence); padding is not."""

    body: BodyFlops | None
    peak_tflops: float | None  # per GPU; None: no perf/mfu
    train_gpus: int  # trainer ranks (one GPU each on CUDA; "per GPU" means per rank on CPU)
    recompute_old: bool  # algorithm.old_logprobs=trainer: one more forward of every sequence before the update

    def metrics(self, trajs: list, ref_trajs: list, times: dict[str, float]) -> dict[str, float]:
        lengths = [t.num_tokens for t in trajs]
        ref_lengths = [t.num_tokens for t in ref_trajs]
        train_s, ref_s = max(times["time/train"], 1e-9), times.get("time/ref", 0.0)
        m = {"throughput/train_tokens_per_s": sum(lengths) / train_s}
        if ref_trajs and ref_s > 0:
            m["throughput/ref_tokens_per_s"] = sum(ref_lengths) / ref_s
        if self.body is None:
            return m
        passes = 4.0 if self.recompute_old else 3.0  # forward + backward (2x), + the pi_old forward
        train_tflops = passes * sum(self.body.forward(n) for n in lengths) / train_s / self.train_gpus / 1e12
        m["perf/train_tflops_per_gpu"] = train_tflops
        if ref_trajs and ref_s > 0:
            m["perf/ref_tflops"] = sum(self.body.forward(n) for n in ref_lengths) / ref_s / 1e12
        if self.peak_tflops:
            m["perf/mfu"] = train_tflops / self.peak_tflops
        return m
