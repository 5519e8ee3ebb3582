"""Body FLOPs from the config (rl/flops.py) against torch's FLOP counter on real HF models of every supported
family, and the per-step perf metrics."""

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoConfig, AutoModelForCausalLM

from rl.flops import PerfMeter, body_flops, peak_tflops, resolve_peak_tflops
from rl.models import EMBEDDED_CONFIGS
from rl.trajectory import Trajectory

SMALL = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, vocab_size=256, max_position_embeddings=256)
CONFIGS = {
    "tiny-moe": EMBEDDED_CONFIGS["tiny-moe"],
    "tiny-dense": EMBEDDED_CONFIGS["tiny-dense"],
    # MLA attention, one dense layer first, a shared expert
    "deepseek_v3": dict(SMALL, model_type="deepseek_v3", intermediate_size=96, moe_intermediate_size=32,
                        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                        q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                        n_group=1, topk_group=1, num_key_value_heads=4),
    # a gated shared expert and a dense layer in the middle
    "qwen2_moe": dict(SMALL, model_type="qwen2_moe", intermediate_size=96, moe_intermediate_size=32, num_experts=8,
                      num_experts_per_tok=2, shared_expert_intermediate_size=48, num_key_value_heads=2,
                      decoder_sparse_step=1, mlp_only_layers=[1]),
    "mixtral": dict(SMALL, model_type="mixtral", intermediate_size=48, num_local_experts=4, num_experts_per_tok=2,
                    num_key_value_heads=2),
}


def _config(name):
    spec = dict(CONFIGS[name])
    model_type = spec.pop("model_type")
    spec.setdefault("vocab_size", 256)
    return AutoConfig.for_model(model_type, attn_implementation="eager", experts_implementation="eager", **spec)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_body_flops_match_torch_flop_counter(name):
    """The counter sees the body's matmuls (eager attention computes the full T x T scores, then masks them; the
    experts loop runs only the routed tokens), so it must equal linear * T + pair * T^2 exactly."""
    config = _config(name)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    flops = body_flops(config)
    for seq_len in (1, 9):
        ids = torch.randint(0, config.vocab_size, (1, seq_len))
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model.model(input_ids=ids)
        assert counter.get_total_flops() == flops.linear_per_token * seq_len + flops.attn_per_pair * seq_len ** 2


def test_moe_counts_only_the_routed_experts():
    moe = body_flops(_config("tiny-moe"))
    all_experts = dict(CONFIGS["tiny-moe"], num_experts_per_tok=8)
    spec = dict(all_experts)
    spec.pop("model_type")
    dense_equiv = body_flops(AutoConfig.for_model("qwen3_moe", vocab_size=256, **spec))
    c = CONFIGS["tiny-moe"]  # 6 more experts per token: 3 d x ff weights each, 2 FLOPs per weight, every layer
    extra = 6 * 3 * c["hidden_size"] * c["moe_intermediate_size"] * 2 * c["num_hidden_layers"]
    assert dense_equiv.linear_per_token - moe.linear_per_token == extra
    # causal attention: the pair term of a sequence is T(T+1)/2 pairs
    assert moe.forward(4) == moe.linear_per_token * 4 + moe.attn_per_pair * 10


def test_peak_lookup():
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA H200") == 989.0
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_tflops("Some Future GPU") is None
    assert resolve_peak_tflops("auto", "cpu") is None
    assert resolve_peak_tflops(100, "cpu") == 100.0
    assert resolve_peak_tflops(None, "NVIDIA H100 80GB HBM3") is None
    assert resolve_peak_tflops("auto", "NVIDIA H200") == 989.0


def _traj(prompt, response):
    return Trajectory(uid="u", group_id="g", domain="math", prompt_ids=list(range(prompt)),
                      response_ids=np.zeros(response, dtype=np.int64), inference_logprobs=np.zeros(response))


def test_perf_meter_counts_every_trained_token():
    flops = body_flops(_config("tiny-dense"))
    trajs = [_traj(10, 20), _traj(5, 5)]
    times = {"time/train": 2.0, "time/ref": 0.5}
    m = PerfMeter(flops, peak_tflops=1e-3, train_gpus=2, recompute_old=False).metrics(trajs, trajs[:1], times)
    train = 3 * (flops.forward(30) + flops.forward(10))
    assert m["throughput/train_tokens_per_s"] == 40 / 2.0
    assert m["throughput/ref_tokens_per_s"] == 30 / 0.5
    assert m["perf/train_tflops_per_gpu"] == pytest.approx(train / 2.0 / 2 / 1e12)
    assert m["perf/mfu"] == pytest.approx(m["perf/train_tflops_per_gpu"] / 1e-3)
    assert m["perf/ref_tflops"] == pytest.approx(flops.forward(30) / 0.5 / 1e12)
    again = PerfMeter(flops, None, 2, recompute_old=True).metrics(trajs, [], {"time/train": 2.0, "time/ref": 0.0})
    assert again["perf/train_tflops_per_gpu"] == pytest.approx(m["perf/train_tflops_per_gpu"] * 4 / 3)
    assert "perf/mfu" not in again and "throughput/ref_tokens_per_s" not in again
    assert PerfMeter(None, 1.0, 1, False).metrics(trajs, [], times) == {"throughput/train_tokens_per_s": 20.0}


@pytest.mark.parametrize("name", ["MOE_SMALL", "QWEN3_06B", "QWEN3_30B_A3B", "QWEN3_4B"])
def test_parameter_count_of_the_benchmark_shapes_is_the_models_own(name):
    """launch.testbed.parameter_count (benchmarks/large_shape.py prints it) against the model transformers builds
    from the same config (on the meta device: no memory), the large shapes cut to 2 layers; and the active count of an
    MoE shape is its count with top-k experts in place of all of them."""
    import launch.testbed as tb

    spec = tb.with_layers({"vocab_size": 2048, **getattr(tb, name)}, 2 if name in ("QWEN3_30B_A3B", "QWEN3_4B") else None)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**spec))
    total, active = tb.parameter_count(spec)
    assert total == sum(p.numel() for p in model.parameters())
    if "num_experts" in spec:
        dense_layers = len(spec.get("mlp_only_layers") or [])
        unused = (spec["num_experts"] - spec["num_experts_per_tok"]) * 3 * spec["hidden_size"] * spec["moe_intermediate_size"]
        assert total - active == (spec["num_hidden_layers"] - dense_layers) * unused
    else:
        assert active == total
