"""Chunked, masked token logprobs (rl/logprobs.py) against direct float64 references."""

import math

import numpy as np
import pytest
import torch

from rl.logprobs import token_logprobs, token_logprobs_from_logits

D = torch.float64


def _inputs(N=37, H=8, V=50, seed=0, dtype=D, bias=False):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=g, dtype=dtype).requires_grad_()
    weight = torch.randn(V, H, generator=g, dtype=dtype).requires_grad_()
    b = torch.randn(V, generator=g, dtype=dtype).requires_grad_() if bias else None
    targets = torch.randint(0, V, (N,), generator=g)
    # Kept sets of varying size, including empty ones and some that already contain the target.
    sets = []
    for j in range(N):
        k = int(torch.randint(0, 7, (1,), generator=g))
        ids = torch.randperm(V, generator=g)[:k].tolist()
        if j % 3 == 0 and k > 0:
            ids[0] = int(targets[j])
        sets.append(sorted(set(ids)))
    if N > 1:
        sets[1] = []  # at least one empty set
    kept_ids = torch.tensor([i for s in sets for i in s], dtype=torch.int32)
    kept_offsets = torch.tensor(np.concatenate([[0], np.cumsum([len(s) for s in sets])]), dtype=torch.long)
    return hidden, weight, b, targets, sets, kept_ids, kept_offsets


def _loop_reference(hidden, weight, bias, targets, sets, temperature):
    """Python loop over positions, float64 math.log/exp; sets=None means the full vocabulary."""
    h, w = hidden.detach().double().numpy(), weight.detach().double().numpy()
    z = h @ w.T + (bias.detach().double().numpy() if bias is not None else 0.0)
    z = z / temperature
    logp, ent = [], []
    for j in range(len(targets)):
        tgt = int(targets[j])
        ids = list(range(z.shape[1])) if sets is None else sorted(set(sets[j]) | {tgt})
        m = max(z[j, i] for i in ids)
        lse = m + math.log(sum(math.exp(z[j, i] - m) for i in ids))
        logp.append(z[j, tgt] - lse)
        ent.append(-sum(math.exp(z[j, i] - lse) * (z[j, i] - lse) for i in ids))
    return np.array(logp), np.array(ent)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("chunk_size", [1, 5, 16, 37, 1000])
def test_values_against_loop(masked, chunk_size):
    hidden, weight, _, targets, sets, kept_ids, kept_offsets = _inputs()
    kw = dict(kept_ids=kept_ids, kept_offsets=kept_offsets) if masked else {}
    logp, ent, _ = token_logprobs(hidden, weight, targets, temperature=0.7, chunk_size=chunk_size, with_entropy=True, **kw)
    want_logp, want_ent = _loop_reference(hidden, weight, None, targets, sets if masked else None, 0.7)
    assert logp.dtype == D and ent.dtype == D and not ent.requires_grad
    np.testing.assert_allclose(logp.detach().numpy(), want_logp, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ent.numpy(), want_ent, rtol=1e-10, atol=1e-12)
    if masked:
        assert logp[1].item() == 0.0 and ent[1].item() == 0.0  # empty kept set: only the target remains


def test_masked_differs_from_full_and_temperature_matters():
    hidden, weight, _, targets, _, kept_ids, kept_offsets = _inputs()
    full, *_ = token_logprobs(hidden, weight, targets)
    masked, *_ = token_logprobs(hidden, weight, targets, kept_ids=kept_ids, kept_offsets=kept_offsets)
    hot, *_ = token_logprobs(hidden, weight, targets, temperature=2.0)
    assert (masked >= full - 1e-12).all() and (masked > full + 1e-6).any()  # renormalising over fewer ids
    assert not torch.allclose(hot, full)


def test_bias_and_from_logits_helper():
    hidden, weight, bias, targets, sets, kept_ids, kept_offsets = _inputs(bias=True)
    logp, ent, _ = token_logprobs(
        hidden, weight, targets, lm_bias=bias, temperature=1.3, kept_ids=kept_ids, kept_offsets=kept_offsets,
        chunk_size=6, with_entropy=True,
    )
    logits = (hidden @ weight.T + bias) / 1.3
    ref_logp, ref_ent = token_logprobs_from_logits(logits, targets, kept_ids=kept_ids, kept_offsets=kept_offsets)
    want_logp, want_ent = _loop_reference(hidden, weight, bias, targets, sets, 1.3)
    np.testing.assert_allclose(ref_logp.detach().numpy(), want_logp, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ref_ent.numpy(), want_ent, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(logp, ref_logp, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gradients_match_naive(masked, with_bias):
    hidden, weight, bias, targets, _, kept_ids, kept_offsets = _inputs(bias=with_bias)
    kw = dict(kept_ids=kept_ids, kept_offsets=kept_offsets) if masked else {}
    coeff = torch.randn(hidden.shape[0], generator=torch.Generator().manual_seed(5), dtype=D)
    logp, *_ = token_logprobs(hidden, weight, targets, lm_bias=bias, temperature=0.8, chunk_size=7, **kw)
    params = [hidden, weight] + ([bias] if with_bias else [])
    got = torch.autograd.grad((coeff * logp).sum(), params)
    logits = hidden @ weight.T + (bias if with_bias else 0.0)
    naive, _ = token_logprobs_from_logits(logits / 0.8, targets, **kw)
    want = torch.autograd.grad((coeff * naive).sum(), params)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_gradcheck_masked():
    hidden, weight, bias, targets, _, kept_ids, kept_offsets = _inputs(N=9, H=3, V=11, bias=True)
    fn = lambda h, w, b: token_logprobs(  # noqa: E731
        h, w, targets, lm_bias=b, temperature=0.9, kept_ids=kept_ids, kept_offsets=kept_offsets, chunk_size=4
    )[0]
    assert torch.autograd.gradcheck(fn, (hidden, weight, bias))


def test_empty_input():
    hidden, weight, _, _, _, _, _ = _inputs(N=0)
    targets = torch.zeros(0, dtype=torch.long)
    logp, ent, _ = token_logprobs(hidden, weight, targets, with_entropy=True)
    assert logp.shape == (0,) and ent.shape == (0,)
    empty_ids, empty_offsets = torch.zeros(0, dtype=torch.int32), torch.zeros(1, dtype=torch.long)
    logp_m, *_ = token_logprobs(hidden, weight, targets, kept_ids=empty_ids, kept_offsets=empty_offsets)
    assert logp_m.shape == (0,)
    gh, gw = torch.autograd.grad(logp.sum() + logp_m.sum(), (hidden, weight))
    assert gh.shape == hidden.shape and (gw == 0).all()


def test_low_precision_inputs_give_float32_close_to_float64():
    hidden, weight, _, targets, _, kept_ids, kept_offsets = _inputs(N=20, H=16, V=64)
    kw = dict(kept_ids=kept_ids, kept_offsets=kept_offsets, chunk_size=8)
    ref, *_ = token_logprobs(hidden, weight, targets, **kw)
    h16, w16 = hidden.detach().bfloat16().requires_grad_(), weight.detach().bfloat16().requires_grad_()
    logp, *_ = token_logprobs(h16, w16, targets, **kw)
    assert logp.dtype == torch.float32
    torch.testing.assert_close(logp.double(), ref.detach(), rtol=0, atol=0.3)
    gh, gw = torch.autograd.grad(logp.sum(), (h16, w16))
    assert gh.dtype == torch.bfloat16 and gw.dtype == torch.bfloat16 and torch.isfinite(gw.float()).all()


def test_bad_mask_arguments():
    hidden, weight, _, targets, _, kept_ids, kept_offsets = _inputs()
    with pytest.raises(ValueError):
        token_logprobs(hidden, weight, targets, kept_ids=kept_ids)
    with pytest.raises(ValueError):
        token_logprobs(hidden, weight, targets, kept_ids=kept_ids, kept_offsets=kept_offsets[:-1])


def test_full_vocabulary_entropy_beside_the_kept_set_one():
    hidden, weight, _, targets, _, kept_ids, kept_offsets = _inputs(N=12, H=5, V=17, bias=False)
    logp, ent, full = token_logprobs(hidden, weight, targets, temperature=0.7, kept_ids=kept_ids,
                                     kept_offsets=kept_offsets, chunk_size=5, with_entropy=True)
    logits = (hidden @ weight.T / 0.7).detach()
    _, want_kept = token_logprobs_from_logits(logits, targets, kept_ids=kept_ids, kept_offsets=kept_offsets)
    _, want_full = token_logprobs_from_logits(logits, targets)
    torch.testing.assert_close(ent, want_kept, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(full, want_full, rtol=1e-10, atol=1e-12)
    assert not torch.allclose(full, ent)
    _, ent_nomask, full_nomask = token_logprobs(hidden, weight, targets, with_entropy=True)
    assert full_nomask is ent_nomask  # without kept sets the two are the same distribution


# --------------------------------------------------------------------------- support-only head (issue 16)
@pytest.mark.parametrize("V, chunk_size", [(400, 4), (400, 1000), (50, 7)])  # (50, 7): most chunks use the whole head
@pytest.mark.parametrize("with_bias", [False, True])
def test_support_head_equals_the_dense_head(V, chunk_size, with_bias):
    """log pi over the kept ids only, computed on the chunk's support U: values, kept-set entropy and the
    gradients of hidden, weight and bias equal the dense masked head in float64."""
    from rl.logprobs import support_columns

    hidden, weight, bias, targets, sets, kept_ids, kept_offsets = _inputs(N=37, H=8, V=V, bias=with_bias)
    kw = dict(kept_ids=kept_ids, kept_offsets=kept_offsets, lm_bias=bias, temperature=0.7, chunk_size=chunk_size,
              with_entropy=True)
    coeff = torch.randn(hidden.shape[0], generator=torch.Generator().manual_seed(3), dtype=D)
    params = [hidden, weight] + ([bias] if with_bias else [])
    dense = token_logprobs(hidden, weight, targets, **kw)
    sparse = token_logprobs(hidden, weight, targets, support_head=True, **kw)
    torch.testing.assert_close(sparse[0], dense[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(sparse[1], dense[1], rtol=0, atol=1e-12)
    for a, b in zip(torch.autograd.grad((coeff * sparse[0]).sum(), params),
                    torch.autograd.grad((coeff * dense[0]).sum(), params)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    want, _ = _loop_reference(hidden, weight, bias, targets, sets, 0.7)
    np.testing.assert_allclose(sparse[0].detach().numpy(), want, rtol=0, atol=1e-10)
    # the full-vocabulary entropy (a metric) at every 8th position, NaN elsewhere
    sampled = ~torch.isnan(sparse[2])
    assert sampled.tolist() == [j % 8 == 0 for j in range(37)]
    torch.testing.assert_close(sparse[2][sampled], dense[2][sampled], rtol=0, atol=1e-12)
    # both code paths ran: a chunk's own support (4 rows of a 400 vocabulary), the whole head (the support of
    # all 37 rows is over half of a 50 vocabulary)
    ids, offsets = kept_ids, kept_offsets
    assert support_columns(ids, offsets, targets, 0, 4, 400)[0] is not None
    assert support_columns(ids, offsets, targets, 0, 37, 50)[0] is None


def test_support_head_gradcheck():
    hidden, weight, bias, targets, _, kept_ids, kept_offsets = _inputs(N=9, H=3, V=80, bias=True)
    fn = lambda h, w, b: token_logprobs(  # noqa: E731
        h, w, targets, lm_bias=b, temperature=0.9, kept_ids=kept_ids, kept_offsets=kept_offsets, chunk_size=2,
        support_head=True)[0]
    assert torch.autograd.gradcheck(fn, (hidden, weight, bias))


# --------------------------------------------------------------------------- the compiled dense head (issue 16)
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_compiled_head_equals_the_eager_one(masked, with_bias):
    """trainer.compile: the dense head's per-chunk softmax statistics and logit gradient through torch.compile
    (rl.logprobs._fused_forward/_fused_backward) give the eager head's logprobs, both entropies and gradients in
    float64, over chunks of two lengths (one dynamic-shape graph)."""
    hidden, weight, bias, targets, sets, kept_ids, kept_offsets = _inputs(N=37, H=8, V=50, bias=with_bias)
    kw = dict(lm_bias=bias, temperature=0.7, chunk_size=16, with_entropy=True)
    if masked:
        kw.update(kept_ids=kept_ids, kept_offsets=kept_offsets)
    coeff = torch.randn(hidden.shape[0], generator=torch.Generator().manual_seed(4), dtype=D)
    params = [hidden, weight] + ([bias] if with_bias else [])
    eager = token_logprobs(hidden, weight, targets, **kw)
    fused = token_logprobs(hidden, weight, targets, compiled=True, **kw)
    for a, b in zip(fused, eager):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    for a, b in zip(torch.autograd.grad((coeff * fused[0]).sum(), params),
                    torch.autograd.grad((coeff * eager[0]).sum(), params)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    want, want_ent = _loop_reference(hidden, weight, bias, targets, sets if masked else None, 0.7)
    np.testing.assert_allclose(fused[0].detach().numpy(), want, rtol=0, atol=1e-10)
    np.testing.assert_allclose(fused[1].numpy(), want_ent, rtol=0, atol=1e-10)


@pytest.mark.parametrize("dtype, offset", [(torch.bfloat16, 0.0), (torch.float32, 30.0)])
def test_compiled_head_in_low_precision_stays_close_to_float64(dtype, offset):
    """The fused entropy (taken relative to the row's max) and statistics from bf16 / fp32 logits, also when the
    logits are large (a bias of 30 on every id): as close to float64 as the eager head's."""
    hidden, weight, _, targets, _, kept_ids, kept_offsets = _inputs(N=40, H=16, V=300)
    bias = torch.full((300,), offset, dtype=D)
    kw = dict(temperature=0.7, chunk_size=16, with_entropy=True, kept_ids=kept_ids, kept_offsets=kept_offsets)
    exact = token_logprobs(hidden, weight, targets, lm_bias=bias, **kw)
    low = [token_logprobs(hidden.detach().to(dtype), weight.detach().to(dtype), targets, lm_bias=bias.to(dtype),
                          compiled=c, **kw) for c in (False, True)]
    for k in range(3):
        err_eager = (low[0][k].double() - exact[k]).abs().max()
        err_fused = (low[1][k].double() - exact[k]).abs().max()
        assert low[1][k].dtype == torch.float32 and err_fused <= max(2 * err_eager, 1e-5), k


def test_add_outer_sums_chunks_into_the_float32_gradient():
    """The head's weight gradient over chunks (acc += dz^T h per chunk): float64 inputs exactly, bf16 inputs into a
    float32 sum (CPU: the widened-product fallback)."""
    from rl.logprobs import add_outer

    g = torch.Generator().manual_seed(3)
    dz = [torch.randn(16, 40, generator=g, dtype=D) for _ in range(3)]
    h = [torch.randn(16, 8, generator=g, dtype=D) for _ in range(3)]
    want = sum(a.t() @ b for a, b in zip(dz, h))
    acc = torch.zeros(40, 8, dtype=D)
    for a, b in zip(dz, h):
        add_outer(acc, a, b)
    torch.testing.assert_close(acc, want, rtol=0, atol=1e-12)
    acc32 = torch.zeros(40, 8, dtype=torch.float32)
    for a, b in zip(dz, h):
        add_outer(acc32, a.bfloat16(), b.bfloat16())
    assert acc32.dtype == torch.float32
    torch.testing.assert_close(acc32.double(), want, rtol=0.05, atol=0.1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_add_outer_accumulates_inside_the_gemm_on_cuda():
    """On CUDA the bf16 GEMM adds into the float32 sum itself (torch.addmm out_dtype): no bf16 partial product, so
    the sum of many chunks stays as close to float64 as float32 allows; the fallback rounds every partial to bf16."""
    import rl.logprobs as lp

    g = torch.Generator(device="cuda").manual_seed(0)
    V, H, c, chunks = 4096, 256, 1024, 8
    dz = [torch.randn(c, V, generator=g, device="cuda").bfloat16() for _ in range(chunks)]
    h = [torch.randn(c, H, generator=g, device="cuda").bfloat16() for _ in range(chunks)]
    want = sum(a.double().t() @ b.double() for a, b in zip(dz, h))
    errors = {}
    for mixed in (True, False):
        lp._MIXED_ADDMM[0] = mixed
        acc = torch.zeros(V, H, device="cuda")
        for a, b in zip(dz, h):
            lp.add_outer(acc, a, b)
        errors[mixed] = float((acc.double() - want).abs().max() / want.abs().max())
        if mixed:
            assert lp._MIXED_ADDMM[0], "torch.addmm(out_dtype=float32) was refused on this GPU"
    lp._MIXED_ADDMM[0] = True
    assert errors[True] < 1e-5 < errors[False], errors


# --------------------------------------------------------------------------- issue 41
def _hand_masked_logp(hidden, weight, bias, targets, sets, temperature):
    """Dense autograd reference, the kept-set mask built here by hand: z = (h W^T + b) / T, -inf outside
    K_t u {o_t}, log_softmax, the target's entry."""
    z = hidden @ weight.T
    if bias is not None:
        z = z + bias
    z = z / temperature
    keep = torch.zeros(z.shape, dtype=torch.bool)
    for j, ids in enumerate(sets):
        keep[j, list(ids) + [int(targets[j])]] = True
    return torch.log_softmax(z.masked_fill(~keep, float("-inf")), dim=-1).gather(1, targets[:, None]).squeeze(1)


def test_support_head_whole_head_chunk_with_bias(monkeypatch):
    """The support head on chunks whose kept ids cover over half the vocabulary (it then uses the whole head and
    adds dz.sum(0) to the bias gradient) beside chunks on their own support: values and the gradients of hidden,
    weight and bias against dense float64 autograd; forward and backward both take the whole head on the first
    two chunks (seen through support_columns, which they call with the vocabulary size)."""
    import rl.logprobs as lp
    from rl.logprobs import support_columns

    taken = []  # (chunk start, vocabulary size passed, what support_columns returned)

    def spy(*a):
        taken.append((a[3], a[5], support_columns(*a)))
        return taken[-1][2]

    monkeypatch.setattr(lp, "support_columns", spy)

    g = torch.Generator().manual_seed(11)
    N, H, V, chunk = 10, 6, 40, 4
    hidden = torch.randn(N, H, generator=g, dtype=D, requires_grad=True)
    weight = torch.randn(V, H, generator=g, dtype=D, requires_grad=True)
    bias = torch.randn(V, generator=g, dtype=D, requires_grad=True)
    targets = torch.randint(0, V, (N,), generator=g)
    # rows 0-7 (chunks 0 and 1) keep 25 of 40 ids: the whole head; rows 8-9 keep 3: their own support
    sets = [sorted(torch.randperm(V, generator=g)[: 25 if j < 8 else 3].tolist()) for j in range(N)]
    kept_ids = torch.tensor([i for s in sets for i in s], dtype=torch.int32)
    kept_offsets = torch.tensor(np.concatenate([[0], np.cumsum([len(s) for s in sets])]), dtype=torch.long)
    assert [support_columns(kept_ids, kept_offsets, targets, s, min(s + chunk, N), V)[0] is None
            for s in range(0, N, chunk)] == [True, True, False]
    coeff = torch.randn(N, generator=g, dtype=D)
    logp, *_ = token_logprobs(hidden, weight, targets, lm_bias=bias, temperature=0.7, kept_ids=kept_ids,
                              kept_offsets=kept_offsets, chunk_size=chunk, support_head=True)
    want = _hand_masked_logp(hidden, weight, bias, targets, sets, 0.7)
    torch.testing.assert_close(logp, want, rtol=0, atol=1e-12)
    got = torch.autograd.grad((coeff * logp).sum(), (hidden, weight, bias), retain_graph=True)
    ref = torch.autograd.grad((coeff * want).sum(), (hidden, weight, bias), retain_graph=True)
    for name, a, b in zip(("hidden", "weight", "bias"), got, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)
    assert [(s, vocab, cols[0] is None) for s, vocab, cols in taken] == [
        (0, V, True), (4, V, True), (8, V, False)] * 2  # forward, then backward
    # only the bias gradient: the whole-head chunks alone (coefficients 0 on rows 8-9)
    coeff[8:] = 0
    (gb,) = torch.autograd.grad((coeff * logp).sum(), bias)
    (wb,) = torch.autograd.grad((coeff * want).sum(), bias)
    torch.testing.assert_close(gb, wb, rtol=1e-10, atol=1e-12)


def test_token_logprobs_defaults():
    """token_logprobs(hidden, weight, targets) with every default: temperature 1, no entropy (None, None), the
    eager dense head (not torch.compile'd); with kept sets and only with_entropy given, the dense head (the full-
    vocabulary entropy at every position, not the support head's NaNs between strided positions). Against
    log_softmax(h W^T) computed here."""
    import rl.logprobs as lp

    hidden, weight, _, targets, sets, kept_ids, kept_offsets = _inputs(N=21, H=5, V=30)
    z = hidden @ weight.T
    want = torch.log_softmax(z, dim=-1).gather(1, targets[:, None]).squeeze(1)

    def refuse(fn):
        raise AssertionError("the default head must not go through torch.compile")

    saved, lp._compiled = lp._compiled, refuse
    try:
        out = token_logprobs(hidden, weight, targets)
        masked = token_logprobs(hidden, weight, targets, kept_ids=kept_ids, kept_offsets=kept_offsets,
                                with_entropy=True)
        (gh,) = torch.autograd.grad(out[0].sum(), hidden)  # the backward is eager too
    finally:
        lp._compiled = saved
    assert out[1] is None and out[2] is None
    torch.testing.assert_close(out[0], want, rtol=0, atol=1e-12)
    (wh,) = torch.autograd.grad(want.sum(), hidden)
    torch.testing.assert_close(gh, wh, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(masked[0], _hand_masked_logp(hidden, weight, None, targets, sets, 1.0), rtol=0,
                               atol=1e-12)
    p = torch.softmax(z.detach(), dim=-1)
    full = -(p * p.log()).sum(-1)
    assert not torch.isnan(masked[2]).any()
    torch.testing.assert_close(masked[2], full, rtol=0, atol=1e-12)


def test_kept_matrix_marks_the_kept_ids_by_default_and_the_rest_when_inverted():
    """kept_matrix (used without invert by benchmarks/logprob_memory.py): True at each row's kept ids and its
    target by default; invert=True is the exact complement."""
    from rl.logprobs import kept_matrix

    _, _, _, targets, sets, kept_ids, kept_offsets = _inputs(N=9, H=2, V=12)
    want = torch.zeros(7, 12, dtype=torch.bool)
    for r, j in enumerate(range(2, 9)):
        want[r, sets[j] + [int(targets[j])]] = True
    assert torch.equal(kept_matrix(kept_ids, kept_offsets, targets, 2, 9, 12), want)
    assert torch.equal(kept_matrix(kept_ids, kept_offsets, targets, 2, 9, 12, invert=True), ~want)


@pytest.mark.parametrize("support_head", [False, True])
def test_the_full_vocabulary_entropy_pass_runs_only_when_it_is_asked_for(support_head, monkeypatch):
    """The full-vocabulary entropy costs a dense pass over the logits: it runs only with with_entropy=True and
    kept sets (without kept sets it is the kept-set entropy itself)."""
    import rl.logprobs as lp

    hidden, weight, _, targets, _, kept_ids, kept_offsets = _inputs(N=12, H=4, V=20)
    calls = []
    real = lp._entropy
    monkeypatch.setattr(lp, "_entropy", lambda z: calls.append(z.shape) or real(z))
    masked = dict(kept_ids=kept_ids, kept_offsets=kept_offsets, support_head=support_head)
    token_logprobs(hidden, weight, targets, with_entropy=False, **masked)
    token_logprobs(hidden, weight, targets, with_entropy=True, support_head=support_head)
    assert calls == []
    token_logprobs(hidden, weight, targets, with_entropy=True, **masked)
    assert calls


def test_chunk_sizes(monkeypatch):
    """The dense head works in chunks of chunk_size positions (default 1024); the support head in chunks of at most
    SUPPORT_CHUNK = 256 (benchmarks/README.md: on real kept sets 256 positions need about half the vocabulary), or
    of chunk_size when that is smaller; chunk_size < 1 is refused."""
    import rl.logprobs as lp

    hidden, weight, _, targets, _, kept_ids, kept_offsets = _inputs(N=1100, H=3, V=8)
    dense, support = [], []
    real_dense, real_support = lp._logits_chunk, lp.support_columns
    monkeypatch.setattr(lp, "_logits_chunk", lambda *a: dense.append((a[5], a[6])) or real_dense(*a))
    monkeypatch.setattr(lp, "support_columns", lambda *a: support.append((a[3], a[4])) or real_support(*a))
    masked = dict(kept_ids=kept_ids, kept_offsets=kept_offsets)
    token_logprobs(hidden, weight, targets, **masked)
    assert dense == [(0, 1024), (1024, 1100)]
    assert lp.SUPPORT_CHUNK == 256
    token_logprobs(hidden, weight, targets, support_head=True, **masked)
    assert support == [(s, min(s + 256, 1100)) for s in range(0, 1100, 256)]
    support.clear()
    token_logprobs(hidden[:250], weight, targets[:250], support_head=True, chunk_size=100, kept_ids=kept_ids,
                   kept_offsets=kept_offsets[:251])
    assert support == [(0, 100), (100, 200), (200, 250)]
    for bad in (0, -1):
        with pytest.raises(ValueError, match="chunk_size must be >= 1"):
            token_logprobs(hidden, weight, targets, chunk_size=bad)


def test_support_head_uses_the_whole_head_only_over_half_the_vocabulary():
    """support_columns returns the chunk's sorted support U while it holds at most half the vocabulary
    (|U| <= V // 2) and None (the whole head) above."""
    from rl.logprobs import support_columns

    V = 40
    for n_ids, whole in ((20, False), (21, True)):
        ids = torch.arange(n_ids - 1, dtype=torch.int32)  # one row: n_ids - 1 kept ids and the target
        targets = torch.tensor([V - 1])
        U, *_ = support_columns(ids, torch.tensor([0, n_ids - 1]), targets, 0, 1, V)
        assert (U is None) == whole
        if not whole:
            assert U.tolist() == list(range(n_ids - 1)) + [V - 1]


def test_add_outer_on_cpu_leaves_the_mixed_gemm_alone(caplog):
    """On CPU the weight gradient never tries torch.addmm(out_dtype=) (a CUDA kernel): no warning, and the switch
    that turns the mixed GEMM off for good stays on for a GPU in the same process."""
    import rl.logprobs as lp

    acc = torch.zeros(6, 3)
    with caplog.at_level("WARNING", logger="rl.logprobs"):
        lp.add_outer(acc, torch.randn(4, 6).bfloat16(), torch.randn(4, 3).bfloat16())
    assert lp._MIXED_ADDMM == [True] and not caplog.records


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("chunk_size", [1, 6, 1000])
def test_temperature_one_values_entropy_and_gradients(masked, chunk_size):
    """Temperature 1 (SFT's, and greedy sampling's): the head skips dividing the logits by it, builds the entropy in
    place from exp(z - max) (log(total) - sum(e log e) / total) and adds each row's target term with one scatter.
    Values, entropy and gradients against the float64 references, on rows as peaked as a trained model's (logits
    x 40: entropies near 0) and flat ones (all logits equal: the entropy log V, or log |K| within a kept set)."""
    hidden, weight, _, targets, sets, kept_ids, kept_offsets = _inputs(N=23, H=6, V=40)
    with torch.no_grad():
        hidden[::4] *= 40.0
        hidden[1::4] = 0.0
    kw = dict(kept_ids=kept_ids, kept_offsets=kept_offsets) if masked else {}
    logp, ent, _ = token_logprobs(hidden, weight, targets, chunk_size=chunk_size, with_entropy=True, **kw)
    want_logp, want_ent = _loop_reference(hidden, weight, None, targets, sets if masked else None, 1.0)
    np.testing.assert_allclose(logp.detach().numpy(), want_logp, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ent.numpy(), want_ent, rtol=1e-10, atol=1e-12)
    assert (ent >= 0).all()
    if not masked:  # (a kept set can hold two near-tied ids)
        assert ent[::4].max() < 0.1
        np.testing.assert_allclose(ent[1::4].numpy(), math.log(40), rtol=1e-12)
    coeff = torch.randn(hidden.shape[0], generator=torch.Generator().manual_seed(3), dtype=D)
    got = torch.autograd.grad((coeff * logp).sum(), (hidden, weight))
    naive, _ = token_logprobs_from_logits(hidden @ weight.T, targets, **kw)
    want = torch.autograd.grad((coeff * naive).sum(), (hidden, weight))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
