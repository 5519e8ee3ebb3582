"""The fused Triton reduction of rl/kept_set.py against its torch reference, on a GPU (`-m gpu`)."""

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("triton")

import numpy as np  # noqa: E402

from rl.kept_set import LOST, KeptIdBuffer, reduce_rows, reduce_rows_torch  # noqa: E402
from rollout.sampling import process_logits  # noqa: E402


def _sets(buffer_ids: np.ndarray, total, start) -> list:
    return [buffer_ids[s : s + n] if s >= 0 else None for n, s in zip(total.tolist(), start.tolist())]


@pytest.mark.parametrize("dtype, logits", [(torch.bfloat16, True), (torch.float32, False), (torch.float32, True)])
@pytest.mark.parametrize("vocab", [151936, 1000])
def test_kernel_matches_torch(dtype, logits, vocab):
    gen = torch.Generator(device="cuda").manual_seed(0)
    raw = torch.randn(257, vocab, device="cuda", generator=gen) * 4
    rows = []
    for r in range(raw.shape[0]):  # top-k / top-p mixes: some rows keep 1 id, some hundreds
        top_k, top_p = [(64, 0.95), (0, 0.9), (1, 1.0), (200, 1.0), (8, 0.5)][r % 5]
        rows.append(process_logits(raw[r : r + 1], 1.0, top_k, top_p))
    logprobs = torch.cat(rows)
    processed = (logprobs + 3.0 if logits else logprobs).to(dtype)
    sampled = torch.multinomial(logprobs.exp(), 1, generator=gen).squeeze(1)
    # the kernel's buffer drains as uint16 for the 1000-id vocabulary (narrowed on the device), int32 for 151,936
    buf, ref = KeptIdBuffer(10_000_000, "cuda", vocab_size=vocab), KeptIdBuffer(10_000_000, "cuda")
    lp, total, start = reduce_rows(processed, sampled, logits, buf)
    lp_ref, total_ref, start_ref = reduce_rows_torch(processed, sampled, logits, ref)
    torch.testing.assert_close(lp, lp_ref, atol=2e-5, rtol=0)
    assert torch.equal(total, total_ref) and (start >= 0).all()
    assert (total > 64).any() and (total == 1).any()
    # the atomics hand out room in any order: compare each row's whole set
    got, asked = buf.drain()
    want, asked_ref = ref.drain()
    assert got.dtype == (np.uint16 if vocab <= 2**16 else np.int32)
    assert asked == asked_ref == int(total.sum())
    for r, (a, b) in enumerate(zip(_sets(got, total, start), _sets(want, total_ref, start_ref))):
        assert np.array_equal(a, b), r
        assert np.array_equal(a, torch.isfinite(processed[r].float()).nonzero().flatten().cpu().numpy()), r
    lp2, none_total, none_start = reduce_rows(processed, sampled, logits)
    assert none_total is None and none_start is None and torch.equal(lp2, lp)
    # a buffer too small: the rows that found it full are marked LOST, the others are whole. Room for the largest
    # set: whichever row reserves first fits (the atomics' order is the GPU's), later ones run out
    small = KeptIdBuffer(int(total.max()), "cuda")
    _, total, start = reduce_rows(processed, sampled, logits, small)
    data, asked = small.drain()
    assert (start == LOST).any() and (start >= 0).any() and asked == int(total.sum())
    assert int(total[start >= 0].sum()) <= small.capacity
    for r, ids in enumerate(_sets(data, total, start)):
        if ids is not None:
            assert np.array_equal(ids, torch.isfinite(processed[r].float()).nonzero().flatten().cpu().numpy()), r
