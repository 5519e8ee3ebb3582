"""What every rollout engine takes and returns: `SamplingParams` in, `Generation` out, plus the pieces the engines
share (the logits processing of the transformers engine and the tests, the stop ids, decoding a response).

The processing order follows vLLM (temperature, then top-k, then top-p) so both engines report the same
"processed" logprob: the sampled token's log-probability under the truncated, renormalised distribution.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class SamplingParams:
    n: int = 1  # samples per prompt (GRPO group size G)
    temperature: float = 1.0
    top_p: float = 1.0  # 1.0 = off
    top_k: int = 0  # 0 = off (note: transformers' generate() silently uses 50; we never call it)
    max_new_tokens: int = 64
    stop_token_ids: list[int] = field(default_factory=list)  # in addition to the tokenizer's EOS
    seed: int | None = None
    # Record each position's kept set (Keep Sampling Mask). The worker sets it from
    # algorithm.keep_sampling_mask; without truncation (top_p 1, top_k 0) or greedy there is nothing to record.
    record_kept_set: bool = True

    @property
    def truncates(self) -> bool:
        return self.top_p < 1.0 or self.top_k > 0

    @property
    def records_kept_sets(self) -> bool:
        return self.record_kept_set and self.truncates and self.temperature > 0


@dataclass
class Generation:
    """One sampled continuation, as an engine returns it."""

    response_ids: np.ndarray  # int32 [R]
    inference_logprobs: np.ndarray  # float32 [R]: the processed logprob of each sampled token
    finish_reason: str  # "stop" | "length"
    # int32 (uint16 from vLLM when the vocabulary fits), CSR over positions (None: no kept sets recorded)
    kept_ids: np.ndarray | None = None
    kept_offsets: np.ndarray | None = None  # int64 [R + 1]
    routed_experts: np.ndarray | None = None  # [P + R - 1, L, K]
    kept_set_cut: int = 0  # positions whose kept set could not be recorded completely (vLLM, more than K ids)
    loss_mask: np.ndarray | None = None  # float32 [R]: 0 drops a position from the loss (vLLM: cut kept sets)


def process_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """float32 logits [B, V] -> processed log-probabilities [B, V], -inf outside the kept set.

    top-k keeps every id whose logit reaches the k-th largest (ties kept); top-p drops the lowest-probability
    ids whose cumulative mass stays <= 1 - p (the most likely id always survives), as vLLM does.
    """
    logits = logits.float()
    if temperature > 0:
        logits = logits / temperature
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop_sorted = cum <= (1.0 - top_p)
        drop_sorted[..., -1] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.log_softmax(logits, dim=-1)


def eos_token_ids(model_path: str, tokenizer) -> list[int]:
    """The ids that end a response: the model's generation config (or its config) EOS ids and the tokenizer's."""
    from transformers import AutoConfig, GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except Exception:  # no generation_config.json: transformers derives it from config.json the same way
        eos = getattr(AutoConfig.from_pretrained(model_path), "eos_token_id", None)
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    return sorted({*eos, tokenizer.eos_token_id} - {None})


def decode_response(tokenizer, ids) -> str:
    """A response's text, decoded once: special tokens such as <think> stay (rewards read them), EOS/pad do not."""
    text = tokenizer.decode(list(ids), skip_special_tokens=False)
    for tok in {tokenizer.eos_token, tokenizer.pad_token} - {None}:
        text = text.replace(tok, "")
    return text
