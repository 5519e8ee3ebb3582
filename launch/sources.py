"""Where each step's samples come from: the loop's sample source, chosen by the objective (`Objective.source`,
trainer/objectives.py).

- `RolloutSource` (GRPO): prompts (domain mixture) -> rollout (G samples each) -> rewards -> GRPO advantages ->
  [reference logprobs]; after the update, the weight sync to the rollout workers and the held-out eval.
  `rollout.max_staleness` = 1 lets the next step's rollout run while this step trains. Its samples then come from
  weights one update old; OPSM covers the drift, as its statistic reads the engine's logprobs (also with
  algorithm.old_logprobs=trainer, where the ratio's pi_old is the trainer's recomputation and the truncated importance
  weight against the engine's carries the rest, trainer/objectives.py). The weight sync waits for that
  rollout to end (`time/rollout_wait`: how long the trainer waited for the rollout GPUs).
  `data.dynamic_sampling` (DAPO; rl/dynamic_sampling.py): groups without reward variance are dropped and backfill
  rounds of new prompts run, synchronously in `take`, until the step holds `data.prompts_per_step` groups with
  variance or `max_rounds` rounds ran. Agent episodes are filtered as episodes, before `expand_segments`. With
  max_staleness = 1 the first round of step n came from weights one update old, its backfill rounds come from the
  current ones (pi_old is each sample's own engine logprobs, so the loss is right for both), and the next step's
  first round is submitted once they are in: the mixture then draws in one order (step n's rounds, then step n+1's),
  which the checkpointed data position relies on.
- `DatasetSource` (SFT): the next `algorithm.samples_per_step` conversations of `algorithm.dataset`, epoch after
  epoch in a seeded order (rl/sft_data.py); no rollout, reward or reference workers exist.

A source: `start(cluster, tracker, total_steps)`; per step `take(step, times) -> StepSamples` (its phases' seconds go
into `times`), `after_update(step, times) -> metrics` (of the step's samples, once the policy is updated) and
`step_metrics(step, times)`; `state_dict()` / `load_state_dict()`: the data position a checkpoint resumes from;
`domains`: the domain names the objective's metrics are per.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

from launch.cluster import Cluster
from rewards.compose import required_fields
from rl.advantages import assign_advantages, attach_domain_coefficients, expand_segments
from rl.config import ConfigError, packed_step_rows
from rl.data import EvalPrompts, PromptMixture, thinking_modes
from rl.dynamic_sampling import (ROUND_SEED_STRIDE, first_round_prompts, group_order, informative_groups, kept_counts,
                                 next_round, sampling_metrics, select_groups, step_quota)
from rl.metrics import eval_metrics, rollout_metrics, step_metrics
from rl.sft_data import ConversationDataset, load_conversations
from rl.trajectory import Trajectory

log = logging.getLogger(__name__)


@contextmanager
def timed(times: dict, name: str):
    start = time.perf_counter()
    yield
    times[f"time/{name}"] = time.perf_counter() - start


def generated_tokens(episodes: list[Trajectory]) -> int:
    """Tokens the model generated in these episodes, their earlier context segments included (throughput)."""
    return sum(t.num_generated_tokens + sum(s.num_generated_tokens for s in t.segments or ()) for t in episodes)


@dataclass
class StepSamples:
    trajs: list[Trajectory]
    ref_trajs: list[Trajectory] = field(default_factory=list)  # the samples the reference model scored


def make_source(cfg: dict, source: str, tokenizer):
    """The run's sample source ("rollouts" | "dataset"); its data is loaded and checked here, before any actor."""
    return DatasetSource(cfg, tokenizer) if source == "dataset" else RolloutSource(cfg, tokenizer)


class RolloutSource:
    def __init__(self, cfg: dict, tokenizer):
        self.cfg, domains = cfg, cfg["domains"]
        self.domains = list(domains)
        self.parts = {d: [p.get("label", p["name"]) for p in spec["rewards"]] for d, spec in domains.items()}
        self.agents = [d for d, spec in domains.items() if spec.get("agent")]
        self.modes = {d: thinking_modes(spec) for d, spec in domains.items() if thinking_modes(spec)}
        needed = {d: required_fields(spec["rewards"]) for d, spec in domains.items()}
        data = dict(max_prompt_tokens=cfg["data"]["max_prompt_tokens"], required_fields=needed,
                    chat_template_kwargs=cfg["data"].get("chat_template_kwargs"))
        self.mixture = PromptMixture(domains, tokenizer, seed=cfg["seed"], **data)
        self.ev = cfg.get("eval") or {}
        self.evals = held_out_prompts(self.ev, domains, tokenizer, data)
        self.in_flight: deque = deque()  # (step, mixture state before its prompts, weight version, pending rollout)
        self.warned_no_signal = self.warned_short = False
        ds = cfg["data"].get("dynamic_sampling") or {}
        self.dynamic = dict(ds) if ds.get("enabled") else None  # data.dynamic_sampling, None when off
        # distillation's teacher grades every token whatever the rewards: its domains' groups are never dropped
        self.exempt = {d for d, spec in domains.items() if spec.get("teacher")}
        self.unused: list[Trajectory] = []  # generated this step, not trained on (dynamic sampling)
        self.sampling: dict = {}  # the step's dynamic_sampling/* metrics

    def start(self, cluster: Cluster, tracker, total: int) -> None:
        self.cluster, self.tracker, self.total = cluster, tracker, total
        fresh = self.mixture.step == 0
        if self.evals is not None and self.ev.get("before_train") and fresh and not self.ev.get("only"):
            self.evaluate_now(0)

    def evaluate_now(self, step: int) -> dict:
        """The held-out evaluation of the weights the rollout workers hold, logged as a row of `step` that does not
        count as a training step: before step 1 (`eval.before_train`), or the whole run (`eval.only`)."""
        start = time.perf_counter()
        name = f"eval_only_step_{step:06d}" if self.ev.get("only") else None  # not over the run's own eval samples
        metrics = evaluate(self.cluster, self.evals, self.ev, self.parts, step, self.tracker, name)
        row = {"step": step, **metrics, "time/eval": time.perf_counter() - start}
        self.tracker.log(row, counts_as_step=False)
        return row

    def _submit(self, step: int, version: int) -> None:
        """`version`: the weight updates the rollout workers hold now (the step being taken, minus one)."""
        data_state = self.mixture.state_dict()
        n = int(self.cfg["data"]["prompts_per_step"])
        if self.dynamic:
            n = first_round_prompts(n, self.dynamic["oversample"])
        prompts = self.mixture.next_batch(n)
        for i, p in enumerate(prompts):
            p["group_id"] = f"s{step}-p{i}"
        self.in_flight.append((step, data_state, version, self.cluster.submit_rollout(prompts, step)))

    def _fill(self, step: int, ahead: int, version: int) -> None:
        """Rollouts in flight from `step` on, up to `ahead` beyond it (never past the run's last step)."""
        while len(self.in_flight) <= ahead and step + len(self.in_flight) <= self.total:
            self._submit(step + len(self.in_flight), version)

    def next_step_samples(self) -> None:
        """None: the next step's samples come from the weights this step's update makes (see DatasetSource)."""
        return None

    def take(self, step: int, times: dict) -> StepSamples:
        staleness = int(self.cfg["rollout"].get("max_staleness") or 0)
        with timed(times, "rollout"):
            # dynamic sampling: the next step's first round waits for this step's backfill (one order of draws)
            self._fill(step, 0 if self.dynamic else staleness, step - 1)
            _, _, self.version, pending = self.in_flight.popleft()
            # shares are scored as they arrive; a backfill round may follow on the same weights, so no sleep yet
            scoring = self.cluster.collect_rollout(pending, sleep=not self.dynamic)
        times["time/generate"] = pending.generation_seconds()  # the workers' part, also when it overlapped training
        with timed(times, "reward"):  # what scoring is left once the last share is generated
            self.trajs = scoring.collect()
        self.generated = generated_tokens(self.trajs)
        if self.dynamic:
            with timed(times, "backfill"):
                self.trajs = self._backfill(step, self.trajs, times)
            self._fill(step + 1, staleness - 1, step - 1)
        assign_advantages(self.trajs, self.cfg["algorithm"]["normalize_adv_std"])
        # one trajectory per episode for rewards, advantages and metrics; a managed agent episode trains as its
        # context segments, each with the episode's advantage and its share of the episode's weight
        # (rl.advantages.expand_segments: the episode weighs one sequence)
        self.train = expand_segments(self.trajs)
        attach_domain_coefficients(self.train, self.cfg["domains"])
        need_ref = [tr for tr in self.train if tr.kl_coef > 0]
        times["time/ref"] = 0.0  # the reference is not run at all when every sample's kl_coef is 0
        if need_ref:
            with timed(times, "ref"):
                for tr, lp in zip(need_ref, self.cluster.ref_logprobs(need_ref)):
                    tr.ref_logprobs = lp
        if self.cluster.teacher_paths:  # on-policy distillation: each teacher grades its domains' samples
            with timed(times, "teacher"):
                for path in self.cluster.teacher_paths:
                    graded = [tr for tr in self.train if self.cfg["domains"][tr.domain].get("teacher") == path]
                    for tr, lp in zip(graded, self.cluster.teacher_logprobs(path, graded) if graded else []):
                        tr.teacher_logprobs = lp
        return StepSamples(self.train, need_ref)

    def _backfill(self, step: int, first: list[Trajectory], times: dict) -> list[Trajectory]:
        """Dynamic sampling: drop the groups without reward variance, run backfill rounds until each domain's share of
        the step is full or `max_rounds` rounds ran, and return the episodes to train on (rl/dynamic_sampling.py)."""
        ds, n = self.dynamic, int(self.cfg["data"]["prompts_per_step"])
        generated, order = list(first), group_order(first)
        informative = informative_groups(first, self.exempt)
        quota, first_round = step_quota(order, n), {gid for gid, _ in order}
        rounds, drawn = 1, len(order)
        while counts := next_round(quota, kept_counts(order, informative, quota), rounds, int(ds["max_rounds"]),
                                   float(ds["oversample"])):
            rounds += 1
            prompts = self.mixture.next_of_domains(counts)
            for i, p in enumerate(prompts):
                p["group_id"] = f"s{step}-r{rounds}-p{i}"
            drawn += len(prompts)
            pending = self.cluster.submit_rollout(prompts, rounds * ROUND_SEED_STRIDE + step)  # own sampling seeds
            trajs = self.cluster.collect_rollout(pending, sleep=False).collect()
            times["time/generate"] += pending.generation_seconds()
            self.generated += generated_tokens(trajs)
            generated += trajs
            order += group_order(trajs)
            informative |= informative_groups(trajs, self.exempt)
        self.cluster.rollouts_done()  # the last round is in: colocated vLLM may sleep while the trainer trains
        chosen, filled = select_groups(order, informative, quota)
        self.sampling = sampling_metrics(rounds=rounds, prompts_drawn=drawn, prompts_per_step=n, order=order,
                                         informative=informative, chosen=chosen, first_round=first_round,
                                         filled=filled, rewards=[t.reward for t in generated])
        if filled and not self.warned_short:
            self.warned_short = True
            log.warning("step %d: %d rounds (data.dynamic_sampling.max_rounds) found %d of %d groups with reward "
                        "variance; %d zero-variance groups fill the step (advantage 0). Logged every step as "
                        "dynamic_sampling/filled_groups; raise oversample or max_rounds, or check the rewards",
                        step, rounds, n - filled, n, filled)
        keep = set(chosen)
        self.unused = [t for t in generated if t.group_id not in keep]
        return [t for t in generated if t.group_id in keep]

    def after_update(self, step: int, times: dict) -> dict:
        """Weight sync (after the next rollout, if one is in flight, has ended), rollout metrics, held-out eval."""
        if self.in_flight:  # the next rollout ends on the weights it started with before the new ones load
            with timed(times, "rollout_wait"):
                self.in_flight[0][3].wait_generated()
        with timed(times, "sync"):
            times.update({f"time/sync_{part}": s for part, s in self.cluster.sync_weights().items()})
        metrics = rollout_metrics(self.trajs, self.parts, staleness=step - 1 - self.version, agent_domains=self.agents,
                                  domain_modes=self.modes)
        metrics.update(self.sampling)
        if self.evals is not None and (step % int(self.ev["every"]) == 0 or step == self.total):
            with timed(times, "eval"):
                metrics.update(evaluate(self.cluster, self.evals, self.ev, self.parts, step, self.tracker))
        self.tracker.save_rollouts(f"step_{step:06d}", self.trajs)
        if self.unused:  # dynamic sampling: what was generated but not trained on, for reading
            self.tracker.save_rollouts(f"step_{step:06d}_unused", self.unused)
        if metrics["advantage/zero_variance_group_frac"] == 1.0 and not self.warned_no_signal:
            self.warned_no_signal = True
            log.warning("step %d: in every group all samples got the same reward, so every advantage is 0 and this "
                        "step learned nothing (greedy sampling, a constant reward, or tasks too easy/hard for all "
                        "samples); advantage/zero_variance_group_frac tracks it every step", step)
        return metrics

    def step_metrics(self, step: int, times: dict) -> dict:
        return step_metrics(step, times, self.generated, self.mixture.skipped_too_long)

    def state_dict(self) -> dict:
        """The data position to resume from: before the prompts of rollouts still in flight."""
        return self.in_flight[0][1] if self.in_flight else self.mixture.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.mixture.load_state_dict(state)


@dataclass
class DrawnRows:
    """One step's conversations and where the dataset stood right after drawing them."""

    trajs: list[Trajectory]
    state: dict  # ConversationDataset.state_dict() after these rows: the checkpoint's data position
    epoch: float
    truncated: int


class DatasetSource:
    """SFT: each step the next `algorithm.samples_per_step` conversations (rl/sft_data.py), or with
    `algorithm.step_tokens` as many as fill the step's packed rows, rendered and tokenised as they are drawn. The
    next step's are drawn on a thread while this step trains (the driver only waits on the trainer meanwhile), so
    `time/data` is the wait for them, not the rendering (~0.06 s a step of SmolLM2 on an H100 host: ~6% of the step).
    Checkpoints and metrics keep the position after the step's own rows."""

    domains: list[str] = []

    def __init__(self, cfg: dict, tokenizer):
        a = cfg["algorithm"]
        self.data = ConversationDataset(load_conversations(a["dataset"]), tokenizer, seed=cfg["seed"],
                                        max_tokens=a["max_tokens"], chat_template_kwargs=a.get("chat_template_kwargs"))
        self.n = a.get("samples_per_step")
        # algorithm.step_tokens: a step is as many conversations as fill its packed rows (micro-batches), not n
        self.rows = packed_step_rows(cfg)
        self.row_tokens = int(cfg["trainer"]["micro_batch_tokens"] or 0)
        self.total, self.drawn, self.next = 0, None, None
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="sft-data")

    def start(self, cluster: Cluster, tracker, total: int) -> None:
        self.total = total

    def _draw(self) -> DrawnRows:
        if self.rows:
            trajs = self.data.next_packed(self.rows, self.row_tokens)
        else:
            trajs = self.data.next_batch(int(self.n))
        return DrawnRows(trajs, self.data.state_dict(), self.data.epoch, self.data.truncated)

    def take(self, step: int, times: dict) -> StepSamples:
        with timed(times, "data"):
            self.drawn = self.next.result() if self.next is not None else self._draw()
        self.next = self.pool.submit(self._draw) if step < self.total else None
        return StepSamples(self.drawn.trajs)

    def next_step_samples(self) -> list[Trajectory] | None:
        """The next step's conversations, the ones its `take` will return (waits for the thread drawing them; None
        after the last step): the loop submits their update behind this step's. A draw that failed gives None too:
        its error is raised by the next `take`, after this step is logged and checkpointed as it would be."""
        if self.next is None or self.next.exception() is not None:
            return None
        return self.next.result().trajs

    def after_update(self, step: int, times: dict) -> dict:
        """Where the data stands: epochs drawn (fractional), conversations cut at algorithm.max_tokens so far."""
        out = {"sft/epoch": self.drawn.epoch, "sft/truncated": float(self.drawn.truncated),
               "sft/conversations": float(len(self.drawn.trajs))}
        if self.rows:
            tokens = sum(t.num_tokens for t in self.drawn.trajs)
            out.update({"sft/row_fill": tokens / (self.rows * self.row_tokens),
                        "sft/held_over": float(len(self.drawn.state["carry"]))})
        return out

    def step_metrics(self, step: int, times: dict) -> dict:
        return {"step": step, **times}

    def state_dict(self) -> dict:
        return self.drawn.state if self.drawn is not None else self.data.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if self.next is not None:  # rows drawn ahead of the position being restored
            self.next.result()
            self.next = None
        self.data.load_state_dict(state)
        self.drawn = None


def held_out_prompts(ev: dict, domains: dict, tokenizer, data: dict) -> EvalPrompts | None:
    """The eval set, or None when evaluation is off (`eval.every: 0` and not `eval.only`) or has nothing to evaluate
    (warned; with `eval.only` an error)."""
    if not ev.get("every") and not ev.get("only"):
        return None
    evals = EvalPrompts(domains, tokenizer, max_prompts=int(ev.get("max_prompts") or 64), **data)
    if not evals.requests:
        if ev.get("only"):
            raise ConfigError("eval.only=true: no domain has an eval_dataset (or every eval prompt is too long): "
                              "nothing to evaluate")
        log.warning("eval.every=%s but no domain has an eval_dataset (or every eval prompt is too long): no evaluation "
                    "runs", ev["every"])
        return None
    return evals


def evaluate(cluster: Cluster, evals: EvalPrompts, ev: dict, parts: dict, step: int, tracker,
             name: str | None = None) -> dict:
    """Held-out evaluation with the current weights: k samples per prompt, scored by each domain's rewards; the
    samples go to run_dir/rollouts/<name>.jsonl (default eval_step_<step>)."""
    k = int(ev.get("n_samples") or 4)
    overrides = {"n_samples": k, "temperature": ev.get("temperature"), "top_p": ev.get("top_p"),
                 "top_k": ev.get("top_k")}
    # sleep=False: the engine keeps the weights just synced for the next step's rollout (a level-2 sleep drops them)
    # group ids unique per evaluation, as training's are per step (rewards.worker matches early-scored samples by
    # group id and response)
    requests = [{**r, "group_id": f"{r['group_id']}-step{step}"} for r in evals.requests]
    pending = cluster.submit_rollout(requests, 10**6 + step, overrides)
    trajs = cluster.collect_rollout(pending, sleep=False).collect()
    tracker.save_rollouts(name or f"eval_step_{step:06d}", trajs)
    outcome = {d: parts[d][0] for d in evals.domains}
    return eval_metrics(trajs, k, outcome, float(ev.get("pass_threshold", 1.0)))
