"""Training objectives: the loss of one micro-batch from the trainer's logprobs and the batch, the stats it sums and
how the step reduces them into logged metrics, and what it needs from a sample.

`algorithm.objective` picks one from `OBJECTIVES`. Each is an `Objective` record:
- `loss(logprobs, batch, acfg, norm) -> (loss, stats)`: the micro-batch's share of the mini-batch objective (`norm`
  = the mini-batch's (episodes, loss tokens), `rl.batching.minibatch_norm`), with detached stats;
- `sums(batch, stats) -> {key: tensor | number}`: what the micro-batch adds to the step's sums (`rl.metrics.
  TrainStatSums` sums whatever it is given; tensors stay on the device until the step ends);
- `metrics(sums, domains, mini_batches) -> {metric: value}`: the step's logged values from the ranks' summed sums
  (`rl.metrics.trainer_metrics` adds the trainer's own: entropy, grad_norm, lr, ...);
- `source`: where a step's samples come from: "rollouts" (the prompt mixture, rollout and reward workers) or
  "dataset" (`algorithm.dataset`, no rollout or reward workers at all);
- `needs`: what a sample must carry: "inference_logprobs" (pi_old from the engine), "advantages", "reference"
  (reference logprobs where a domain has kl_coef > 0), "teacher" (teacher logprobs where a domain has a teacher).
  A dataset row has none of these.

GRPO with the DeepSeek-V3.2 stabilisers, on-policy distillation (GRPO's loss over per-token advantages that add the
teacher's grade of every sampled token; the teachers are FrozenModels placed like the reference) and SFT.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from rl.losses import distill_token_advantages, grpo_loss, sft_loss, truncated_is_weight
from rl.metrics import ratio
from rl.trajectory import TrainBatch, host_to_device

Sums = dict  # key -> a device tensor or a Python number, one micro-batch's share of the step's sums


def grpo(logprobs: torch.Tensor, batch: TrainBatch, acfg: Mapping, norm: tuple[float, int],
         token_advantages: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """`rl.losses.grpo_loss` with the mini-batch's norms. pi_old of the ratio and of the unbiased KL's ratio is the
    engine's `inference_logprobs`, or the trainer's recomputation (`batch.old_logprobs`,
    algorithm.old_logprobs=trainer) with truncated importance weights min(pi_old/pi_engine, tis_cap) against the
    engine's on the policy-gradient and KL terms alike (`algorithm.tis_cap`; null = none). OPSM's statistic reads
    the engine's logprobs under either choice: the probability the tokens were sampled with (V3.2). Sequences weigh
    their share of their episode (`batch.episode_share`, context segments). `token_advantages`: see `distill`."""
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
        token_advantages=token_advantages,
        sampling_logprobs=batch.inference_logprobs,
        episode_share=batch.episode_share,
    )
    if is_weight is not None:
        mask = batch.loss_mask
        stats["is_weight_sum"] = (is_weight * mask).sum()
        stats["is_clip_sum"] = ((is_weight >= float(acfg["tis_cap"])).to(mask.dtype) * mask).sum()
    return loss, stats


def grpo_sums(batch: TrainBatch, stats: dict) -> Sums:
    """GRPO's sums of one micro-batch: its loss terms (fractions of the mini-batch's), clipped tokens, the truncated
    importance weights (pi_old recomputed by the trainer), and per domain the sequences, those OPSM masked, and the
    KL estimate of those with a reference (kl_coef > 0)."""
    s: Sums = {"loss/pg": stats["pg_loss"], "loss/kl": stats["kl_loss"], "clip_tokens": stats["clip_tok_sum"]}
    if "is_weight_sum" in stats:
        s["is_weight_sum"], s["is_clip_sum"] = stats["is_weight_sum"], stats["is_clip_sum"]
    masked, has_ref = ~stats["opsm_keep"], batch.kl_coef > 0
    kl_seq = torch.where(has_ref, stats["kl_seq"], torch.zeros_like(stats["kl_seq"]))
    for domain in sorted(set(batch.domains)):
        rows = [i for i, d in enumerate(batch.domains) if d == domain]
        s[f"seqs/{domain}"] = len(rows)
        sel = host_to_device(torch.tensor(rows), masked.device)
        s[f"opsm_masked/{domain}"] = masked[sel].sum()
        s[f"kl_sum/{domain}"] = kl_seq[sel].sum()
        s[f"kl_seqs/{domain}"] = has_ref[sel].sum()
    return s


def grpo_metrics(s: Mapping[str, float], domains: list[str], mini_batches: int) -> dict[str, float | None]:
    """GRPO's logged values from the step's sums (every rank's, added up)."""
    get = lambda k: s.get(k, 0.0)  # noqa: E731
    m: dict[str, float | None] = {
        # Micro-batch losses are fractions of their mini-batch's objective: sum, then average over mini-batches.
        "loss/pg": get("loss/pg") / mini_batches,
        "loss/kl": get("loss/kl") / mini_batches,
        "clip_frac": ratio(s, "clip_tokens", "tokens"),
        # algorithm.old_logprobs=trainer: the mean truncated importance weight pi_old/pi_inference (it weighs the
        # policy-gradient and KL terms of each token) and the share of tokens at the cap (null otherwise)
        "tis/weight_mean": ratio(s, "is_weight_sum", "tokens") if "is_weight_sum" in s else None,
        "tis/clip_frac": ratio(s, "is_clip_sum", "tokens") if "is_weight_sum" in s else None,
        "opsm/masked_frac": sum(get(f"opsm_masked/{d}") for d in domains) / max(sum(get(f"seqs/{d}") for d in domains), 1),
    }
    for d in domains:
        m[f"opsm/{d}/masked_frac"] = ratio(s, f"opsm_masked/{d}", f"seqs/{d}") if get(f"seqs/{d}") else None
        # None (null in metrics.jsonl, absent in W&B) when the domain's kl_coef is 0: its reference is not run.
        m[f"kl/{d}"] = ratio(s, f"kl_sum/{d}", f"kl_seqs/{d}") if get(f"kl_seqs/{d}") else None
    return m


def distill(logprobs: torch.Tensor, batch: TrainBatch, acfg: Mapping, norm: tuple[float, int]) -> tuple[torch.Tensor, dict]:
    """On-policy distillation: GRPO's loss (clip, OPSM, per-domain KL) over the per-token advantages
    `rl.losses.distill_token_advantages` (reward_coef * A_i + distill_coef * (log pi_teacher - log pi_old)); a sample
    without teacher logprobs has distill_coef 0 (its reward part alone, also when no sample of the micro-batch has a
    teacher). OPSM takes the sign of the reward part reward_coef * A_i. Adds `gap_tok` (log pi_old - log pi_teacher
    per token, the sampled reverse-KL estimate) to the stats."""
    old = batch.old_logprobs if batch.old_logprobs is not None else batch.inference_logprobs
    teacher = batch.teacher_logprobs if batch.teacher_logprobs is not None else old
    token_adv = distill_token_advantages(batch.advantages, batch.seq_index, old, teacher, batch.reward_coef,
                                         batch.distill_coef)
    scaled = dataclasses.replace(batch, advantages=batch.reward_coef * batch.advantages)
    loss, stats = grpo(logprobs, scaled, acfg, norm, token_advantages=token_adv)
    stats["gap_tok"] = (old - teacher).detach()
    return loss, stats


def distill_sums(batch: TrainBatch, stats: dict) -> Sums:
    """GRPO's sums, and per domain with a teacher the summed reverse-KL estimate over its loss tokens and those
    tokens."""
    s = grpo_sums(batch, stats)
    has_teacher = (batch.distill_coef > 0)[batch.seq_index] & (batch.loss_mask > 0)
    for domain in sorted(set(batch.domains)):
        in_domain = host_to_device(torch.tensor([d == domain for d in batch.domains]), batch.seq_index.device)
        sel = (has_teacher & in_domain[batch.seq_index]).to(stats["gap_tok"].dtype)
        s[f"distill_gap/{domain}"] = (stats["gap_tok"] * sel).sum()
        s[f"distill_tokens/{domain}"] = sel.sum()
    return s


def distill_metrics(s: Mapping[str, float], domains: list[str], mini_batches: int) -> dict[str, float | None]:
    """GRPO's logged values, and `distill/<d>/reverse_kl`: the mean over the domain's loss tokens of log pi_old -
    log pi_teacher, the sampled estimate of KL(student || teacher) per token (null for a domain without a teacher
    or without samples this step), with `distill/reverse_kl` over every domain with a teacher."""
    m = grpo_metrics(s, domains, mini_batches)
    get = lambda k: s.get(k, 0.0)  # noqa: E731
    for d in domains:
        m[f"distill/{d}/reverse_kl"] = ratio(s, f"distill_gap/{d}", f"distill_tokens/{d}") if get(f"distill_tokens/{d}") else None
    tokens = sum(get(f"distill_tokens/{d}") for d in domains)
    m["distill/reverse_kl"] = sum(get(f"distill_gap/{d}") for d in domains) / tokens if tokens else None
    return m


def sft(logprobs: torch.Tensor, batch: TrainBatch, acfg: Mapping, norm: tuple[float, int]) -> tuple[torch.Tensor, dict]:
    """`rl.losses.sft_loss`: the per-token mean NLL of the assistant's tokens over the whole mini-batch."""
    return sft_loss(logprobs, batch.loss_mask, norm_tokens=norm[1])


def sft_sums(batch: TrainBatch, stats: dict) -> Sums:
    """SFT's sums of one micro-batch: its share of the mini-batch's mean NLL, and its conversations."""
    return {"loss/sft": stats["nll_loss"], "sft_seqs": batch.num_seqs}


def sft_metrics(s: Mapping[str, float], domains: list[str], mini_batches: int) -> dict[str, float | None]:
    """SFT's logged values: `loss/sft`, the per-token mean NLL of the assistant's tokens (the mean over the step's
    mini-batches, each a per-token mean over its conversations), and `sft/tokens`, the loss tokens of the step."""
    return {"loss/sft": s.get("loss/sft", 0.0) / mini_batches, "sft/tokens": s.get("tokens", 0.0)}


@dataclass(frozen=True)
class Objective:
    name: str
    loss: Callable[[torch.Tensor, TrainBatch, Mapping, tuple[float, int]], tuple[torch.Tensor, dict]]
    sums: Callable[[TrainBatch, dict], Sums]
    metrics: Callable[[Mapping[str, float], list[str], int], dict[str, float | None]]
    source: str  # "rollouts" | "dataset"
    needs: frozenset[str] = frozenset()  # of "inference_logprobs", "advantages", "reference", "teacher"


GRPO = Objective("grpo", grpo, grpo_sums, grpo_metrics, source="rollouts",
                 needs=frozenset({"inference_logprobs", "advantages", "reference"}))
DISTILL = Objective("distill", distill, distill_sums, distill_metrics, source="rollouts",
                    needs=frozenset({"inference_logprobs", "advantages", "reference", "teacher"}))
SFT = Objective("sft", sft, sft_sums, sft_metrics, source="dataset")
OBJECTIVES: dict[str, Objective] = {o.name: o for o in (GRPO, DISTILL, SFT)}


def objective_of(cfg: Mapping) -> Objective:
    """The run's objective (`algorithm.objective`, grpo when absent)."""
    return OBJECTIVES[str(cfg["algorithm"].get("objective", "grpo"))]
