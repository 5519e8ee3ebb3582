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

    def forward(self, batch: TrainBatch, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = forward_logprobs(self.model, batch, **kwargs)
        return out.logprobs, out.entropy

    def register_zero3_external_head(self) -> None:
        import deepspeed

        for p in self.model.get_output_embeddings().parameters():
            deepspeed.zero.register_external_parameter(self, p)


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
    chunk_size: int = 1024,
    with_entropy: bool = False,
) -> ForwardOut:
    """Logprobs (and entropy) of the sampled tokens; run inside `route_replay` for Keep Routing. A batch that carries
    kept sets (the engine recorded them: Keep Sampling Mask on) is scored over them, else over the full vocabulary."""
    body, head = split_head(model)
    hidden = body(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    hidden = hidden.reshape(-1, hidden.shape[-1])[batch.logit_index]
    kwargs = dict(
        temperature=temperature,
        kept_ids=batch.kept_ids,
        kept_offsets=batch.kept_offsets,
        chunk_size=chunk_size,
        with_entropy=with_entropy,
    )
    logp, entropy = token_logprobs(hidden, head.weight, batch.targets, lm_bias=getattr(head, "bias", None), **kwargs)
    return ForwardOut(logp, entropy)
