"""Training objectives: the loss of one micro-batch from the trainer's logprobs and the batch.

`algorithm.objective` picks one from `OBJECTIVES`. GRPO with the DeepSeek-V3.2 stabilisers is the one there is; an
SFT or distillation objective plugs in as another function of the same shape (its stats keys are the ones
`rl.metrics.TrainStatSums.add` reads) and a name in `OBJECTIVES`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from rl.losses import grpo_loss, truncated_is_weight
from rl.trajectory import TrainBatch


def grpo(logprobs: torch.Tensor, batch: TrainBatch, acfg: Mapping, norm: tuple[int, int]) -> tuple[torch.Tensor, dict]:
    """`rl.losses.grpo_loss` with the mini-batch's norms. pi_old is the engine's `inference_logprobs`, or the
    trainer's recomputation (`batch.old_logprobs`, algorithm.old_logprobs=trainer) with truncated importance
    weights against the engine's (`algorithm.tis_cap`; null = none)."""
    norm_seqs, norm_tokens = norm
    old, is_weight = batch.inference_logprobs, None
    if batch.old_logprobs is not None:
        old = batch.old_logprobs
        if acfg.get("tis_cap") is not None:
            is_weight = truncated_is_weight(batch.old_logprobs, batch.inference_logprobs, float(acfg["tis_cap"]))
    loss, stats = grpo_loss(
        logprobs,
        old,
        batch.ref_logprobs,
        batch.seq_index,
        batch.loss_mask,
        batch.advantages,
        batch.kl_coef,
        batch.opsm_delta,
        eps_low=float(acfg["clip_eps_low"]),
        eps_high=float(acfg["clip_eps_high"]),
        unbiased_kl=bool(acfg["unbiased_kl"]),
        aggregation=str(acfg["loss_aggregation"]),
        norm_seqs=norm_seqs,
        norm_tokens=norm_tokens,
        is_weight=is_weight,
    )
    if is_weight is not None:
        mask = batch.loss_mask
        stats["is_weight_sum"] = (is_weight * mask).sum()
        stats["is_clip_sum"] = ((is_weight >= float(acfg["tis_cap"])).to(mask.dtype) * mask).sum()
    return loss, stats


Objective = Callable[[torch.Tensor, TrainBatch, Mapping, tuple[int, int]], tuple[torch.Tensor, dict]]
OBJECTIVES: dict[str, Objective] = {"grpo": grpo}
