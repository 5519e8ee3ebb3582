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

from rl.logprobs import token_logprobs
from rl.trajectory import TrainBatch


@dataclass
class ForwardOut:
    logprobs: torch.Tensor  # [N]
    entropy: torch.Tensor | None  # [N], detached


class _NoReplay(nullcontext):
    mismatch_count = 0
    total_count = 0


def route_replay(model, batch: TrainBatch, enabled: bool):
    """Keep Routing context for one micro-batch. Keep it open through backward: with gradient
    checkpointing the layers run again during backward and must replay the same routes."""
    from rl.routing import RouteReplay

    if enabled and batch.routed_experts is not None:
        return RouteReplay(model, batch.routed_experts, batch.route_valid)
    return _NoReplay()


class LogprobHead(torch.nn.Module):
    """`token_logprobs` over the model's output projection, as a module of the model.

    Under ZeRO-3 the LM-head weight is partitioned and only gathered inside a module's forward/backward; the
    chunked logprob reads that weight directly, so it runs as this module with the weight registered as its
    external parameter (`attach_logprob_head`). It owns no parameters: checkpoints are unchanged.
    """

    def __init__(self, head: torch.nn.Module):
        super().__init__()
        self._head = [head]  # a list, so the head is not registered twice as a submodule

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor, **kwargs):
        head = self._head[0]
        return token_logprobs(hidden, head.weight, targets, lm_bias=getattr(head, "bias", None), **kwargs)


def attach_logprob_head(model) -> None:
    model.add_module("logprob_head", LogprobHead(model.get_output_embeddings()))


def register_logprob_head_zero3(model) -> None:
    import deepspeed

    head = model.get_output_embeddings()
    for p in head.parameters():
        deepspeed.zero.register_external_parameter(model.logprob_head, p)


def split_head(model):
    """(decoder body returning hidden states, output projection module) of an HF causal LM."""
    body = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    head = model.get_output_embeddings()
    if body is None or head is None:
        raise ValueError(f"{type(model).__name__} does not expose a decoder body and an output embedding")
    return body, head


def forward_logprobs(
    model,
    batch: TrainBatch,
    *,
    temperature: float,
    keep_sampling_mask: bool,
    chunk_size: int = 1024,
    with_entropy: bool = False,
) -> ForwardOut:
    """Logprobs (and entropy) of the sampled tokens; run inside `route_replay` for Keep Routing."""
    body, head = split_head(model)
    hidden = body(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    hidden = hidden.reshape(-1, hidden.shape[-1])[batch.logit_index]
    use_mask = keep_sampling_mask and batch.mask_offsets is not None
    kwargs = dict(
        temperature=temperature,
        mask_ids=batch.mask_ids if use_mask else None,
        mask_offsets=batch.mask_offsets if use_mask else None,
        chunk_size=chunk_size,
        with_entropy=with_entropy,
    )
    if hasattr(model, "logprob_head"):
        logp, entropy = model.logprob_head(hidden, batch.targets, **kwargs)
    else:
        logp, entropy = token_logprobs(hidden, head.weight, batch.targets, lm_bias=getattr(head, "bias", None), **kwargs)
    return ForwardOut(logp, entropy)
