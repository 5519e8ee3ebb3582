"""Keep Routing (rl/routing.py) on tiny random MoE models of every supported family (CPU, fp32)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM

from rl.routing import (
    SUPPORTED_MODEL_TYPES,
    RouteRecorder,
    RouteReplay,
    UnsupportedMoEError,
    moe_layer_indices,
    moe_layers,
    route_dtype,
    stack_records,
)
from rl.trajectory import Trajectory, collate

VOCAB = 100
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
DEEPSEEK = dict(
    COMMON,
    num_key_value_heads=4,
    num_hidden_layers=3,
    moe_intermediate_size=16,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_group=4,
    topk_group=2,
    routed_scaling_factor=2.5,
    first_k_dense_replace=1,
    kv_lora_rank=16,
    q_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=8,
)


def _configs():
    t = transformers
    out = {
        # layer 1 is dense through mlp_only_layers
        "qwen3_moe": lambda: t.Qwen3MoeConfig(
            **COMMON, num_hidden_layers=3, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=True, mlp_only_layers=[1], head_dim=8,
        ),
        # shared expert; norm_topk_prob False (Qwen2-MoE default); layer 0 dense via decoder_sparse_step=2
        "qwen2_moe": lambda: t.Qwen2MoeConfig(
            **COMMON, num_hidden_layers=3, moe_intermediate_size=16, shared_expert_intermediate_size=32,
            num_experts=8, num_experts_per_tok=2, decoder_sparse_step=2,
        ),
        "mixtral": lambda: t.MixtralConfig(
            **COMMON, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2, router_jitter_noise=0.3,
        ),
        "olmoe": lambda: t.OlmoeConfig(
            **dict(COMMON, num_key_value_heads=4), num_hidden_layers=2, num_experts=8, num_experts_per_tok=2,
        ),
        "deepseek_v3": lambda: t.DeepseekV3Config(**DEEPSEEK),
    }
    if hasattr(t, "DeepseekV32Config"):
        out["deepseek_v32"] = lambda: t.DeepseekV32Config(
            **DEEPSEEK, index_topk=4, index_head_dim=16, index_n_heads=2
        )
    return out


CONFIGS = _configs()
FAMILIES = list(CONFIGS)


def make_model(family: str, seed: int = 0):
    cfg = CONFIGS[family]()
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).float().eval()
    spec = moe_layers(model)
    with torch.no_grad():
        for router in spec.routers.values():
            router.weight.normal_(0.0, 0.5)  # clear-cut routing, no near-ties
            if hasattr(router, "e_score_correction_bias"):
                router.e_score_correction_bias.uniform_(-0.3, 0.3)  # nonzero selection-only bias
    return model


def inputs(batch: int = 2, seq: int = 9, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, seq), generator=g)


def record(model, ids: torch.Tensor) -> np.ndarray:
    with torch.no_grad(), RouteRecorder(model) as rec:
        model(ids)
    assert len(rec.records) == 1
    return rec.records[0]


def router_grads(model) -> dict[int, torch.Tensor]:
    return {i: r.weight.grad.clone() for i, r in moe_layers(model).routers.items()}


# ------------------------------------------------------------------------------------------------ spec / dtype


def test_all_expected_families_supported():
    for family in FAMILIES:
        assert family in SUPPORTED_MODEL_TYPES
    assert "deepseek_v32" in FAMILIES  # present in the pinned transformers 5.23


@pytest.mark.parametrize("family", FAMILIES)
def test_spec_excludes_dense_layers(family):
    model = make_model(family)
    spec = moe_layers(model)
    expected = {"qwen3_moe": [0, 2], "qwen2_moe": [1], "mixtral": [0, 1], "olmoe": [0, 1]}.get(family, [1, 2])
    assert spec.layer_ids == expected == moe_layer_indices(model.config)
    assert spec.top_k == 2 and spec.dtype == np.uint8
    assert spec.num_experts == (4 if family == "mixtral" else 8)


def test_route_dtype():
    assert route_dtype(256) == np.uint8 and route_dtype(257) == np.uint16


def test_dense_model_returns_none():
    cfg = transformers.Qwen3Config(**COMMON, num_hidden_layers=2, head_dim=8)
    assert moe_layers(AutoModelForCausalLM.from_config(cfg)) is None


def test_unsupported_moe_raises():
    cfg = transformers.GraniteMoeConfig(**COMMON, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2)
    model = AutoModelForCausalLM.from_config(cfg)
    with pytest.raises(UnsupportedMoEError, match="granitemoe.*qwen3_moe"):
        moe_layers(model)


# ---------------------------------------------------------------------------------------------- per family


@pytest.mark.parametrize("family", FAMILIES)
def test_record_and_replay_reproduces_logits(family):
    model = make_model(family)
    spec = moe_layers(model)
    ids = inputs()
    routes = record(model, ids)
    assert routes.shape == (2, 9, spec.num_hidden_layers, 2) and routes.dtype == np.uint8
    dense = ~spec.moe_mask()
    assert dense.any() == (family not in ("mixtral", "olmoe"))
    assert (routes[:, :, dense] == 0).all()
    assert (routes[:, :, spec.moe_mask()] != 0).any() and routes.max() < spec.num_experts
    # own top-k ids are distinct per token
    moe = routes[:, :, spec.moe_mask()]
    assert (np.sort(moe, -1)[..., 1:] != np.sort(moe, -1)[..., :-1]).all()

    with torch.no_grad():
        ref = model(ids).logits
        # recorded routes cover T-1 positions, the last one uses own routing
        routed = torch.from_numpy(routes[:, :-1].astype(np.int64))
        with RouteReplay(model, routed, torch.ones(2, 8, dtype=torch.bool)) as rp:
            out = model(ids).logits
    assert (out - ref).abs().max().item() < 1e-5
    assert rp.mismatch_count == 0 and rp.total_count == 2 * 8 * len(spec.layer_ids)
    assert rp.mismatch_frac == 0.0


@pytest.mark.parametrize("family", FAMILIES)
def test_replay_gradient_reaches_router(family):
    model = make_model(family)
    ids = inputs()
    routed = torch.from_numpy(record(model, ids).astype(np.int64))
    # the reference: plain forward/backward (Mixtral in eval mode so that no jitter is applied)
    model(ids).logits.float().pow(2).mean().backward()
    plain = router_grads(model)
    model.zero_grad()

    model.train()  # Mixtral: jitter noise would apply in train mode; replay must switch it off
    with RouteReplay(model, routed) as rp:
        logits = model(ids).logits
        logits.float().pow(2).mean().backward()
    assert rp.mismatch_count == 0
    for layer, grad in router_grads(model).items():
        assert grad.abs().sum() > 0, f"layer {layer} router got no gradient"
        torch.testing.assert_close(grad, plain[layer], rtol=1e-4, atol=1e-7)
    if family == "mixtral":
        assert all(b.jitter_noise == 0.3 for b in moe_layers(model).blocks.values())  # restored


@pytest.mark.parametrize("family", FAMILIES)
def test_forcing_other_experts_changes_logits_and_counts_mismatch(family):
    model = make_model(family)
    spec = moe_layers(model)
    ids = inputs()
    routes = torch.from_numpy(record(model, ids).astype(np.int64))
    forced = routes.clone()
    forced[:, :, spec.layer_ids] = (forced[:, :, spec.layer_ids] + 1) % spec.num_experts
    with torch.no_grad():
        ref = model(ids).logits
        with RouteReplay(model, forced) as rp:
            out = model(ids).logits
        # valid=False everywhere: every position keeps its own routing
        with RouteReplay(model, forced, torch.zeros(forced.shape[:2], dtype=torch.bool)) as off:
            same = model(ids).logits
    assert (out - ref).abs().max().item() > 1e-3
    assert rp.mismatch_frac == 1.0 and rp.total_count == 2 * 9 * len(spec.layer_ids)
    assert (same - ref).abs().max().item() < 1e-6
    assert off.total_count == 0 and off.mismatch_frac == 0.0


@pytest.mark.parametrize("family", FAMILIES)
def test_gradient_checkpointing(family):
    model = make_model(family)
    spec = moe_layers(model)
    ids = inputs()
    routed = torch.from_numpy(record(model, ids).astype(np.int64))
    with torch.no_grad():
        ref = model(ids).logits
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    model.train()
    with RouteReplay(model, routed) as rp:
        logits = model(ids).logits
        logits.float().pow(2).mean().backward()  # recomputation happens here: keep it inside the context
    assert (logits.detach() - ref).abs().max().item() < 1e-5
    assert rp.mismatch_count == 0 and rp.total_count == 2 * 9 * len(spec.layer_ids)  # not doubled
    for layer, grad in router_grads(model).items():
        assert grad.abs().sum() > 0, f"layer {layer} router got no gradient"

    # forced routes under checkpointing: the recomputed forward must use the forced ids as well
    forced = routed.clone()
    forced[:, :, spec.layer_ids] = (forced[:, :, spec.layer_ids] + 1) % spec.num_experts
    model.zero_grad()
    with RouteReplay(model, forced) as rp:
        model(ids).logits.float().pow(2).mean().backward()
    gc_grads = router_grads(model)
    (getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable)()
    model.zero_grad()
    with RouteReplay(model, forced):
        model(ids).logits.float().pow(2).mean().backward()
    assert rp.mismatch_frac == 1.0 and rp.total_count == 2 * 9 * len(spec.layer_ids)
    for layer, grad in router_grads(model).items():
        torch.testing.assert_close(gc_grads[layer], grad, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_record_then_replay(family):
    """KV-cache generation: prefill + per-step records, stacked, reproduce the full-sequence forward."""
    model = make_model(family)
    spec = moe_layers(model)
    prompt = inputs(batch=1, seq=5, seed=3)
    with torch.no_grad(), RouteRecorder(model) as rec:
        out = model.generate(prompt, max_new_tokens=4, do_sample=False, min_new_tokens=4, pad_token_id=0)
    seqs = [r.shape[1] for r in rec.records]
    assert seqs == [5, 1, 1, 1]  # the last sampled token is never fed to the model
    routes = stack_records(rec.records)
    assert routes.shape == (1, out.shape[1] - 1, spec.num_hidden_layers, 2)
    with torch.no_grad():
        ref = model(out).logits
        with RouteReplay(model, torch.from_numpy(routes.astype(np.int64))) as rp:
            replay = model(out).logits
    assert rp.mismatch_count == 0
    assert (replay - ref).abs().max().item() < 1e-5
    rec.clear()
    assert rec.records == []


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_collated_batch_with_padding(family):
    """Trajectories of different lengths -> collate -> replay with route_valid; padded rows keep own routing."""
    model = make_model(family)
    trajs = []
    for i, (p, r) in enumerate([(4, 5), (6, 2)]):
        ids = inputs(batch=1, seq=p + r, seed=10 + i)
        routes = record(model, ids)[0, :-1]
        trajs.append(
            Trajectory(
                uid=str(i), group_id="g", domain="d", prompt_ids=ids[0, :p].numpy(), response_ids=ids[0, p:].numpy(),
                inference_logprobs=np.zeros(r, np.float32), routed_experts=routes,
            )
        )
    batch = collate(trajs, pad_id=0)
    assert batch.route_valid.sum().item() == 8 + 7
    # garbage in the padded rows must be ignored
    batch.routed_experts[~batch.route_valid] = 1
    with torch.no_grad():
        ref = model(batch.input_ids).logits
        with RouteReplay(model, batch.routed_experts, batch.route_valid) as rp:
            out = model(batch.input_ids).logits
    assert (out - ref).abs().max().item() < 1e-5
    assert rp.total_count == 15 * len(moe_layers(model).layer_ids) and rp.mismatch_count == 0


def test_more_than_256_experts_records_uint16():
    cfg = CONFIGS["qwen3_moe"]()
    cfg.num_experts, cfg.mlp_only_layers = 300, []
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).float().eval()
    ids = inputs()
    routes = record(model, ids)
    assert routes.dtype == np.uint16 and moe_layers(model).dtype == np.uint16
    with torch.no_grad():
        ref = model(ids).logits
        with RouteReplay(model, torch.from_numpy(routes.astype(np.int64))) as rp:
            out = model(ids).logits
    assert rp.mismatch_count == 0 and (out - ref).abs().max().item() < 1e-5


def test_replay_rejects_bad_shapes():
    model = make_model("qwen3_moe")
    with pytest.raises(ValueError, match="routed_experts must be"):
        RouteReplay(model, torch.zeros(2, 8, 2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="forward has 2"):
        with RouteReplay(model, torch.zeros(3, 8, 3, 2, dtype=torch.long)):
            model(inputs())
