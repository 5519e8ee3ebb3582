"""`model.attn_implementation=varlen` on a GPU: torch's FlashAttention-2 varlen kernels (not the CPU's masked sdpa
stand-in) give the packed batch the logprobs and gradients of sdpa over the padded batch, up to bf16 rounding, and
cost no more GPU time than sdpa's masked packed row (printed). Run on the device: `pytest -m gpu
tests/test_attention_gpu.py -s`."""

import time

import pytest
import torch

from rl import attention
from rl.models import load_causal_lm
from rl.trajectory import Trajectory, collate
from trainer.forward import forward_logprobs

pytestmark = pytest.mark.gpu


def _trajs(lengths, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(lengths):
        ids = torch.randint(3, vocab, (n,), generator=g).numpy()
        t = Trajectory(uid=str(i), group_id=str(i), domain="math", prompt_ids=ids[: n // 4], response_ids=ids[n // 4:],
                       inference_logprobs=None)
        out.append(t)
    return out


def _logprobs_and_grads(model, batch):
    model.zero_grad()
    out = forward_logprobs(model, batch.to("cuda"), temperature=1.0)
    out.logprobs.float().sum().backward()
    grads = torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])
    return out.logprobs.float().detach(), grads


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_varlen_flash_kernels_match_sdpa(tiny_dense_path, monkeypatch):
    lengths = [700, 1500, 90, 1211, 33, 512]
    trajs = _trajs(lengths, vocab=200)
    sdpa = load_causal_lm(tiny_dense_path, "bfloat16", "sdpa", "cuda").train()
    varlen = load_causal_lm(tiny_dense_path, "bfloat16", "varlen", "cuda").train()
    monkeypatch.setattr(attention, "_masked_varlen", lambda *a: pytest.fail("the masked stand-in ran on the GPU"))
    ref_lp, ref_g = _logprobs_and_grads(sdpa, collate(trajs, pad_id=0))  # padded rows, no mask
    lp, g = _logprobs_and_grads(varlen, collate(trajs, pad_id=0, packed=True))
    lp_pad, g_pad = _logprobs_and_grads(varlen, collate(trajs, pad_id=0))  # padded rows through varlen: one per row
    for got, grads in ((lp, g), (lp_pad, g_pad)):
        diff = (got - ref_lp).abs()
        print(f"varlen vs sdpa: |dlogp| mean {diff.mean():.2e} max {diff.max():.2e}; grad rel "
              f"{((grads - ref_g).norm() / ref_g.norm()):.2e}")
        assert diff.mean() < 5e-3 and diff.max() < 0.1
        assert (grads - ref_g).norm() / ref_g.norm() < 2e-2
    # a boundary moved changes the answer: the kernels do read the boundaries
    batch = collate(trajs, pad_id=0, packed=True)
    batch.cu_seqlens[2] += 50  # still inside the third sample
    with torch.no_grad():
        moved = forward_logprobs(varlen, batch.to("cuda"), temperature=1.0).logprobs.float()
    assert (moved - ref_lp).abs().max() > 0.1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_varlen_speed_against_masked_sdpa(tiny_dense_path):
    """Printed, not asserted: forward + backward over one packed row of ~4k tokens, each call a new row length."""
    models = {name: load_causal_lm(tiny_dense_path, "bfloat16", name, "cuda").train() for name in ("sdpa", "varlen")}
    for name, model in models.items():
        times = []
        for rep in range(12):
            batch = collate(_trajs([400 + 7 * rep + 37 * i for i in range(8)], vocab=200, seed=rep), 0, packed=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            _logprobs_and_grads(model, batch)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        print(f"{name}: packed fwd+bwd median {sorted(times[2:])[len(times[2:]) // 2] * 1e3:.1f} ms")
