"""The RL loop (runs in the Ray driver process):

    prompts (domain mixture) -> rollout (G samples each) -> rewards -> GRPO advantages -> [reference logprobs]
    -> policy update (mini-batches) -> weight sync -> log -> checkpoint

`rollout.max_staleness` = k lets the rollouts of the next k steps run while this step trains (0: synchronous).
Their samples then come from weights k updates old; pi_old is still the engine's, and OPSM covers the drift.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path

from launch.checkpoint import find_resume, load_checkpoint_state, save_checkpoint
from launch.cluster import Cluster, start_ray
from launch.config import prepare
from launch.tracking import Tracker
from rewards.compose import required_fields
from rl.advantages import assign_advantages, attach_domain_coefficients
from rl.batching import minibatches
from rl.data import PromptMixture
from rl.metrics import rollout_metrics, step_metrics, trainer_metrics
from rl.models import load_tokenizer

log = logging.getLogger(__name__)


@contextmanager
def timed(times: dict, name: str):
    start = time.perf_counter()
    yield
    times[f"time/{name}"] = time.perf_counter() - start


def train(cfg: dict) -> Path:
    """Run the whole job described by the resolved config; returns the run directory."""
    model_path = prepare(cfg)
    run_dir, t = Path(cfg["run_dir"]).resolve(), cfg["trainer"]
    total, domains = int(t["total_steps"]), list(cfg["domains"])
    mixture = PromptMixture(
        cfg["domains"], load_tokenizer(model_path), seed=cfg["seed"],
        max_prompt_tokens=cfg["data"]["max_prompt_tokens"], chat_template_kwargs=cfg["data"].get("chat_template_kwargs"),
        required_fields={d: required_fields(spec["rewards"]) for d, spec in cfg["domains"].items()},
    )
    ckpt = find_resume(t["resume"], run_dir)
    start_ray(cfg["ray"])
    cluster = Cluster(cfg, model_path)
    start = 0
    if ckpt is not None:
        state = load_checkpoint_state(ckpt)
        cluster.load(str(ckpt))
        mixture.load_state_dict(state["data"])
        start = int(state["step"])
        cluster.sync_weights()
        log.info("resumed from %s at step %d", ckpt, start + 1)
    tracker = Tracker(cfg, run_dir, total, start, resume=ckpt is not None)
    in_flight: deque = deque()  # (step, mixture state before its prompts, weight version, pending rollout)

    def submit_rollout(step: int) -> None:
        data_state = mixture.state_dict()
        prompts = mixture.next_batch(int(cfg["data"]["prompts_per_step"]))
        for i, p in enumerate(prompts):
            p["group_id"] = f"s{step}-p{i}"
        in_flight.append((step, data_state, step - 1 - len(in_flight), cluster.submit_rollout(prompts, step)))

    try:
        for step in range(start + 1, total + 1):
            times: dict[str, float] = {}
            t0 = time.perf_counter()
            with timed(times, "rollout"):
                while len(in_flight) <= int(cfg["rollout"].get("max_staleness") or 0) and step + len(in_flight) <= total:
                    submit_rollout(step + len(in_flight))
                _, _, version, pending = in_flight.popleft()
                trajs = cluster.collect_rollout(pending)
            with timed(times, "reward"):
                trajs = cluster.score(trajs)
            assign_advantages(trajs, cfg["algorithm"]["normalize_adv_std"])
            attach_domain_coefficients(trajs, cfg["domains"])
            need_ref = [tr for tr in trajs if tr.kl_coef > 0]
            times["time/ref"] = 0.0  # the reference is not run at all when every sample's kl_coef is 0
            if need_ref:
                with timed(times, "ref"):
                    for tr, lp in zip(need_ref, cluster.ref_logprobs(need_ref)):
                        tr.ref_logprobs = lp
            with timed(times, "train"):
                sums = cluster.train(minibatches(trajs, int(t["mini_batches"]), cfg["seed"], step))
            with timed(times, "sync"):
                cluster.sync_weights()
            times["time/step"] = time.perf_counter() - t0
            generated = sum(tr.num_response_tokens for tr in trajs)
            tracker.log({
                **step_metrics(step, times, generated, mixture.skipped_too_long),
                **rollout_metrics(trajs, staleness=step - 1 - version),
                **trainer_metrics(sums, domains, int(t["mini_batches"])),
            })
            tracker.save_rollouts(step, trajs)
            if (t["save_every"] and step % int(t["save_every"]) == 0) or step == total:
                # The data position to resume from is before the prompts of rollouts still in flight.
                data = in_flight[0][1] if in_flight else mixture.state_dict()
                save_checkpoint(cluster, {"step": step, "data": data}, run_dir, step, int(t["keep_checkpoints"]))
    finally:
        tracker.close()
        cluster.shutdown()
    return run_dir
