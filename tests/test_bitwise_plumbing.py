"""trainer/bitwise.py's plumbing on the CPU: its forward, with each vLLM kernel it calls replaced by the same math in
plain torch (float32), must give the ordinary forward's logprobs for padded and packed batches, with kept sets and a
temperature. vLLM's kernels need a Hopper GPU; that they give the engine's bits is `tests/test_bitwise_gpu.py`'s
job. Here a wrong position, boundary, head split, logit index or kept-set offset shows up as a large difference."""

import sys
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rl.models import load_causal_lm
from rl.trajectory import Trajectory, collate
from trainer import bitwise
from trainer.forward import forward_logprobs


def _rms_norm(x, w, eps):
    y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return (y * w.float()).to(x.dtype) if w is not None else y.to(x.dtype)


def _linear(x, w, b=None):
    out = x @ w.t()
    return out + b if b is not None else out


def _rotary(positions, q, k, head_size, cache, is_neox):
    assert is_neox
    cos, sin = cache[positions].chunk(2, dim=-1)  # [T, rot/2] each
    for x in (q, k):
        view = x.view(x.shape[0], -1, head_size)
        a, b = view[..., : head_size // 2].clone(), view[..., head_size // 2 :].clone()
        view[..., : head_size // 2] = a * cos[:, None] - b * sin[:, None]
        view[..., head_size // 2 :] = b * cos[:, None] + a * sin[:, None]


def _flash_attn_varlen(q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, cu_seqlens_k, softmax_scale, causal,
                       num_splits, fa_version):
    assert causal and num_splits == 1 and max_seqlen_q >= 65  # rl.bitwise.FA3_MIN_QUERY_ROWS on the trainer's side
    out = torch.empty_like(q)
    groups = q.shape[1] // k.shape[1]
    for a, b in zip(cu_seqlens_q[:-1].tolist(), cu_seqlens_q[1:].tolist()):
        qs, ks, vs = (t[a:b].transpose(0, 1) for t in (q, k, v))
        ks, vs = ks.repeat_interleave(groups, 0), vs.repeat_interleave(groups, 0)
        out[a:b] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=softmax_scale).transpose(0, 1)
    return out


def _silu_and_mul(out, gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    out.copy_(F.silu(gate) * up)


def _apply_temperature(z, rows, temperature):
    z.div_(temperature[rows.long()][:, None])


@pytest.fixture
def torch_kernels(monkeypatch):
    """The vLLM modules trainer/bitwise.py imports, as plain-torch stand-ins (no vLLM on the CPU test machines)."""
    mods = {name: types.ModuleType(name) for name in (
        "vllm", "vllm._custom_ops", "vllm.model_executor", "vllm.model_executor.layers",
        "vllm.model_executor.layers.batch_invariant", "vllm.vllm_flash_attn", "vllm.v1", "vllm.v1.worker",
        "vllm.v1.worker.gpu", "vllm.v1.worker.gpu.sample", "vllm.v1.worker.gpu.sample.gumbel")}
    mods["vllm._custom_ops"].rotary_embedding = _rotary
    mods["vllm.model_executor.layers.batch_invariant"].rms_norm_batch_invariant = _rms_norm
    mods["vllm.model_executor.layers.batch_invariant"].linear_batch_invariant = _linear
    mods["vllm.vllm_flash_attn"].flash_attn_varlen_func = _flash_attn_varlen
    mods["vllm.v1.worker.gpu.sample.gumbel"].apply_temperature = _apply_temperature
    mods["vllm"]._custom_ops = mods["vllm._custom_ops"]
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(bitwise, "silu_and_mul", _silu_and_mul)
    monkeypatch.setattr(bitwise, "gpu_unsupported_reason", lambda: None)


def _trajectories(vocab: int, kept: bool) -> list[Trajectory]:
    rng = np.random.default_rng(0)
    out = []
    for i, (p, r) in enumerate([(7, 5), (3, 9), (12, 1), (5, 6)]):
        t = Trajectory(uid=str(i), group_id="g", domain="math",
                       prompt_ids=rng.integers(3, vocab, p).astype(np.int32),
                       response_ids=rng.integers(3, vocab, r).astype(np.int32),
                       inference_logprobs=np.zeros(r, np.float32))
        if kept:  # a few ids per position, the sampled one among them
            sets = [np.unique(np.r_[rng.integers(3, vocab, int(rng.integers(1, 6))), tok]) for tok in t.response_ids]
            t.kept_ids = np.concatenate(sets).astype(np.int32)
            t.kept_offsets = np.r_[0, np.cumsum([len(s) for s in sets])].astype(np.int64)
        out.append(t)
    return out


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("kept,temperature", [(False, 1.0), (True, 0.7)], ids=["full-vocab", "kept-sets-T0.7"])
def test_the_bitwise_forward_is_the_ordinary_forward_in_exact_arithmetic(torch_kernels, tiny_dense_path, packed, kept,
                                                                         temperature):
    model = load_causal_lm(tiny_dense_path, "float32").eval()
    torch.manual_seed(0)
    for name, p in model.named_parameters():  # built as ones: a norm applied with the wrong weight would not show
        if "norm" in name:
            p.data.uniform_(0.5, 1.5)
    batch = collate(_trajectories(model.config.vocab_size, kept), pad_id=0, packed=packed)
    with torch.no_grad():
        ordinary = forward_logprobs(model, batch, temperature=temperature).logprobs
    exact = bitwise.BitwiseForward(model).logprobs(batch, temperature, chunk_size=5)  # chunks cut samples
    assert exact.shape == ordinary.shape == batch.targets.shape
    assert torch.allclose(exact, ordinary, atol=2e-5), (exact - ordinary).abs().max()


def test_the_rope_table_is_vllms_layout(tiny_dense_path):
    """[max_positions, rotary_dim]: cos of every frequency, then sin (vLLM's cos_sin_cache)."""
    model = load_causal_lm(tiny_dense_path, "float32")
    bf = bitwise.BitwiseForward.__new__(bitwise.BitwiseForward)
    bf.config, bf.head_dim, bf._rope = model.config, 8, None
    table = bf.rope(torch.device("cpu"), torch.float32)
    assert table.shape == (model.config.max_position_embeddings, 8)
    assert torch.equal(table[0], torch.tensor([1.0] * 4 + [0.0] * 4))
