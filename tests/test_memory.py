"""rl/memory.py: the activation estimate behind trainer.gradient_checkpointing=auto, against what autograd really
saves (saved_tensors_hooks, each storage once, parameters excluded) on small bf16 models of three families; the
no-grad forward's estimate (the reference's micro-batches) against the peak of the tensors a forward allocates."""

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers import AutoConfig, AutoModelForCausalLM

from rl.memory import activation_bytes, forward_bytes, micro_batch_tokens, should_checkpoint
from rl.trajectory import Trajectory

SHAPES = {
    "qwen3": dict(model_type="qwen3", hidden_size=256, intermediate_size=768, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, vocab_size=1000),
    "qwen3-wide-mlp": dict(model_type="qwen3", hidden_size=256, intermediate_size=2048, num_attention_heads=8,
                           num_key_value_heads=2, head_dim=64, vocab_size=1000),
    "llama": dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                  num_key_value_heads=3, vocab_size=1000),
    "qwen3-moe": dict(model_type="qwen3_moe", hidden_size=256, intermediate_size=768, moe_intermediate_size=128,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_experts=8, num_experts_per_tok=2,
                      vocab_size=1000, mlp_only_layers=[], decoder_sparse_step=1),
}
TOKENS = 256


def _saved_bytes(config, checkpointing: bool) -> int:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.config.use_cache = False
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    ids = torch.randint(0, config.vocab_size, (2, TOKENS // 2))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.model(input_ids=ids)  # the body: the LM head is estimated separately (chunked log-softmax)
    return sum(saved.values())


@pytest.mark.parametrize("name", list(SHAPES))
def test_estimate_matches_what_autograd_saves(name):
    config = AutoConfig.for_model(**SHAPES[name], num_hidden_layers=4)
    measured = _saved_bytes(config, checkpointing=False)
    estimate = activation_bytes(config, TOKENS, dtype_bytes=2, head_chunk=0)
    assert 0.85 < estimate / measured < 1.15, (estimate, measured)
    # with checkpointing: the layer inputs, plus one layer recomputed in backward (not saved in forward)
    measured_ckpt = _saved_bytes(config, checkpointing=True)
    estimate_ckpt = activation_bytes(config, TOKENS, dtype_bytes=2, checkpointing=True, head_chunk=0)
    assert measured_ckpt <= estimate_ckpt < estimate
    assert measured_ckpt < measured / 3


class LiveBytes(TorchDispatchMode):
    """The peak bytes of the storages ops allocate while the mode is on (the tensors that existed before, such as
    parameters and inputs, are not counted): a storage counts from the op that made it until the last tensor on it,
    views included, is gone."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.refs: dict[int, list[int]] = {}  # storage -> [tensors alive on it, bytes]

    def _gone(self, key: int) -> None:
        ref = self.refs[key]
        ref[0] -= 1
        if ref[0] == 0:
            self.live -= ref[1]
            del self.refs[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.untyped_storage().nbytes() == 0:
                continue
            key = t.untyped_storage().data_ptr()
            if key not in self.refs:
                if key in before:
                    continue  # a view of a tensor from outside (a parameter, the input)
                self.refs[key] = [0, t.untyped_storage().nbytes()]
                self.live += self.refs[key][1]
                self.peak = max(self.peak, self.live)
            self.refs[key][0] += 1
            weakref.finalize(t, self._gone, key)
        return out


def _scoring_forward_peak(config, tokens: int) -> int:
    """Peak bytes the reference's scoring forward allocates (`trainer.forward.forward_logprobs` as FrozenModel runs
    it: eval mode, no grad, the model's own use_cache setting left as loaded) over two padded rows of tokens/2."""
    from rl.trajectory import Trajectory, collate
    from trainer.forward import forward_logprobs

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    half = tokens // 2
    trajs = [Trajectory(uid=str(i), group_id="g", domain="d", prompt_ids=torch.randint(0, 1000, (8,)).numpy(),
                        response_ids=torch.randint(0, 1000, (half - 8,)).numpy(),
                        inference_logprobs=torch.zeros(half - 8).numpy()) for i in range(2)]
    batch = collate(trajs, pad_id=0)
    with torch.no_grad(), LiveBytes() as mode:
        forward_logprobs(model, batch, temperature=1.0, chunk_size=64)
    return mode.peak


@pytest.mark.parametrize("name", ["qwen3", "qwen3-wide-mlp", "llama", "qwen3-moe"])
def test_forward_estimate_covers_a_no_grad_forward(name):
    """The reference's forward keeps nothing from one layer to the next (no autograd, no KV cache): its peak does not
    grow with the depth, and the estimate covers it (with room: about half is used) at a fraction of what training
    keeps."""
    config = AutoConfig.for_model(**SHAPES[name], num_hidden_layers=4)
    deeper = AutoConfig.for_model(**SHAPES[name], num_hidden_layers=12)
    for tokens in (256, 1024):
        peak, peak_deeper = _scoring_forward_peak(config, tokens), _scoring_forward_peak(deeper, tokens)
        estimate = forward_bytes(config, tokens, dtype_bytes=2, head_chunk=64, head_bytes=12)
        assert peak <= estimate < 4 * peak, (tokens, peak, estimate)
        assert peak_deeper < 1.1 * peak, (tokens, peak, peak_deeper)  # a KV cache would hold every layer's K, V
        assert forward_bytes(deeper, tokens, head_chunk=64, head_bytes=12) == estimate
        assert estimate < activation_bytes(config, tokens, dtype_bytes=2, head_chunk=64) / 2


def test_head_and_dtype_terms():
    config = AutoConfig.for_model(**SHAPES["qwen3"], num_hidden_layers=4)
    body = activation_bytes(config, 4096, head_chunk=0)
    assert activation_bytes(config, 4096, head_chunk=1024) == body + 3 * 1024 * 1000 * 4
    assert activation_bytes(config, 4096, dtype_bytes=4, head_chunk=0) == 2 * body
    # a Qwen3-0.6B-shaped micro-batch of 8 x 1100 tokens: ~16 GB without checkpointing, ~2 GB with
    big = AutoConfig.for_model(model_type="qwen3", hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                               num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936)
    assert 12e9 < activation_bytes(big, 8800) < 20e9
    assert activation_bytes(big, 8800, checkpointing=True) < 3e9


def test_decision_and_micro_batch_tokens():
    assert should_checkpoint(9, 10) and not should_checkpoint(7, 10)
    trajs = [Trajectory(uid=str(i), group_id="g", domain="d", prompt_ids=[1] * 3, response_ids=[2] * n,
                        inference_logprobs=[0.0] * n) for i, n in enumerate([2, 7, 5])]
    assert micro_batch_tokens(trajs, packed=True) == 5 + 10 + 8
    assert micro_batch_tokens(trajs, packed=False) == 3 * 10


def test_max_tokens_within_inverts_the_estimate():
    """trainer.micro_batch_size=auto's token budget: the most positions whose activations fit the bytes."""
    from rl.memory import max_tokens_within

    config = AutoConfig.for_model(**SHAPES["qwen3"], num_hidden_layers=4)
    for budget in [1e6, 3e8, 5e9, 8e10]:
        for dtype_bytes, chunk in [(2, 1024), (4, 256)]:
            t = max_tokens_within(config, budget, dtype_bytes, chunk)
            assert t == 1 or activation_bytes(config, t, dtype_bytes, head_chunk=chunk) <= budget
            assert activation_bytes(config, t + 1, dtype_bytes, head_chunk=chunk) > budget
            f = max_tokens_within(config, budget, dtype_bytes, chunk, forward_only=True)  # the reference's forwards
            assert f == 1 or forward_bytes(config, f, dtype_bytes, head_chunk=chunk) <= budget
            assert forward_bytes(config, f + 1, dtype_bytes, head_chunk=chunk) > budget
            assert f >= t


def test_the_compiled_head_is_counted_at_its_own_bytes_per_logit():
    """trainer.compile: the head holds its 16-bit logits and their gradient (and a kept-set mask), not float32 ones,
    so auto micro-batches get the room the eager estimate would leave unused."""
    from rl.memory import HEAD_BYTES_EAGER, head_logit_bytes, max_tokens_within

    assert head_logit_bytes({"compiled": False}) == HEAD_BYTES_EAGER == 12
    assert head_logit_bytes({"compiled": True, "fp32_head": False}) == 5
    assert head_logit_bytes({"compiled": True, "fp32_head": True}) == 9
    assert head_logit_bytes({"compiled": True, "fp32_head": False}, dtype_bytes=4) == 9  # a float32 model
    config = AutoConfig.for_model(**SHAPES["qwen3"], num_hidden_layers=4)
    body = activation_bytes(config, 8192, head_chunk=0)
    assert activation_bytes(config, 8192, head_chunk=4096, head_bytes=5) == body + 5 * 4096 * 1000
    budget = activation_bytes(config, 8192, head_chunk=4096)
    assert max_tokens_within(config, budget, 2, 4096) == 8192
    assert max_tokens_within(config, budget, 2, 4096, head_bytes=5) > 8192
