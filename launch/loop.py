"""The RL loop (runs in the Ray driver process):

    prompts (domain mixture) -> rollout (G samples each) -> rewards -> GRPO advantages -> [reference logprobs]
    -> policy update (mini-batches) -> weight sync -> [held-out eval] -> log -> checkpoint

`rollout.max_staleness` = 1 lets the next step's rollout run while this step trains (0: synchronous). Its samples
then come from weights one update old; pi_old is still the engine's, and OPSM covers the drift. The weight sync
waits for that rollout to end (`time/rollout_wait`: how long the trainer waited for the rollout GPUs).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path

from launch.checkpoint import RunError, find_resume, load_checkpoint_state, save_checkpoint
from launch.cluster import Cluster, start_ray
from launch.config import prepare
from launch.run_dir import RunDirLock, write_config
from launch.tracking import Tracker
from rewards.compose import required_fields
from rl.advantages import assign_advantages, attach_domain_coefficients
from rl.batching import minibatches
from rl.data import EvalPrompts, PromptMixture
from rl.flops import PerfMeter, load_body_flops, resolve_peak_tflops
from rl.metrics import eval_metrics, rollout_metrics, step_metrics, trainer_metrics
from rl.models import load_tokenizer

log = logging.getLogger(__name__)


@contextmanager
def timed(times: dict, name: str):
    start = time.perf_counter()
    yield
    times[f"time/{name}"] = time.perf_counter() - start


def train(cfg: dict) -> dict:
    """Run the whole job described by the resolved config; returns the run's summary (launch/tracking.py)."""
    launched = time.time()
    model_path = prepare(cfg)
    run_dir, t = Path(cfg["run_dir"]).resolve(), cfg["trainer"]
    lock = RunDirLock(run_dir)  # before anything is written there
    cluster = tracker = None
    try:
        total, domains = int(t["total_steps"]), cfg["domains"]
        parts = {d: [p.get("label", p["name"]) for p in spec["rewards"]] for d, spec in domains.items()}
        agents = [d for d, spec in domains.items() if spec.get("agent")]
        tokenizer, needed = load_tokenizer(model_path), {d: required_fields(spec["rewards"]) for d, spec in domains.items()}
        data = dict(max_prompt_tokens=cfg["data"]["max_prompt_tokens"], required_fields=needed,
                    chat_template_kwargs=cfg["data"].get("chat_template_kwargs"))
        mixture = PromptMixture(domains, tokenizer, seed=cfg["seed"], **data)
        ev = cfg.get("eval") or {}
        evals = held_out_prompts(ev, domains, tokenizer, data)
        candidates = find_resume(t["resume"], run_dir)
        write_config(run_dir, cfg)
        start_ray(cfg["ray"], run_dir, cfg["logger"])
        cluster = Cluster({**cfg, "run_dir": str(run_dir)}, model_path)  # actors write there (trainer.profile_step)
        start = resume(cluster, mixture, candidates)
        tracker = Tracker(cfg, run_dir, total, start, resume=bool(candidates), launched=launched)
        peak = resolve_peak_tflops(t.get("peak_tflops"), cluster.trainer_device_name())
        perf = PerfMeter(load_body_flops(model_path), peak, int(t["num_processes"]),
                         recompute_old=cfg["algorithm"].get("old_logprobs") == "trainer")
        in_flight: deque = deque()  # (step, mixture state before its prompts, weight version, pending rollout)
        warned_no_signal = False

        def submit_rollout(step: int) -> None:
            data_state = mixture.state_dict()
            prompts = mixture.next_batch(int(cfg["data"]["prompts_per_step"]))
            for i, p in enumerate(prompts):
                p["group_id"] = f"s{step}-p{i}"
            in_flight.append((step, data_state, step - 1 - len(in_flight), cluster.submit_rollout(prompts, step)))

        for step in range(start + 1, total + 1):
            times: dict[str, float] = {}
            t0 = time.perf_counter()
            with timed(times, "rollout"):
                while len(in_flight) <= int(cfg["rollout"].get("max_staleness") or 0) and step + len(in_flight) <= total:
                    submit_rollout(step + len(in_flight))
                _, _, version, pending = in_flight.popleft()
                scoring = cluster.collect_rollout(pending)  # shares are scored as they arrive
            times["time/generate"] = pending.generation_seconds()  # the workers' part, also when it overlapped training
            with timed(times, "reward"):  # what scoring is left once the last share is generated
                trajs = scoring.collect()
            assign_advantages(trajs, cfg["algorithm"]["normalize_adv_std"])
            attach_domain_coefficients(trajs, domains)
            need_ref = [tr for tr in trajs if tr.kl_coef > 0]
            times["time/ref"] = 0.0  # the reference is not run at all when every sample's kl_coef is 0
            if need_ref:
                with timed(times, "ref"):
                    for tr, lp in zip(need_ref, cluster.ref_logprobs(need_ref)):
                        tr.ref_logprobs = lp
            with timed(times, "train"):
                sums = cluster.train(minibatches(trajs, int(t["mini_batches"]), cfg["seed"], step))
            if in_flight:  # the next rollout ends on the weights it started with before the new ones load
                with timed(times, "rollout_wait"):
                    in_flight[0][3].wait_generated()
            with timed(times, "sync"):
                times.update({f"time/sync_{part}": s for part, s in cluster.sync_weights().items()})
            metrics = rollout_metrics(trajs, parts, staleness=step - 1 - version, agent_domains=agents)
            if evals is not None and (step % int(ev["every"]) == 0 or step == total):
                with timed(times, "eval"):
                    metrics.update(evaluate(cluster, evals, ev, parts, step, tracker))
            tracker.save_rollouts(f"step_{step:06d}", trajs)
            generated = sum(tr.num_generated_tokens for tr in trajs)
            metrics.update(perf.metrics(trajs, need_ref, times))
            metrics.update(trainer_metrics(sums, list(domains), int(t["mini_batches"])))
            times["time/step"] = time.perf_counter() - t0  # all of the step but writing its metrics (and a checkpoint)
            tracker.log({**step_metrics(step, times, generated, mixture.skipped_too_long), **metrics})
            if metrics["advantage/zero_variance_group_frac"] == 1.0 and not warned_no_signal:
                warned_no_signal = True
                log.warning("step %d: in every group all samples got the same reward, so every advantage is 0 and this "
                            "step learned nothing (greedy sampling, a constant reward, or tasks too easy/hard for all "
                            "samples); advantage/zero_variance_group_frac tracks it every step", step)
            if (t["save_every"] and step % int(t["save_every"]) == 0) or step == total:
                # The data position to resume from is before the prompts of rollouts still in flight.
                state = {"step": step, "data": in_flight[0][1] if in_flight else mixture.state_dict()}
                save_checkpoint(cluster, state, run_dir, step, int(t["keep_checkpoints"]))
    finally:  # also when start-up failed part-way: close what was started, and free the run_dir
        try:
            summary = tracker.close() if tracker is not None else None
        finally:
            if cluster is not None:
                cluster.shutdown()
            lock.release()
    return summary


def resume(cluster: Cluster, mixture: PromptMixture, candidates: list[Path]) -> int:
    """Load the first candidate checkpoint that loads (a damaged one gives way to the next, with a warning);
    returns its step (0: a fresh run)."""
    for ckpt in candidates:
        try:
            state = load_checkpoint_state(ckpt)
            cluster.load(str(ckpt))
        except Exception as e:  # noqa: BLE001 - a rank's load error arrives wrapped by Ray
            last = [ln for ln in str(e).strip().splitlines() if ln.strip()]
            log.warning("checkpoint %s does not load (%s); trying an older one", ckpt, last[-1][:200] if last else e)
            continue
        mixture.load_state_dict(state["data"])
        cluster.sync_weights()
        log.info("resumed from %s at step %d", ckpt, int(state["step"]) + 1)
        return int(state["step"])
    if candidates:
        raise RunError(f"no checkpoint of {candidates[0].parent} loads (see the warnings above); start a new run_dir "
                       "or repair the newest checkpoint")
    return 0


def held_out_prompts(ev: dict, domains: dict, tokenizer, data: dict) -> EvalPrompts | None:
    """The eval set, or None when evaluation is off (`eval.every: 0`) or has nothing to evaluate (warned)."""
    if not ev.get("every"):
        return None
    evals = EvalPrompts(domains, tokenizer, max_prompts=int(ev.get("max_prompts") or 64), **data)
    if not evals.requests:
        log.warning("eval.every=%s but no domain has an eval_dataset (or every eval prompt is too long): no evaluation "
                    "runs", ev["every"])
        return None
    return evals


def evaluate(cluster: Cluster, evals: EvalPrompts, ev: dict, parts: dict, step: int, tracker) -> dict:
    """Held-out evaluation with the current weights: k samples per prompt, scored by each domain's rewards."""
    k = int(ev.get("n_samples") or 4)
    overrides = {"n_samples": k, "temperature": ev.get("temperature"), "top_p": ev.get("top_p"),
                 "top_k": ev.get("top_k")}
    # sleep=False: the engine keeps the weights just synced for the next step's rollout (a level-2 sleep drops them)
    # group ids unique per evaluation, as training's are per step (rewards.worker matches early-scored samples by
    # group id and response)
    requests = [{**r, "group_id": f"{r['group_id']}-step{step}"} for r in evals.requests]
    pending = cluster.submit_rollout(requests, 10**6 + step, overrides)
    trajs = cluster.collect_rollout(pending, sleep=False).collect()
    tracker.save_rollouts(f"eval_step_{step:06d}", trajs)
    outcome = {d: parts[d][0] for d in evals.domains}
    return eval_metrics(trajs, k, outcome, float(ev.get("pass_threshold", 1.0)))
