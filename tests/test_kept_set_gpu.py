"""The fused Triton reduction of rollout/kept_set.py against its torch reference, on a GPU (`-m gpu`)."""

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("triton")

import numpy as np  # noqa: E402

from rollout.kept_set import OverflowBuffer, complete_sets, reduce_rows, reduce_rows_torch  # noqa: E402
from rollout.sampling import process_logits  # noqa: E402


@pytest.mark.parametrize("dtype, logits", [(torch.bfloat16, True), (torch.float32, False), (torch.float32, True)])
@pytest.mark.parametrize("vocab", [151936, 1000])
def test_kernel_matches_torch(dtype, logits, vocab):
    gen = torch.Generator(device="cuda").manual_seed(0)
    raw = torch.randn(257, vocab, device="cuda", generator=gen) * 4
    rows = []
    for r in range(raw.shape[0]):  # top-k / top-p mixes: some rows keep 1 id, some more than K
        top_k, top_p = [(64, 0.95), (0, 0.9), (1, 1.0), (200, 1.0), (8, 0.5)][r % 5]
        rows.append(process_logits(raw[r : r + 1], 1.0, top_k, top_p))
    logprobs = torch.cat(rows)
    processed = (logprobs + 3.0 if logits else logprobs).to(dtype)
    sampled = torch.multinomial(logprobs.exp(), 1, generator=gen).squeeze(1)
    K = 65
    lp, ids, total, base = reduce_rows(processed, sampled, K, logits)
    lp_ref, ids_ref, total_ref, _ = reduce_rows_torch(processed, sampled, K, logits)
    torch.testing.assert_close(lp, lp_ref, atol=2e-5, rtol=0)
    assert torch.equal(total, total_ref) and torch.equal(ids, ids_ref) and (base == -1).all()
    assert (total > K).any() and (total == 1).any()
    lp2, none_ids, *_ = reduce_rows(processed, sampled, 0, logits)
    assert none_ids is None and torch.equal(lp2, lp)
    # With an overflow buffer every set is whole (the atomics hand out room in any order: compare whole sets)
    ovf = OverflowBuffer(10_000_000, "cuda")
    _, ids, total, base = reduce_rows(processed, sampled, K, logits, ovf)
    data, asked = ovf.drain()
    valid = ids >= 0
    flat, count = complete_sets(ids[valid].cpu().numpy(), valid.sum(1).cpu().numpy(), total.cpu().numpy(),
                                base.cpu().numpy(), data, K)
    assert asked == int((total - K).clamp(min=0).sum()) and (base >= 0).sum() == (total > K).sum()
    offsets = np.concatenate([[0], np.cumsum(count)])
    finite = torch.isfinite(processed.float())
    for r in range(processed.shape[0]):
        want = finite[r].nonzero().flatten().cpu().numpy()
        assert np.array_equal(flat[offsets[r] : offsets[r + 1]], want), r
    # a buffer too small: the rows that found it full are marked lost (-2) and keep only their inline ids
    small = OverflowBuffer(1000, "cuda")
    _, _, total, base = reduce_rows(processed, sampled, K, logits, small)
    assert ((base == -2) <= (total > K)).all() and (base == -2).any()
    assert small.drain()[1] == int((total - K).clamp(min=0).sum())
