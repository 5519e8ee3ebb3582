"""CPU checks of the vLLM engine's pure pieces (no vLLM needed): the flat-logprobs -> kept-set conversion, the
route alignment, the trainer -> checkpoint name mapping used by the GPU weight sync, and `engine: auto`."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rollout.sampling import process_logits
from rollout.vllm_capture import flat_to_capture
from rollout.vllm_engine import align_routes, default_num_logprobs
from rl.models import to_checkpoint_format


def _fake_flat(logp: torch.Tensor, sampled: torch.Tensor, k: int):
    """vLLM's FlatLogprobs layout: per position the sampled token, then the top-k (descending)."""
    top = torch.topk(logp, k, dim=-1)
    ids = torch.cat([sampled[:, None], top.indices], 1)
    vals = torch.cat([logp.gather(1, sampled[:, None]), top.values], 1)
    R, W = ids.shape
    return SimpleNamespace(
        token_ids=ids.flatten().tolist(), logprobs=vals.flatten().tolist(),
        start_indices=list(range(0, R * W, W)), end_indices=list(range(W, R * W + 1, W)),
    )


def test_flat_to_capture_recovers_kept_sets():
    torch.manual_seed(0)
    R, V, top_k = 40, 300, 16
    logp = process_logits(torch.randn(R, V) * 3, temperature=1.0, top_k=top_k, top_p=0.8)
    sampled = torch.multinomial(logp.exp(), 1).squeeze(1)
    cap = flat_to_capture(_fake_flat(logp, sampled, default_num_logprobs(top_k)), R, want_mask=True)
    np.testing.assert_allclose(cap.inference_logprobs, logp.gather(1, sampled[:, None]).squeeze(1).numpy(), rtol=1e-6)
    assert cap.truncated == 0  # K = top_k + 1 > any top-k set
    for j in range(R):
        got = set(cap.kept_ids[cap.kept_offsets[j] : cap.kept_offsets[j + 1]].tolist())
        assert got == set(torch.isfinite(logp[j]).nonzero().squeeze(1).tolist())
    # K smaller than the kept sets: every position whose K-th entry is finite is flagged
    cut = flat_to_capture(_fake_flat(logp, sampled, 4), R, want_mask=True)
    assert cut.truncated == int((torch.isfinite(logp).sum(1) >= 4).sum())
    assert np.array_equal(cut.cut, (torch.isfinite(logp).sum(1) >= 4).numpy())
    assert flat_to_capture(_fake_flat(logp, sampled, 0), R, want_mask=True).kept_ids is None


def test_align_routes_zeroes_dense_layers():
    routes = np.random.default_rng(0).integers(0, 8, size=(12, 4, 2)).astype(np.uint8)
    out = align_routes(routes, 10, dense_layers=[0], dtype=np.dtype(np.uint8))
    assert out.shape == (10, 4, 2) and out.dtype == np.uint8
    assert (out[:, 0] == 0).all() and (out[:, 1:] == routes[:10, 1:]).all()
    assert align_routes(routes, 12, [], np.dtype(np.uint16)).shape == (12, 4, 2)
    with pytest.raises(ValueError, match="Keep Routing"):  # fewer rows than positions: refused, never padded
        align_routes(routes, 14, [], np.dtype(np.uint16))  # (tests/test_route_rows.py)


def test_checkpoint_names_match_transformers_layout():
    """Our per-expert split of the fused 3-D experts equals transformers' own save-time conversion."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.core_model_loading import revert_weight_conversion

    from rl.models import EMBEDDED_CONFIGS

    spec = dict(EMBEDDED_CONFIGS["tiny-moe"])
    config = AutoConfig.for_model(spec.pop("model_type"), vocab_size=64, **spec)
    model = AutoModelForCausalLM.from_config(config)
    ours = {n: t for name, p in model.named_parameters() for n, t in to_checkpoint_format(name, p.detach(), "qwen3_moe")}
    ref = revert_weight_conversion(model, {k: v.detach() for k, v in model.state_dict().items()})
    assert set(ours) == set(ref)
    for name, t in ours.items():
        assert torch.equal(t, ref[name]), name


def test_engine_auto_falls_back_to_hf_without_vllm(tiny_dense_path):
    from rollout.worker import make_engine, resolve_engine

    rcfg = dict(engine="auto", device="cpu", max_batch_size=4, top_k=0)
    if resolve_engine(rcfg) == "hf":
        engine = make_engine(rcfg, {"dtype": "float32", "attn_implementation": "sdpa"}, tiny_dense_path, False)
        assert type(engine).__name__ == "HFEngine"
