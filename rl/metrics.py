"""Every metric key of a step is written here: one flat dict from the trajectories, the trainer ranks' sums and
the loop's phase timings. The trainer adds to its sums with `TrainStatSums` (on each rank); the loop
reduces them with `trainer_metrics`. An objective's own keys (GRPO's loss/pg, opsm/*, ...; SFT's loss/sft) are summed
and reduced by the objective (trainer/objectives.py), which `trainer_metrics` is handed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

import numpy as np
import torch

from rl.metric_keys import tool_call_segments
from rl.trajectory import Trajectory


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
                    staleness: int = 0, agent_domains: list[str] = (),
                    domain_modes: Mapping[str, list[bool]] | None = None) -> dict[str, float | None]:
    """Rewards, lengths and rollout facts of the step's samples. `domain_parts` (domain -> reward part labels, from
    the config), `agent_domains` and `domain_modes` (domain -> its thinking modes, `rl.data.thinking_modes`) make
    every domain's keys appear on every step, null when the step drew no prompt of it (of that mode);
    `staleness` = how many weight updates the sampling weights are behind the trained ones."""
    # every context segment of a managed agent episode: the samples trained on (rl.advantages.expand_segments)
    parts = [s for t in trajs for s in (*(t.segments or ()), t)]
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
        # share of response tokens whose kept set the engine could not record completely (left out of the loss),
        # over every context segment
        "rollout/kept_set_cut_frac": (sum(s.kept_set_cut for s in parts)
                                      / max(sum(s.num_response_tokens for s in parts), 1)),
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
    m.update(mode_metrics(trajs, domain_modes))
    m.update(agent_metrics(trajs, agent_domains))
    return m


MODE_NAMES = {True: "thinking", False: "non_thinking"}


def mode_metrics(trajs: list[Trajectory], domain_modes: Mapping[str, list[bool]] | None = None) -> dict:
    """Per domain and thinking mode (`domains.<d>.thinking`): `mode/<d>/<thinking|non_thinking>/reward_mean` and
    `.../response_length_mean`, for the modes the domain is configured with (`domain_modes`) and any a sample
    carries; null when the step drew no sample of that mode. Samples without a mode (None) are not split."""
    by_mode: dict[tuple[str, bool], list[Trajectory]] = defaultdict(list)
    for t in trajs:
        if t.thinking is not None:
            by_mode[t.domain, bool(t.thinking)].append(t)
    keys = {(d, bool(mode)) for d, modes in (domain_modes or {}).items() for mode in modes or ()} | set(by_mode)
    m: dict[str, float | None] = {}
    for d, mode in sorted(keys, key=lambda k: (k[0], not k[1])):
        ts = by_mode.get((d, mode), [])
        prefix = f"mode/{d}/{MODE_NAMES[mode]}"
        m[f"{prefix}/reward_mean"] = _mean([t.reward for t in ts]) if ts else None
        m[f"{prefix}/response_length_mean"] = _mean([t.num_generated_tokens for t in ts]) if ts else None
    return m


TERMINATIONS = ("submitted", "answer", "max_turns", "length", "tool_timeout", "error")


def agent_metrics(trajs: list[Trajectory], agent_domains: list[str] = ()) -> dict[str, float | None]:
    """Multi-turn episodes, per agent domain `episode/<d>/...`: turns, tool calls (per tool and status), termination
    reasons, generated vs tool tokens, tool latency, the environment verifier's success, context resets and the
    context tokens they dropped (agent.context_strategy); `time/tools`: the slowest
    rollout worker's wall time in tool calls. A domain of `agent_domains` without episodes this step gets nulls
    (the sparse per-tool call counts excepted). Calls of tools the environment does not have (run or skipped), and
    any name that is not a plain key segment, count under the one name `_unknown` (`rl.metric_keys.key_segment`):
    a model inventing names must not invent metric keys."""
    m: dict[str, float | None] = {}
    episodes: dict[str, list[dict]] = defaultdict(list)
    for t in trajs:
        if t.episode is not None:
            episodes[t.domain].append(t.episode)
    for d in agent_domains:
        if d not in episodes:
            for key in ("turns", "tool_calls", "generated_tokens", "tool_tokens", "tool_latency_s", "success",
                        "context_resets", "discarded_tokens", *(f"termination/{r}" for r in TERMINATIONS)):
                m[f"episode/{d}/{key}"] = None
    if agent_domains:
        m["time/tools"] = None
    for d, eps in sorted(episodes.items()):
        calls = [c for e in eps for c in e["calls"]]
        m[f"episode/{d}/turns"] = _mean([e["turns"] for e in eps])
        m[f"episode/{d}/tool_calls"] = _mean([len(e["calls"]) for e in eps])
        m[f"episode/{d}/generated_tokens"] = _mean([e["generated_tokens"] for e in eps])
        m[f"episode/{d}/tool_tokens"] = _mean([e["tool_tokens"] for e in eps])
        m[f"episode/{d}/tool_latency_s"] = _mean([c["seconds"] for c in calls])
        m[f"episode/{d}/success"] = _mean([float(e["outcome"].get("score") or 0.0) for e in eps])
        m[f"episode/{d}/context_resets"] = _mean([e.get("context_resets", 0) for e in eps])  # agent.context_strategy
        m[f"episode/{d}/discarded_tokens"] = _mean([e.get("discarded_tokens", 0) for e in eps])
        for reason in TERMINATIONS:
            m[f"episode/{d}/termination/{reason}"] = _mean([e["termination"] == reason for e in eps])
        counts: dict[str, float] = defaultdict(float)
        for c in calls:
            tool, status = tool_call_segments(c)  # the model's names become keys only through this
            counts[f"episode/{d}/calls/{tool}/{status}"] += 1.0
        m.update(sorted(counts.items()))
    if episodes:
        m["time/tools"] = max(e["tool_wall_s"] for eps in episodes.values() for e in eps)
    return m


def sum_ranks(rank_sums: list[dict]) -> dict[str, float]:
    """The ranks' sums (`TrainStatSums.totals`) added up key by key; a key no rank has reads 0."""
    s: dict[str, float] = defaultdict(float)
    for rs in rank_sums:
        for k, v in rs.items():
            s[k] += v
    return s


def ratio(s: Mapping[str, float], num: str, den: str) -> float:
    """s[num] / s[den], 0 where the denominator is 0 or absent."""
    return s.get(num, 0.0) / s[den] if s.get(den) else 0.0


def trainer_metrics(rank_sums: list[dict], domains: list[str], mini_batches: int,
                    objective_metrics=None) -> dict[str, float | None]:
    """Reduce the ranks' sums (`TrainStatSums.totals`) to the logged values: the trainer's own (entropy, gradient
    norm, learning rate, micro-batching, memory; the train/inference mismatch when an engine sampled the samples),
    then the objective's: `objective_metrics(sums, domains, mini_batches)` reduces the keys its objective summed
    (trainer/objectives.py; GRPO's loss/pg, clip_frac, opsm/*, kl/<d>, tis/*; SFT's loss/sft)."""
    s = sum_ranks(rank_sums)
    n_ranks = max(len(rank_sums), 1)
    m: dict[str, float | None] = {
        # of the distribution the loss is under (the renormalised kept set with Keep Sampling Mask), and of the
        # full vocabulary (what verl/slime log as entropy); equal without kept sets
        "entropy/kept_set": ratio(s, "entropy_sum", "tokens"),
        "entropy/full_vocab": ratio(s, "full_entropy_sum", "full_entropy_tokens"),
        "grad_norm": s["grad_norm"] / max(s["optimizer_steps"], 1),
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
    }
    if "rank_seconds" in s:  # the ranks' own time in the update: time/train minus it is the calls' dispatch
        m["time/train_rank"] = s["rank_seconds"] / n_ranks
    if "payload_bytes" in s:  # samples whose per-token arrays came by reference (rollout.payload_by_reference)
        m["time/payload_fetch"] = s["payload_fetch_s"] / n_ranks
        m["perf/payload_fetched_mb"] = s["payload_bytes"] / 1e6
    if "mismatch_tokens" in s:  # samples an engine sampled (not dataset rows), before the step's first update
        m["mismatch/logprob_abs"] = ratio(s, "mismatch_abs_sum", "mismatch_tokens")
        m["mismatch/routing_frac"] = ratio(s, "routing_mismatch", "routing_total")
    if objective_metrics is not None:
        m.update(objective_metrics(s, domains, mini_batches))
    return m


def forward_sums(batch, out, routing: tuple, first_minibatch: bool) -> dict:
    """A micro-batch's sums that do not depend on the objective: its loss tokens, the policy's entropy over them and,
    on the first mini-batch (the same weights as the engine's) of samples an engine sampled, the train/inference
    mismatch: of the logprobs, and Keep Routing's route slots `routing` = (mismatched, total), ints or device
    tensors. `out` is the trainer's forward (logprobs = pi_theta, and the entropies). Nothing is read back."""
    mask = batch.loss_mask
    tokens = mask.sum()
    s: dict = {"tokens": tokens}
    if out.entropy is not None:
        s["entropy_sum"] = (out.entropy * mask).sum()
        if out.full_entropy is out.entropy:  # no kept sets: the same entropy (`token_logprobs`), the same sums
            s["full_entropy_sum"], s["full_entropy_tokens"] = s["entropy_sum"], tokens
        else:  # NaN where not computed (the support head computes it at a subsample of positions)
            seen = ~torch.isnan(out.full_entropy)
            s["full_entropy_sum"] = (out.full_entropy.nan_to_num(0.0) * mask).sum()
            s["full_entropy_tokens"] = (mask * seen).sum()
    if first_minibatch and batch.inference_logprobs is not None:
        s["mismatch_abs_sum"] = ((batch.inference_logprobs - out.logprobs.detach()).abs() * mask).sum()
        s["mismatch_tokens"] = tokens
        s["routing_mismatch"], s["routing_total"] = routing
    return s


class TrainStatSums:
    """A rank's metric sums over one step's micro-batches (`add`), turned into floats by `totals` once the step is
    done. Values computed on the GPU stay there until then: reading one (`float(t)`) blocks the CPU until the GPU has
    caught up, and with a few reads per sample the CPU could never queue kernels ahead of the GPU (the 0.6B benchmark's
    train phase lost ~0.4 s of GPU time a step to such gaps, benchmarks/README.md). Nor are they added up as they
    come (a cast and an add per key and micro-batch, ~10 kernel launches a micro-batch on a CPU-bound step): `totals`
    brings them over in one copy (per device and dtype) and adds them up on the host, in float64 and in the order
    they came (the same sums as adding them on the device in float64). A tensor must keep its value once added
    (the trainer's are fresh results, never written to later). It sums whatever it is given: the keys are
    `forward_sums`' and the objective's (trainer/objectives.py)."""

    def __init__(self) -> None:
        self.host: dict[str, float] = defaultdict(float)
        self.pending: list[tuple[str, torch.Tensor]] = []  # (key, one micro-batch's value), in order

    def add(self, sums: Mapping) -> None:
        """One micro-batch's sums: a tensor is kept as it is (summed in `totals`), a Python number added on the host."""
        for key, value in sums.items():
            if isinstance(value, torch.Tensor):
                self.pending.append((key, value.detach().reshape(())))
            else:
                self.host[key] += value

    def totals(self) -> dict[str, float]:
        """Every sum as a float: the tensors in one transfer per device and dtype (a stack, then float64), added up on
        the host in float64 and in order (counts stay exact past 2^24 tokens)."""
        out = dict(self.host)
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, (_, value) in enumerate(self.pending):
            groups[value.device, value.dtype].append(i)
        values: dict[int, float] = {}
        for idx in groups.values():
            values.update(zip(idx, torch.stack([self.pending[i][1] for i in idx]).double().tolist()))
        sums: dict[str, float] = {}
        for i, (key, _) in enumerate(self.pending):
            sums[key] = sums[key] + values[i] if key in sums else values[i]
        for k, v in sums.items():  # a key can have both (Keep Routing's counts: ints or tensors)
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
    samples), with k itself as `eval/k`. The names hold the letter k, not its value, so runs with another
    `eval.n_samples` land on the same charts. A sample passes when its domain's outcome part (`outcome_part[d]`,
    the first reward part) scores at least `pass_threshold`."""
    groups: dict[str, dict[str, list[Trajectory]]] = defaultdict(lambda: defaultdict(list))
    for t in trajs:
        groups[t.domain][t.group_id].append(t)
    m: dict[str, float] = {"eval/k": float(k)}
    for d, by_prompt in sorted(groups.items()):
        passed = {g: [t.reward_parts.get(outcome_part[d], 0.0) >= pass_threshold for t in ts]
                  for g, ts in by_prompt.items()}
        m[f"eval/{d}/mean@k"] = _mean([t.reward for ts in by_prompt.values() for t in ts])
        m[f"eval/{d}/pass@k"] = _mean([any(p) for p in passed.values()])
        m[f"eval/{d}/pass@1"] = _mean([x for p in passed.values() for x in p])
        m[f"eval/{d}/prompts"] = float(len(by_prompt))
    return m
