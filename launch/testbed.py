"""Test beds for the GPU tests and the benchmarks: random-weight models of given shapes with the locally built
tokenizer, a config dict for RolloutWorker / PolicyTrainer without composing Hydra (only the groups they read),
and chat prompts."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from launch.config import CONF_DIR

# Small models for the GPU tests (head_dim 64; the MoE has one dense layer so dense-row zeroing is exercised).
DENSE_SMALL = dict(
    model_type="qwen3", hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=64, max_position_embeddings=4096, rope_theta=10000.0,
    tie_word_embeddings=False, initializer_range=0.1,
)
MOE_SMALL = dict(
    model_type="qwen3_moe", hidden_size=256, intermediate_size=768, moe_intermediate_size=256, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_experts=8, num_experts_per_tok=2,
    norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0], max_position_embeddings=4096,
    rope_theta=10000.0, tie_word_embeddings=False, output_router_logits=False, initializer_range=0.1,
)
# Benchmark shapes: Qwen3-0.6B, and a ~1.1B Qwen3-MoE (32 experts, top-4), with Qwen's vocabulary size.
QWEN3_06B = dict(
    model_type="qwen3", hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0,
    rms_norm_eps=1e-6, tie_word_embeddings=True,
)
MOE_1B = dict(
    model_type="qwen3_moe", hidden_size=1024, intermediate_size=3072, moe_intermediate_size=512, num_hidden_layers=16,
    num_attention_heads=16, num_key_value_heads=4, head_dim=128, num_experts=32, num_experts_per_tok=4,
    norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], vocab_size=151936, max_position_embeddings=40960,
    rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, output_router_logits=False,
)

# Large shapes (issue 36): Qwen3-30B-A3B (48 layers, 128 experts, top-8) and Qwen3-4B, as their configs on the hub;
# `num_hidden_layers` may be cut (`with_layers`) so that a shape's training state just outgrows one GPU.
QWEN3_30B_A3B = dict(
    model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
    num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
    norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], vocab_size=151936, max_position_embeddings=40960,
    rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, output_router_logits=False,
)
QWEN3_4B = dict(
    model_type="qwen3", hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0,
    rms_norm_eps=1e-6, tie_word_embeddings=True,
)


def with_layers(spec: dict, layers: int | None) -> dict:
    """`spec` cut to its first `layers` decoder layers (None: as it is)."""
    return spec if not layers else {**spec, "num_hidden_layers": int(layers)}


def parameter_count(spec: dict) -> tuple[int, int]:
    """(all parameters, parameters one token multiplies through) of a Qwen3 / Qwen3-MoE shape, from its config keys:
    embeddings and head, attention with its q/k norms, the routed experts (all of them / top-k) and the router."""
    h, L, v = spec["hidden_size"], spec["num_hidden_layers"], spec["vocab_size"]
    dh = spec["head_dim"]
    attn = h * dh * (2 * spec["num_attention_heads"] + 2 * spec["num_key_value_heads"]) + 2 * dh + 2 * h
    dense = 3 * h * spec["intermediate_size"]
    moe = spec["model_type"] == "qwen3_moe"
    dense_layers = len(spec.get("mlp_only_layers") or []) if moe else L
    expert = 3 * h * spec.get("moe_intermediate_size", 0)
    router = h * spec.get("num_experts", 0)
    mlp_all = dense * dense_layers + (L - dense_layers) * (spec.get("num_experts", 0) * expert + router)
    mlp_active = dense * dense_layers + (L - dense_layers) * (spec.get("num_experts_per_tok", 0) * expert + router)
    head = v * h * (1 if spec.get("tie_word_embeddings") else 2) + h
    return head + L * attn + mlp_all, head + L * attn + mlp_active


def build_model(out_dir: str | Path, spec: dict, seed: int = 0) -> str:
    """Random-weight bf16 model (on the GPU when there is one) + the locally built tokenizer in out_dir; kept
    when out_dir already holds one."""
    import torch

    from rl.models import build_random_model

    out_dir = Path(out_dir)
    if not (out_dir / "config.json").exists():
        device = "cuda" if torch.cuda.is_available() else "cpu"
        build_random_model(out_dir, spec, dtype=torch.bfloat16, seed=seed, device=device)
        if device == "cuda":
            torch.cuda.empty_cache()
    return str(out_dir)


def _yaml(rel: str) -> dict:
    return yaml.safe_load((CONF_DIR / rel).read_text())


def base_cfg(model_path: str, *, keep_mask: bool, keep_routing: bool, **groups) -> dict:
    """cfg dict with rollout=vllm, trainer=deepspeed, algorithm=grpo, data=default; `groups` updates per group,
    e.g. rollout=dict(top_p=0.9)."""
    cfg = {
        "seed": 1,
        "rollout": _yaml("rollout/vllm.yaml"),
        "trainer": _yaml("trainer/deepspeed.yaml"),
        "algorithm": _yaml("algorithm/grpo.yaml"),
        "data": _yaml("data/default.yaml"),
        "model": {"path": model_path, "dtype": "bfloat16", "attn_implementation": "sdpa"},
        "domains": {},
    }
    cfg["algorithm"].update(keep_sampling_mask=keep_mask, keep_routing=keep_routing)
    cfg["trainer"].update(num_gpus=0.5, num_cpus=1)
    for group, values in groups.items():
        cfg.setdefault(group, {}).update(copy.deepcopy(values))
    return cfg


def chat_prompts(tokenizer, n: int) -> list[list[int]]:
    texts = [
        "What is 12 times 7?", "Write a haiku about the sea.", "Explain recursion briefly.", "Sort 5, 3, 9, 1.",
        "Name three prime numbers.", "What is the capital of France?", "Translate 'hello' to Spanish.",
        "Give a short proof that sqrt(2) is irrational.",
    ]
    out = []
    for i in range(n):
        text = f"{texts[i % len(texts)]} (request {i})"
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        out.append(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    return out
