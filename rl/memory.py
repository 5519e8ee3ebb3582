"""Activation memory of a training micro-batch, from the model's config alone, for
`trainer.gradient_checkpointing=auto`: recompute activations in backward only when those of the step's largest
micro-batch would not fit in the GPU memory left free (recomputation costs ~20-30% of train throughput, and a
colocated vLLM asleep leaves most of the GPU to the trainer).

What backward keeps per token (the tensors autograd saves in forward, parameters excluded, each storage counted
once), measured with `torch.autograd.graph.saved_tensors_hooks` on Qwen3, Llama and Qwen3-MoE configs of several
widths (16-bit activations, sdpa attention, by differencing 2- and 4-layer models; tests/test_memory.py checks
the fit) and fitted as

    per decoder layer:  6 h + 24 h_kv + 11 I_active  bytes            (+ 9 k h + 4 E for a routed MoE layer)
    with checkpointing: 2 h bytes per layer (its input), plus one layer's full set while it is recomputed
    outside the layers: 6 h bytes (embeddings, final norm)

with h the hidden size, h_kv = kv heads x head dim, I_active the MLP width a token goes through (the dense MLP's
intermediate size, or k x the expert width plus shared experts), k the experts per token and E the experts.
32-bit activations take twice as much. The LM head's log-softmax runs in chunks (`trainer.logprob_chunk_size`):
about 3 x chunk x vocab x 4 bytes (float32 logits, their softmax and gradient) on top, whatever the micro-batch;
compiled (`trainer.compile`), 5 bytes per logit (`head_logit_bytes`: the 16-bit logits and their gradient, the
float32 math fused into passes over them, a kept-set mask).
The fit is within ~10% of the measured dense configs and ~5% of the MoE; `should_checkpoint` keeps a 20% margin.

The same estimate sizes micro-batches for `trainer.micro_batch_size=auto`: `max_tokens_within` is the most
positions whose activations fit a byte budget (a share of the free memory), and `rl.batching.micro_batch_count`
cuts a step into the fewest micro-batches that stay under it. On a small model the train phase is bound by kernel
launches per micro-batch, not by FLOPs: SmolLM2-135M, 256 samples, one H100, 1.02-1.14 s at 32 samples per
micro-batch against 0.48-0.52 s at 128.
"""

from __future__ import annotations

from rl.flops import config_get
from rl.routing import UnsupportedMoEError, moe_layer_indices


def _layer_bytes_16bit(config) -> tuple[float, float]:
    """(bytes per token of a dense layer, of an MoE layer) with 16-bit activations."""
    h = config_get(config, "hidden_size")
    heads = config_get(config, "num_attention_heads")
    head_dim = config_get(config, "head_dim", "qk_nope_head_dim", default=h // heads)
    kv = config_get(config, "num_key_value_heads", default=heads) * head_dim
    dense = 6 * h + 24 * kv + 11 * config.intermediate_size
    experts = config_get(config, "num_experts", "num_local_experts", "n_routed_experts")
    if not experts:
        return dense, dense
    k = config.num_experts_per_tok
    expert_ff = config_get(config, "moe_intermediate_size", "intermediate_size")
    shared = (config_get(config, "n_shared_experts", default=0) or 0) * expert_ff
    shared += config_get(config, "shared_expert_intermediate_size", default=0) or 0
    moe = 6 * h + 24 * kv + 11 * (k * expert_ff + shared) + 9 * k * h + 4 * experts
    return dense, moe


# Bytes per [chunk, vocab] logit the LM head holds at once: eager (float32 logits, softmax and gradient)
HEAD_BYTES_EAGER = 12


def head_logit_bytes(head: dict, dtype_bytes: int = 2) -> int:
    """Bytes per [chunk, vocab] logit of the head set up by `head` (`rl.config.head_options`) for a model of
    `dtype_bytes` per value: eager, or compiled (the logits and their gradient in the head's dtype, float32 with
    `fp32_head` or a float32 model, the float32 math fused into passes over them, a kept-set mask)."""
    if not head.get("compiled"):
        return HEAD_BYTES_EAGER
    return 2 * (4 if head.get("fp32_head") or dtype_bytes >= 4 else 2) + 1


def activation_bytes(config, tokens: int, dtype_bytes: int = 2, checkpointing: bool = False,
                     head_chunk: int = 1024, head_bytes: int = HEAD_BYTES_EAGER) -> int:
    """Peak bytes of what one micro-batch of `tokens` positions keeps for backward (see the module docstring)."""
    h, layers = config_get(config, "hidden_size"), config_get(config, "num_hidden_layers")
    try:
        moe = set(moe_layer_indices(config) or ())
    except UnsupportedMoEError:
        moe = set()
    dense, moe_layer = _layer_bytes_16bit(config)
    per_layer = [moe_layer if i in moe else dense for i in range(layers)]
    if checkpointing:
        per_token = 2 * h * layers + max(per_layer)  # layer inputs, and the layer being recomputed
    else:
        per_token = sum(per_layer)
    scale = max(dtype_bytes, 2) / 2
    head = head_bytes * min(head_chunk, tokens) * config_get(config, "vocab_size", default=0)
    return int(scale * (per_token + 6 * h) * tokens + head)


def forward_bytes(config, tokens: int, dtype_bytes: int = 2, head_chunk: int = 1024,
                  head_bytes: int = HEAD_BYTES_EAGER) -> int:
    """Peak bytes of a forward without autograd and without a KV cache over `tokens` positions (the reference's):
    nothing is kept from one decoder layer to the next, so one layer's tensors at a time (at most the set that layer
    saves for backward in training: the fit above), the hidden states going in and out of it (4 h) and the
    embeddings' share (6 h), and the head's chunk. Padded rows, or packed ones with flash-attention: packed rows with
    sdpa/eager attention also hold a mask over the row's whole length, not counted here. A measured scoring forward
    (`trainer.forward.forward_logprobs`, no grad) peaks at 34-48% of this on CPU, whatever the depth
    (tests/test_memory.py)."""
    h = config_get(config, "hidden_size")
    per_token = max(_layer_bytes_16bit(config)) + 10 * h
    head = head_bytes * min(head_chunk, tokens) * config_get(config, "vocab_size", default=0)
    return int(max(dtype_bytes, 2) / 2 * per_token * tokens + head)


def micro_batch_tokens(trajs, packed: bool) -> int:
    """Positions the model runs over for one micro-batch: the sum of lengths packed, rows x the longest padded."""
    lengths = [t.num_tokens for t in trajs]
    return sum(lengths) if packed else len(lengths) * max(lengths, default=0)


def max_tokens_within(config, budget_bytes: float, dtype_bytes: int = 2, head_chunk: int = 1024,
                      head_bytes: int = HEAD_BYTES_EAGER, forward_only: bool = False) -> int:
    """The most positions one micro-batch may hold for its activations (`activation_bytes`, no recomputation; with
    `forward_only`, `forward_bytes`: a forward without autograd) to stay within `budget_bytes`; at least 1."""
    def need(tokens: int) -> int:
        if forward_only:
            return forward_bytes(config, tokens, dtype_bytes, head_chunk, head_bytes)
        return activation_bytes(config, tokens, dtype_bytes, False, head_chunk, head_bytes)

    lo, hi = 1, 1
    while need(hi * 2) <= budget_bytes and hi < 2**40:
        hi *= 2
    hi *= 2
    while lo < hi:  # the largest t with need(t) <= budget (need grows with t)
        mid = (lo + hi + 1) // 2
        if need(mid) <= budget_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo


def should_checkpoint(activation_bytes_without: int, free_bytes: int, margin: float = 0.8) -> bool:
    """Recompute when the activations without it would take more than `margin` of the free memory."""
    return activation_bytes_without > margin * free_bytes
