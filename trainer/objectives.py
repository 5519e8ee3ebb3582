"""Training objectives: the loss of one micro-batch from the trainer's logprobs and the batch.

`algorithm.objective` picks one from `OBJECTIVES`. GRPO with the DeepSeek-V3.2 stabilisers is the one there is; an
SFT or distillation objective plugs in as another function of the same shape (its stats keys are the ones
`rl.metrics.accumulate_train_stats` reads) and a name in `OBJECTIVES`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from rl.losses import grpo_loss
from rl.trajectory import TrainBatch


def grpo(logprobs: torch.Tensor, batch: TrainBatch, acfg: Mapping, norm: tuple[int, int]) -> tuple[torch.Tensor, dict]:
    """`rl.losses.grpo_loss` with pi_old = the engine's `inference_logprobs` and the mini-batch's norms."""
    norm_seqs, norm_tokens = norm
    return grpo_loss(
        logprobs,
        batch.inference_logprobs,
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
    )


Objective = Callable[[torch.Tensor, TrainBatch, Mapping, tuple[int, int]], tuple[torch.Tensor, dict]]
OBJECTIVES: dict[str, Objective] = {"grpo": grpo}
