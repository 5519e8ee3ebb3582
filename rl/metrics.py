"""Every metric key of a step is written here: one flat dict from the trajectories, the trainer ranks' sums and
the loop's phase timings. The trainer adds to its sums with `TrainStatSums` (on each rank); the loop
reduces them with `trainer_metrics`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

import numpy as np
import torch

from rl.trajectory import Trajectory, host_to_device


def _mean(xs) -> float:
    return float(np.mean(xs)) if len(xs) else 0.0


def zero_variance_group_frac(trajs: list[Trajectory]) -> float:
    """Share of GRPO groups whose scored samples all got the same reward: their advantages are all 0, so they
    teach nothing (greedy sampling, a constant reward, or a task too easy / too hard for every sample)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        if not t.reward_failed:
            groups[t.group_id].append(t.reward)
    return _mean([max(r) - min(r) <= 1e-12 for r in groups.values()])


def rollout_metrics(trajs: list[Trajectory], domain_parts: Mapping[str, list[str]] | None = None,
                    staleness: int = 0, agent_domains: list[str] = ()) -> dict[str, float | None]:
    """Rewards, lengths and rollout facts of the step's samples. `domain_parts` (domain -> reward part labels, from
    the config) and `agent_domains` make every domain's keys appear on every step, null when the step drew no
    prompt of it; `staleness` = how many weight updates the sampling weights are behind the trained ones."""
    m: dict[str, float | None] = {
        "reward/mean": _mean([t.reward for t in trajs]),
        "reward/std": float(np.std([t.reward for t in trajs])) if trajs else 0.0,
        "reward/with_reason_frac": _mean([t.reward_error is not None for t in trajs]),  # failures + expected zeros
        "reward/failed_frac": _mean([t.reward_failed for t in trajs]),  # errors/timeouts: trained with advantage 0
        "response_length/mean": _mean([t.num_generated_tokens for t in trajs]),  # generated tokens only
        "response_length/max": float(max((t.num_generated_tokens for t in trajs), default=0)),
        "response_length/truncated_frac": _mean([t.finish_reason == "length" for t in trajs]),
        "prompt_length/mean": _mean([len(t.prompt_ids) for t in trajs]),
        "advantage/abs_mean": _mean([abs(t.advantage) for t in trajs]),
        "advantage/zero_variance_group_frac": zero_variance_group_frac(trajs),
        # share of response tokens whose kept set the engine could not record completely (left out of the loss)
        "rollout/kept_set_cut_frac": sum(t.kept_set_cut for t in trajs) / max(sum(t.num_response_tokens for t in trajs), 1),
        "rollout/staleness": float(staleness),
    }
    by_domain: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        by_domain[t.domain].append(t)
    domain_parts = domain_parts or {}
    for d in sorted(set(by_domain) | set(domain_parts)):
        ts = by_domain.get(d, [])
        m[f"samples/{d}"] = float(len(ts))
        m[f"reward/{d}/mean"] = _mean([t.reward for t in ts]) if ts else None
        m[f"response_length/{d}/mean"] = _mean([t.num_generated_tokens for t in ts]) if ts else None
        for part in sorted({*domain_parts.get(d, ()), *(p for t in ts for p in t.reward_parts)}):
            m[f"reward/{d}/{part}"] = _mean([t.reward_parts.get(part, 0.0) for t in ts]) if ts else None
    m.update(agent_metrics(trajs, agent_domains))
    return m


TERMINATIONS = ("submitted", "answer", "max_turns", "length")


def agent_metrics(trajs: list[Trajectory], agent_domains: list[str] = ()) -> dict[str, float | None]:
    """Multi-turn episodes, per agent domain: turns, tool calls (per tool and status), termination reasons, generated
    vs tool tokens, tool latency, the environment verifier's success; `time/tools`: the slowest rollout worker's
    wall time in tool calls. A domain of `agent_domains` without episodes this step gets nulls."""
    m: dict[str, float | None] = {}
    episodes: dict[str, list[dict]] = defaultdict(list)
    for t in trajs:
        if t.episode is not None:
            episodes[t.domain].append(t.episode)
    for d in agent_domains:
        if d not in episodes:
            for key in ("turns", "tool_calls", "generated_tokens", "tool_tokens", "tool_latency_s",
                        *(f"termination/{r}" for r in TERMINATIONS)):
                m[f"agent/{d}/{key}"] = None
    if agent_domains:
        m["time/tools"] = None
    for d, eps in sorted(episodes.items()):
        calls = [c for e in eps for c in e["calls"]]
        m[f"agent/{d}/turns"] = _mean([e["turns"] for e in eps])
        m[f"agent/{d}/tool_calls"] = _mean([len(e["calls"]) for e in eps])
        m[f"agent/{d}/generated_tokens"] = _mean([e["generated_tokens"] for e in eps])
        m[f"agent/{d}/tool_tokens"] = _mean([e["tool_tokens"] for e in eps])
        m[f"agent/{d}/tool_latency_s"] = _mean([c["seconds"] for c in calls])
        m[f"agent/{d}/success/{eps[0]['env']}"] = _mean([float(e["outcome"].get("score") or 0.0) for e in eps])
        for reason in TERMINATIONS:
            m[f"agent/{d}/termination/{reason}"] = _mean([e["termination"] == reason for e in eps])
        for tool, status in sorted({(c["tool"], c["status"]) for c in calls}):
            m[f"agent/{d}/calls/{tool}/{status}"] = float(sum(c["tool"] == tool and c["status"] == status for c in calls))
    if episodes:
        m["time/tools"] = max(e["tool_wall_s"] for eps in episodes.values() for e in eps)
    return m


def trainer_metrics(rank_sums: list[dict], domains: list[str], mini_batches: int) -> dict[str, float | None]:
    """Reduce the ranks' sums (`TrainStatSums.totals`) to the logged values."""
    s: dict[str, float] = defaultdict(float)
    for rs in rank_sums:
        for k, v in rs.items():
            s[k] += v
    n_ranks = max(len(rank_sums), 1)
    ratio = lambda a, b: s[a] / s[b] if s[b] else 0.0  # noqa: E731
    m: dict[str, float | None] = {
        # Micro-batch losses are fractions of their mini-batch's objective: sum, then average over mini-batches.
        "loss/pg": s["loss/pg"] / mini_batches,
        "loss/kl": s["loss/kl"] / mini_batches,
        "clip_frac": ratio("clip_tokens", "tokens"),
        # of the distribution the loss is under (the renormalised kept set with Keep Sampling Mask), and of the
        # full vocabulary (what verl/slime log as entropy); equal without kept sets
        "entropy/kept_set": ratio("entropy_sum", "tokens"),
        "entropy/full_vocab": ratio("full_entropy_sum", "full_entropy_tokens"),
        "mismatch/logprob_abs": ratio("mismatch_abs_sum", "mismatch_tokens"),
        "mismatch/routing_frac": ratio("routing_mismatch", "routing_total"),
        "grad_norm": s["grad_norm"] / max(s["optimizer_steps"], 1),
        # algorithm.old_logprobs=trainer: the mean truncated importance weight pi_old/pi_inference and the share of
        # tokens at the cap (null otherwise)
        "tis/weight_mean": ratio("is_weight_sum", "tokens") if "is_weight_sum" in s else None,
        "tis/clip_frac": ratio("is_clip_sum", "tokens") if "is_weight_sum" in s else None,
        "lr": s["lr"] / n_ranks,
        # trainer.gradient_checkpointing (auto: chosen per step from the activation estimate; the share of ranks on)
        "perf/gradient_checkpointing": s["gradient_checkpointing"] / n_ranks,
        # micro-batches per mini-batch on a rank (trainer.micro_batch_size=auto: chosen per step from the free memory)
        "perf/micro_batches": s["micro_batches"] / max(s["optimizer_steps"], 1),
        # GPU memory as the train phase starts, GiB, the mean over ranks (null on CPU): what a rank could allocate
        # (what micro_batch_size=auto sizes from), what its GPU held outside its torch allocator (a colocated vLLM
        # asleep, the reference, CUDA contexts, NCCL buffers), and the most the train phase allocated
        "memory/trainer_free_gib": s["gpu_free_gib"] / n_ranks if "gpu_free_gib" in s else None,
        "memory/others_gib": s["gpu_others_gib"] / n_ranks if "gpu_others_gib" in s else None,
        "memory/trainer_peak_gib": s["gpu_peak_gib"] / n_ranks if "gpu_peak_gib" in s else None,
        "opsm/masked_frac": sum(s[f"opsm_masked/{d}"] for d in domains) / max(sum(s[f"seqs/{d}"] for d in domains), 1),
    }
    for d in domains:
        m[f"opsm/{d}/masked_frac"] = ratio(f"opsm_masked/{d}", f"seqs/{d}") if s[f"seqs/{d}"] else None
        # None (null in metrics.jsonl, absent in W&B) when the domain's kl_coef is 0: its reference is not run.
        m[f"kl/{d}"] = ratio(f"kl_sum/{d}", f"kl_seqs/{d}") if s[f"kl_seqs/{d}"] else None
    return m


class TrainStatSums:
    """A rank's metric sums over one step's micro-batches (`add`), turned into floats by `totals` once the step is
    done. Values computed on the GPU stay there until then: reading one (`float(t)`) blocks the CPU until the GPU has
    caught up, and with a few reads per sample the CPU could never queue kernels ahead of the GPU (the 0.6B benchmark's
    train phase lost ~0.4 s of GPU time a step to such gaps, benchmarks/README.md). `totals` reads them in one copy."""

    def __init__(self) -> None:
        self.host: dict[str, float] = defaultdict(float)
        self.device: dict[str, torch.Tensor] = {}

    def _add(self, key: str, value: torch.Tensor) -> None:
        value = value.detach().double()  # counts stay exact past 2^24 tokens
        self.device[key] = self.device[key] + value if key in self.device else value

    def add(self, batch, out, stats: dict, routing: tuple[int, int], first_minibatch: bool) -> None:
        """One micro-batch. `out` is the trainer's forward (logprobs = pi_theta, and the entropies), `stats` come from
        the objective, `routing` is (mismatched, total) route slots from Keep Routing (ints or device tensors)."""
        mask = batch.loss_mask
        logprobs = out.logprobs.detach()
        tokens = mask.sum()
        self._add("loss/pg", stats["pg_loss"])
        self._add("loss/kl", stats["kl_loss"])
        self._add("clip_tokens", stats["clip_tok_sum"])
        self._add("tokens", tokens)
        if out.entropy is not None:
            self._add("entropy_sum", (out.entropy * mask).sum())
            # NaN where not computed (the support head computes it at a subsample of positions)
            seen = ~torch.isnan(out.full_entropy)
            self._add("full_entropy_sum", (out.full_entropy.nan_to_num(0.0) * mask).sum())
            self._add("full_entropy_tokens", (mask * seen).sum())
        if first_minibatch:
            # Same weights on both sides before the first update: the train/inference mismatch.
            self._add("mismatch_abs_sum", ((batch.inference_logprobs - logprobs).abs() * mask).sum())
            self._add("mismatch_tokens", tokens)
            for key, count in zip(("routing_mismatch", "routing_total"), routing):
                if isinstance(count, torch.Tensor):
                    self._add(key, count)
                else:
                    self.host[key] += count
        if "is_weight_sum" in stats:  # pi_old recomputed by the trainer: truncated importance weights
            self._add("is_weight_sum", stats["is_weight_sum"])
            self._add("is_clip_sum", stats["is_clip_sum"])
        masked, has_ref = ~stats["opsm_keep"], batch.kl_coef > 0
        kl_seq = torch.where(has_ref, stats["kl_seq"], torch.zeros_like(stats["kl_seq"]))
        for domain in sorted(set(batch.domains)):
            rows = [i for i, d in enumerate(batch.domains) if d == domain]
            self.host[f"seqs/{domain}"] += len(rows)
            sel = host_to_device(torch.tensor(rows), masked.device)
            self._add(f"opsm_masked/{domain}", masked[sel].sum())
            self._add(f"kl_sum/{domain}", kl_seq[sel].sum())
            self._add(f"kl_seqs/{domain}", has_ref[sel].sum())

    def totals(self) -> dict[str, float]:
        """Every sum as a float (the device sums in one transfer)."""
        out = dict(self.host)
        if self.device:
            keys = list(self.device)
            values = torch.stack([self.device[k].reshape(()) for k in keys]).tolist()  # float64 (`_add`)
            for k, v in zip(keys, values):  # a key can have both (Keep Routing's counts: ints or tensors)
                out[k] = out.get(k, 0.0) + v
        return out


def step_metrics(step: int, times: dict[str, float], generated_tokens: int, skipped_long_prompts: int) -> dict:
    """The step number, phase timings (`time/<phase>`, seconds), throughput (generated tokens per second: of the
    whole step, and of the rollout workers over `time/generate`, their time on this step's samples, which overlaps
    training when rollout.max_staleness = 1) and the data mixture's count of prompts skipped for length so far."""
    return {
        "step": step,
        **times,
        "throughput/tokens_per_s": generated_tokens / times["time/step"],
        "throughput/rollout_tokens_per_s": generated_tokens / max(times["time/generate"], 1e-9),
        "data/skipped_long_prompts": skipped_long_prompts,
    }


def eval_metrics(trajs: list[Trajectory], k: int, outcome_part: Mapping[str, str], pass_threshold: float) -> dict:
    """Held-out evaluation of k samples per prompt, per domain: `eval/<d>/mean@k` (mean reward of all samples),
    `eval/<d>/pass@k` (share of prompts with at least one passing sample) and `eval/<d>/pass@1` (share of passing
    samples). A sample passes when its domain's outcome part (`outcome_part[d]`, the first reward part) scores at
    least `pass_threshold`."""
    groups: dict[str, dict[str, list[Trajectory]]] = defaultdict(lambda: defaultdict(list))
    for t in trajs:
        groups[t.domain][t.group_id].append(t)
    m: dict[str, float] = {}
    for d, by_prompt in sorted(groups.items()):
        passed = {g: [t.reward_parts.get(outcome_part[d], 0.0) >= pass_threshold for t in ts]
                  for g, ts in by_prompt.items()}
        m[f"eval/{d}/mean@{k}"] = _mean([t.reward for ts in by_prompt.values() for t in ts])
        m[f"eval/{d}/pass@{k}"] = _mean([any(p) for p in passed.values()])
        m[f"eval/{d}/pass@1"] = _mean([x for p in passed.values() for x in p])
        m[f"eval/{d}/prompts"] = float(len(by_prompt))
    return m
