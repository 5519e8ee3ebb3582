"""Sequence packing (`trainer.pack_sequences`): samples back to back in one row, no padding. The logprobs, the
entropies, the replayed routes and the gradient must be those of the padded batch, on the real transformers
models (their attention sees `position_ids` restart and attends within each sample only), in float64."""

import numpy as np
import pytest
import torch

from rl.batching import micro_batches
from rl.losses import grpo_loss
from rl.models import load_causal_lm
from rl.trajectory import Trajectory, collate
from rollout.hf_engine import HFEngine
from rollout.sampling import SamplingParams
from trainer.forward import forward_logprobs, route_replay


def _samples(path: str, record_routes: bool) -> list[Trajectory]:
    """Real samples of different lengths (kept sets at top_p 0.9, routes on the MoE) from the transformers engine."""
    eng = HFEngine(path, record_routes=record_routes)
    prompts = [[1, 5, 9, 14], [3, 4, 8, 22, 7, 19, 30, 2, 11], [6, 2], [12, 13, 40, 41, 42, 43]]
    groups = eng.generate(prompts, SamplingParams(n=2, temperature=1.0, top_p=0.9, max_new_tokens=12, seed=5))
    out = []
    for i, (p, gens) in enumerate(zip(prompts, groups)):
        for j, g in enumerate(gens):
            t = Trajectory(uid=f"{i}-{j}", group_id=str(i), domain="math", prompt_ids=p, response_ids=g.response_ids,
                           inference_logprobs=g.inference_logprobs, kept_ids=g.kept_ids, kept_offsets=g.kept_offsets,
                           routed_experts=g.routed_experts)
            t.advantage = float(j) - 0.5 + 0.1 * i
            out.append(t)
    assert len({len(t.prompt_ids) + len(t.response_ids) for t in out}) > 2  # lengths differ: padding is real
    return out


def _run(model, trajs, packed: bool, replay: bool):
    batch = collate(trajs, pad_id=0, packed=packed)
    model.zero_grad()
    with route_replay(model, batch, replay) as rp:
        out = forward_logprobs(model, batch, temperature=1.0, with_entropy=True)
        loss, _ = grpo_loss(out.logprobs, batch.inference_logprobs.to(out.logprobs.dtype), None, batch.seq_index, batch.loss_mask,
                            batch.advantages, torch.zeros(len(trajs)), batch.opsm_delta, eps_low=0.2, eps_high=0.28,
                            norm_seqs=len(trajs), norm_tokens=int(batch.loss_mask.sum()))
        loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return out, grads, rp


@pytest.mark.parametrize("attn", ["sdpa", "varlen"])
@pytest.mark.parametrize("family", ["tiny_dense_path", "tiny_moe_path"])
def test_packed_batch_equals_the_padded_one(family, attn, request):
    path = request.getfixturevalue(family)
    moe = family == "tiny_moe_path"
    trajs = _samples(path, record_routes=moe)
    # float64 for the dense model; the MoE's grouped expert matmul runs in float32 only
    model = load_causal_lm(path, "float32", attn).train()
    model = model if moe else model.double()
    tol = 1e-5 if moe else 1e-10
    padded, g_pad, rp_pad = _run(model, trajs, packed=False, replay=moe)
    packed, g_pack, rp_pack = _run(model, trajs, packed=True, replay=moe)
    batch = collate(trajs, pad_id=0, packed=True)
    assert batch.input_ids.shape == (1, sum(len(t.prompt_ids) + len(t.response_ids) for t in trajs))
    assert batch.position_ids[0, len(trajs[0].prompt_ids) + len(trajs[0].response_ids)] == 0
    torch.testing.assert_close(packed.logprobs, padded.logprobs, rtol=0, atol=tol)
    torch.testing.assert_close(packed.entropy, padded.entropy, rtol=0, atol=tol)
    torch.testing.assert_close(g_pack, g_pad, rtol=tol * 10, atol=tol / 10)
    if moe:  # the same routes are replayed at the same positions, and the model's own choices agree as often
        assert rp_pack.total_count == rp_pad.total_count > 0 and rp_pack.mismatch_count == rp_pad.mismatch_count


@pytest.mark.parametrize("attn", ["sdpa", "varlen"])
@pytest.mark.parametrize("family", ["tiny_dense_path", "tiny_moe_path"])
def test_right_padded_rows_need_no_padding_mask(family, attn, request):
    """The padded batch is run without an attention mask (causal model, right padding): each sample's logprobs and
    entropies are the ones it gets alone in a batch of one, where there is no padding at all."""
    trajs = _samples(request.getfixturevalue(family), record_routes=False)
    moe = family == "tiny_moe_path"
    model = load_causal_lm(request.getfixturevalue(family), "float32", attn).eval()
    model, tol = (model, 1e-5) if moe else (model.double(), 1e-10)
    seen = []
    hook = model.get_decoder().register_forward_pre_hook(lambda _m, _a, kw: seen.append(kw.get("attention_mask")),
                                                         with_kwargs=True)
    together = forward_logprobs(model, collate(trajs, pad_id=0), temperature=1.0, with_entropy=True)
    hook.remove()
    assert seen == [None]  # no mask built (the masked kernels are slower), and still:
    alone = [forward_logprobs(model, collate([t], pad_id=0), temperature=1.0, with_entropy=True) for t in trajs]
    torch.testing.assert_close(together.logprobs, torch.cat([a.logprobs for a in alone]), rtol=0, atol=tol)
    torch.testing.assert_close(together.entropy, torch.cat([a.entropy for a in alone]), rtol=0, atol=tol)


def test_without_position_ids_samples_would_see_each_other(tiny_dense_path):
    """The check above can fail: one row with plain causal attention (no restart) gives other logprobs."""
    trajs = _samples(tiny_dense_path, record_routes=False)
    model = load_causal_lm(tiny_dense_path, "float32", "sdpa").double().eval()
    batch = collate(trajs, pad_id=0, packed=True)
    padded = forward_logprobs(model, collate(trajs, pad_id=0), temperature=1.0)
    batch.position_ids = torch.arange(batch.input_ids.shape[1])[None]
    leaky = forward_logprobs(model, batch, temperature=1.0)
    assert (leaky.logprobs - padded.logprobs).abs().max() > 1e-3


def test_varlen_attention_takes_the_batch_boundaries(tiny_dense_path, monkeypatch):
    """`model.attn_implementation=varlen` attends within the samples the batch's `cu_seqlens` name (built on the host
    by collate), not ones read back from the position ids: moving one boundary changes the logprobs, and the
    position-id fallback is never called."""
    from rl import attention

    trajs = _samples(tiny_dense_path, record_routes=False)
    model = load_causal_lm(tiny_dense_path, "float32", "varlen").double().eval()
    assert model.config._attn_implementation == "varlen"
    monkeypatch.setattr(attention, "_boundaries_from_positions", lambda *_: pytest.fail("boundaries read back"))
    batch = collate(trajs, pad_id=0, packed=True)
    assert batch.cu_seqlens.tolist() == [0, *np.cumsum([t.num_tokens for t in trajs])]
    assert batch.max_seqlen == max(t.num_tokens for t in trajs)
    padded = forward_logprobs(model, collate(trajs, pad_id=0), temperature=1.0)
    exact = forward_logprobs(model, batch, temperature=1.0)
    torch.testing.assert_close(exact.logprobs, padded.logprobs, rtol=0, atol=1e-10)
    batch.cu_seqlens = batch.cu_seqlens.clone()
    batch.cu_seqlens[2] += 1  # the third sample's first token now belongs to the second
    moved = forward_logprobs(model, batch, temperature=1.0)
    assert (moved.logprobs - padded.logprobs).abs().max() > 1e-3


def test_varlen_attention_reads_boundaries_from_position_ids(tiny_dense_path):
    """Called as TRL's padding-free collator calls a model (a packed row and its position ids, no boundaries), varlen
    attention finds the samples from the positions: the hidden states are each sample's own."""
    model = load_causal_lm(tiny_dense_path, "float32", "varlen").double().eval()
    ids = [torch.randint(3, 100, (n,)) for n in (5, 9, 3)]
    packed = torch.cat(ids)[None]
    positions = torch.cat([torch.arange(len(x)) for x in ids])[None]
    with torch.no_grad():
        together = model.model(input_ids=packed, position_ids=positions, use_cache=False).last_hidden_state[0]
        alone = torch.cat([model.model(input_ids=x[None], use_cache=False).last_hidden_state[0] for x in ids])
        torch.testing.assert_close(together, alone, rtol=0, atol=1e-10)
        leaky = model.model(input_ids=packed, use_cache=False).last_hidden_state[0]  # no positions: one sample
    assert (leaky - alone).abs().max() > 1e-3
    with torch.inference_mode():  # no version counter to cache by: read again, same answer
        again = model.model(input_ids=packed, position_ids=positions, use_cache=False).last_hidden_state[0]
    torch.testing.assert_close(again, together, rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="start at 3, not 0"):
        model.model(input_ids=packed[:, :7], position_ids=torch.arange(3, 10)[None], use_cache=False)
    from rl.config import varlen_attention

    # the trainer sizes packed forwards as unmasked only where the flash kernels run: a 16-bit model
    assert varlen_attention({"model": {"attn_implementation": "varlen", "dtype": "bfloat16"}})
    assert not varlen_attention({"model": {"attn_implementation": "varlen", "dtype": "float32"}})


def test_varlen_attention_refuses_what_it_does_not_compute():
    """A padding mask, a sliding window or a non-causal module get a clear error instead of a wrong answer."""
    from rl.attention import varlen_attention_forward

    q = torch.randn(2, 4, 6, 8)
    kv = torch.randn(2, 2, 6, 8)
    module = torch.nn.Module()
    module.is_causal = True
    out, _ = varlen_attention_forward(module, q, kv, kv, None)
    ref = torch.nn.functional.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, ref.transpose(1, 2))
    with pytest.raises(ValueError, match="attention mask"):
        varlen_attention_forward(module, q, kv, kv, torch.ones(2, 1, 6, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="sliding_window=4"):
        varlen_attention_forward(module, q, kv, kv, None, sliding_window=4)
    with pytest.raises(ValueError, match="one packed row"):
        varlen_attention_forward(module, q, kv, kv, None, cu_seq_lens_q=torch.tensor([0, 6, 12]), max_length_q=6)
    module.is_causal = False
    with pytest.raises(ValueError, match="causal only"):
        varlen_attention_forward(module, q, kv, kv, None)


def test_micro_batches_by_length_cut_padding():
    """Padded micro-batches: samples of similar length together (less padding); packed: near-equal token totals.
    Either way every sample is in exactly one of the n micro-batches."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(10, 2000, size=32)
    trajs = [Trajectory(uid=str(i), group_id="g", domain="d", prompt_ids=[1] * 5, response_ids=[2] * int(n),
                        inference_logprobs=[0.0] * int(n)) for i, n in enumerate(lengths)]
    size = lambda t: len(t.prompt_ids) + len(t.response_ids)  # noqa: E731
    padded_cost = lambda parts: sum(len(p) * max(map(size, p)) for p in parts)  # noqa: E731
    plain, by_len = micro_batches(trajs, 4), micro_batches(trajs, 4, layout="padded")
    packed = micro_batches(trajs, 4, layout="packed")
    for parts in (by_len, packed):
        assert len(parts) == 4 and sorted(t.uid for p in parts for t in p) == sorted(t.uid for t in trajs)
    assert padded_cost(by_len) < 0.8 * padded_cost(plain)
    totals = [sum(map(size, p)) for p in packed]
    assert max(totals) - min(totals) <= max(map(size, trajs))
