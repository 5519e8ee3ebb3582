"""The fused Triton reduction of rollout/kept_set.py against its torch reference, on a GPU (`-m gpu`)."""

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("triton")

from rollout.kept_set import reduce_rows, reduce_rows_torch  # noqa: E402
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
    lp, ids, total = reduce_rows(processed, sampled, K, logits)
    lp_ref, ids_ref, total_ref = reduce_rows_torch(processed, sampled, K, logits)
    torch.testing.assert_close(lp, lp_ref, atol=2e-5, rtol=0)
    assert torch.equal(total, total_ref) and torch.equal(ids, ids_ref)
    assert (total > K).any() and (total == 1).any()
    lp2, none_ids, _ = reduce_rows(processed, sampled, 0, logits)
    assert none_ids is None and torch.equal(lp2, lp)
