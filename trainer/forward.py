"""The training-side forward: per-token logprobs of the sampled tokens, shared by the policy and the reference.

Only the generated positions get logits (the prompt positions never reach the LM head), and those go through
`rl.logprobs.token_logprobs` in chunks, with the Keep Sampling Mask and the sampling temperature applied
exactly as the engine applied them. With Keep Routing the recorded MoE routes are replayed in the body
(`route_replay`).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rl.logprobs import token_logprobs
from rl.models import split_head
from rl.trajectory import TrainBatch


@dataclass
class ForwardOut:
    logprobs: torch.Tensor  # [N]
    entropy: torch.Tensor | None  # [N], detached: of the distribution the logprob is under (the kept set's)
    full_entropy: torch.Tensor | None = None  # [N], detached: of the full-vocabulary distribution


class _NoReplay(nullcontext):
    mismatch_count = 0
    total_count = 0

    def device_counts(self) -> tuple[int, int]:
        return 0, 0

    def __enter__(self):  # nullcontext would return None; callers read the counters from the context
        return self


def route_replay(model, batch: TrainBatch, enabled: bool):
    """Keep Routing context for one micro-batch. Keep it open through backward: with gradient
    checkpointing the layers run again during backward and must replay the same routes."""
    from rl.routing import RouteReplay

    if enabled and batch.routed_experts is not None:
        return RouteReplay(model, batch.routed_experts, batch.route_valid)
    return _NoReplay()


class PolicyForward(torch.nn.Module):
    """The module DeepSpeed wraps: an HF causal LM plus the chunked logprob over its output projection.

    Going through `engine(...)` (not the HF submodules directly) lets DeepSpeed do its per-forward bookkeeping;
    without it ZeRO-3 overwrote the accumulated gradient of earlier micro-batches. Under ZeRO-3 the LM-head
    weight is partitioned and gathered only inside a module's forward/backward, and the chunked logprob reads
    it directly, so it is registered as this module's external parameter (`register_zero3_external_head`).
    """

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, batch: TrainBatch, **kwargs) -> tuple:
        # A plain tuple of tensors: DeepSpeed hooks the module's output tensors (ZeRO-3 gathers the head for the
        # backward from there), and it does not look inside a dataclass.
        out = forward_logprobs(self.model, batch, **kwargs)
        return out.logprobs, out.entropy, out.full_entropy

    def register_zero3_external_head(self) -> None:
        import deepspeed

        for p in self.model.get_output_embeddings().parameters():
            deepspeed.zero.register_external_parameter(self, p)


def compile_layers(model) -> int:
    """`trainer.compile`: each decoder layer's forward through torch.compile (Inductor fuses the RMSNorm, SwiGLU and
    rotary elementwise work around the GEMMs; one graph serves every layer of the same type, and `dynamic` shapes
    serve every micro-batch length without recompiling). Hooks on the layer itself run outside the compiled code;
    ZeRO-3, which hooks every submodule, is refused with it at start (rl/config.py). Dense models only: an MoE
    layer's expert dispatch is data-dependent and Keep Routing replays routes through hooks inside the layer.
    Returns how many layers were compiled."""
    from rl.routing import looks_moe

    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if looks_moe(config):
        raise ValueError(f"trainer.compile=true supports dense models; {type(model).__name__} has routed experts "
                         "(set trainer.compile=false)")
    layers = getattr(split_head(model)[0], "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        raise ValueError(f"trainer.compile=true: {type(model).__name__}'s decoder has no `layers` to compile")
    for layer in layers:
        layer.forward = torch.compile(layer.forward, dynamic=True)
    return len(layers)


def logit_scale(model) -> float:
    """The factor the model applies to its LM head's output before the softmax (Cohere's `logit_scale`, Granite's
    1/`logits_scaling`, ...), measured on the model itself: the trainer computes logits from the body and the head's
    weight (`forward_logprobs`), so it divides the temperature by this to match what the engine samples from. A
    non-linear transform (final-logit softcapping) cannot be folded in: refused here, and by `launch.config` at
    start from the config."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    knobs = {k: v for k, v in vars(config).items() if "logit" in k and "router" not in k and v not in (None, False, 1, 1.0)}
    if not knobs:  # families that transform their logits have a config knob for it; measure only those
        return 1.0
    body, head = split_head(model)
    ids = torch.arange(1, 9, device=head.weight.device)[None] % head.weight.shape[0]
    with torch.no_grad():
        full = model(input_ids=ids).logits.double()
        raw = F.linear(body(input_ids=ids).last_hidden_state, head.weight, getattr(head, "bias", None)).double()
    scale = float((full * raw).sum() / (raw * raw).sum())
    if (full - scale * raw).abs().max() > 1e-2 * full.abs().max():
        raise ValueError(f"{type(model).__name__} transforms its logits non-linearly after the LM head ({knobs}): "
                         "the trainer's logprobs would differ from the engine's")
    return 1.0 if abs(scale - 1.0) < 1e-4 else scale


def forward_logprobs(
    model,
    batch: TrainBatch,
    *,
    temperature: float,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    fp32_head: bool = False,
    support_head: bool = False,
    compiled: bool = False,
    bitwise: bool = False,
) -> ForwardOut:
    """Logprobs (and entropy) of the sampled tokens; run inside `route_replay` for Keep Routing. A batch that carries
    kept sets (the engine recorded them: Keep Sampling Mask on) is scored over them, else over the full vocabulary.
    fp32_head (`model.fp32_lm_head`): the LM head's matmul in float32 instead of the model's dtype, as the engine
    then does too, so bf16 rounding of the logits no longer separates the two (the softmax is float32 anyway).
    support_head (`trainer.logprob_head`): with kept sets, the head over each chunk's kept ids only (same values).
    compiled (`trainer.compile`): the dense head's softmax statistics and logit gradient fused by torch.compile.
    bitwise (`algorithm.on_policy=bitwise`, trainer/bitwise.py): the logprobs' values from vLLM's batch-invariant
    kernels, the engine's bit for bit; with autograd on, their gradient from the ordinary forward below."""
    exact = None
    if bitwise:
        from trainer.bitwise import bitwise_forward, value_from

        exact = bitwise_forward(model).logprobs(batch, temperature, chunk_size)
        if not torch.is_grad_enabled() and not with_entropy:  # the reference: values only
            return ForwardOut(exact, None)
    body, head = split_head(model)
    if batch.position_ids is not None:  # packed: attention stays within each sample (see TrainBatch); transformers
        # detects the packing only without a KV cache (use_cache=False). The boundaries are for varlen kernels
        # (FlashAttentionKwargs; sdpa and eager ignore them)
        hidden = body(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False,
                      cu_seq_lens_q=batch.cu_seqlens, cu_seq_lens_k=batch.cu_seqlens,
                      max_length_q=batch.max_seqlen, max_length_k=batch.max_seqlen).last_hidden_state
    else:
        # No padding mask: rows are right-padded and the model is causal, so every scored position sees real tokens
        # only, with or without one; none is built (on the 0.6B benchmark this measured the same speed either way).
        # No KV cache either: a model in eval mode (the reference) would otherwise keep every layer's K and V until
        # the forward returns, memory the no-grad estimate (rl.memory.forward_bytes) does not count.
        hidden = body(input_ids=batch.input_ids, use_cache=False).last_hidden_state
    hidden = hidden.reshape(-1, hidden.shape[-1])[batch.logit_index]
    weight, bias = head.weight, getattr(head, "bias", None)
    if fp32_head and hidden.dtype in (torch.bfloat16, torch.float16):
        # one float32 copy of the head per forward (its gradient flows back through the cast)
        hidden, weight = hidden.float(), weight.float()
        bias = bias.float() if bias is not None else None
    kwargs = dict(
        temperature=temperature,
        kept_ids=batch.kept_ids,
        kept_offsets=batch.kept_offsets,
        chunk_size=chunk_size,
        with_entropy=with_entropy,
        support_head=support_head,
        compiled=compiled,
    )
    out = ForwardOut(*token_logprobs(hidden, weight, batch.targets, lm_bias=bias, **kwargs))
    if exact is not None:
        out.logprobs = value_from(out.logprobs, exact)
    return out
