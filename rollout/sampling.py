"""Sampling parameters and the logits processing shared by the transformers engine and the tests.

The processing order follows vLLM (temperature, then top-k, then top-p) so both engines report the same
"processed" logprob: the sampled token's log-probability under the truncated, renormalised distribution.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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

    @property
    def truncates(self) -> bool:
        return self.top_p < 1.0 or self.top_k > 0


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
