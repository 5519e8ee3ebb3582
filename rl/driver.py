"""The RL loop (runs in the Ray driver process).

    prompts (domain mixture) -> rollout (G samples each) -> rewards -> GRPO advantages -> [reference logprobs]
    -> policy update (mini-batches) -> weight sync -> log -> checkpoint
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from rl.config import ConfigError, resolve_auto, validate
from rl.data import PromptMixture
from rl.losses import grpo_advantages
from rl.metrics import rollout_metrics, trainer_metrics
from rl.models import load_tokenizer, resolve_model_path
from rl.trajectory import Trajectory
from rl.tracking import Tracker

log = logging.getLogger(__name__)


@contextmanager
def timed(times: dict, name: str):
    start = time.perf_counter()
    yield
    times[f"time/{name}"] = time.perf_counter() - start


def model_is_moe(model_path: str, keep_routing) -> bool:
    """Whether the policy is a mixture of experts; with Keep Routing wanted, also that its router is supported."""
    from transformers import AutoConfig

    from rl.routing import UnsupportedMoEError, moe_layer_indices

    config = AutoConfig.from_pretrained(model_path)
    try:
        return moe_layer_indices(config) is not None
    except UnsupportedMoEError as e:
        if keep_routing is False:
            return True  # an MoE we cannot replay, and the user turned replay off: fine
        raise ConfigError(f"algorithm.keep_routing: {e} (set algorithm.keep_routing=false to train without it)") from e


def assign_advantages(trajs: list[Trajectory], cfg: dict) -> None:
    """GRPO advantages per group; samples whose reward failed (not an expected zero) get 0 and no say in the
    group baseline."""
    scored = [t for t in trajs if not t.reward_failed]
    groups = {g: i for i, g in enumerate(dict.fromkeys(t.group_id for t in scored))}
    adv = grpo_advantages(
        torch.tensor([t.reward for t in scored], dtype=torch.float64),
        torch.tensor([groups[t.group_id] for t in scored], dtype=torch.long),
        normalize_std=bool(cfg["algorithm"]["normalize_adv_std"]),
    ) if scored else torch.zeros(0)
    by_uid = dict(zip((t.uid for t in scored), adv.tolist()))
    for t in trajs:
        d = cfg["domains"][t.domain]
        t.advantage, t.kl_coef, t.opsm_delta = by_uid.get(t.uid, 0.0), float(d["kl_coef"]), d.get("opsm_delta")


def make_minibatches(trajs: list[Trajectory], n: int, seed: int, step: int) -> list[list[Trajectory]]:
    order = np.random.default_rng([seed, step, 7]).permutation(len(trajs))
    return [[trajs[i] for i in part] for part in np.array_split(order, n)]


def latest_checkpoint(run_dir: Path) -> Path | None:
    done = sorted(p.parent for p in (run_dir / "checkpoints").glob("step_*/COMPLETE"))
    return done[-1] if done else None


def find_resume(resume, run_dir: Path) -> Path | None:
    """The checkpoint to start from (`trainer.resume`: null | auto | a path); refuses to overwrite a run."""
    latest = latest_checkpoint(run_dir)
    if resume is None:
        if latest is not None:
            raise ConfigError(
                f"trainer.resume: run_dir={run_dir} already has checkpoints (newest {latest.name}); pass "
                "trainer.resume=auto to continue that run, or choose another run_dir"
            )
        return None
    if resume == "auto":
        if latest is None:
            log.warning("trainer.resume=auto: no checkpoint in %s, starting from step 1", run_dir)
        return latest
    path = Path(resume)
    if not (path / "COMPLETE").exists() or not (path / "state.json").exists():
        raise ConfigError(f"trainer.resume={resume}: not a complete checkpoint (no COMPLETE / state.json)")
    return path


def save_checkpoint(cluster, mixture: PromptMixture, run_dir: Path, step: int, keep: int) -> None:
    """Written to a temporary folder and renamed when complete: a crash mid-save never leaves a checkpoint that
    resume would take. Shared storage is assumed when trainer ranks run on several nodes."""
    root = run_dir / "checkpoints"
    final, tmp = root / f"step_{step:06d}", root / f".step_{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    state = {"step": step, "data": mixture.state_dict()}
    cluster.save(str(tmp), state)
    (tmp / "state.json").write_text(json.dumps(state))
    (tmp / "COMPLETE").touch()
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    old = sorted(p.parent for p in root.glob("step_*/COMPLETE"))[:-keep] if keep > 0 else []
    for p in old:
        shutil.rmtree(p, ignore_errors=True)


def train(cfg: dict) -> Path:
    """Run the whole job described by the resolved config; returns the run directory."""
    from rl.cluster import Cluster, start_ray

    validate(cfg)
    from rewards.compose import check_reward_specs, required_fields

    try:
        check_reward_specs(cfg["domains"], cfg["rewards"], cfg["rollout"]["max_new_tokens"])
    except ValueError as e:
        raise ConfigError(str(e)) from e
    run_dir = Path(cfg["run_dir"]).resolve()
    model_path = resolve_model_path(cfg["model"]["path"])
    resolve_auto(cfg, model_is_moe(model_path, cfg["algorithm"]["keep_routing"]))
    tokenizer = load_tokenizer(model_path)
    mixture = PromptMixture(
        cfg["domains"],
        tokenizer,
        seed=cfg["seed"],
        max_prompt_tokens=cfg["data"]["max_prompt_tokens"],
        chat_template_kwargs=cfg["data"].get("chat_template_kwargs"),
        required_fields={d: required_fields(spec["rewards"]) for d, spec in cfg["domains"].items()},
    )
    t, P = cfg["trainer"], int(cfg["data"]["prompts_per_step"])
    ckpt = find_resume(t["resume"], run_dir)
    start_ray(cfg["ray"])
    cluster = Cluster(cfg, model_path)
    start = 0
    if ckpt is not None:
        state = json.loads((ckpt / "state.json").read_text())
        cluster.load(str(ckpt))
        mixture.load_state_dict(state["data"])
        start = int(state["step"])
        cluster.sync_weights()
        log.info("resumed from %s at step %d", ckpt, start + 1)
    tracker = Tracker(cfg, run_dir, int(t["total_steps"]), start, resume=ckpt is not None)
    domains = list(cfg["domains"])
    try:
        for step in range(start + 1, int(t["total_steps"]) + 1):
            times: dict[str, float] = {}
            t0 = time.perf_counter()
            with timed(times, "rollout"):
                prompts = mixture.next_batch(P)
                for i, p in enumerate(prompts):
                    p["group_id"] = f"s{step}-p{i}"
                trajs = cluster.generate(prompts, step)
            with timed(times, "reward"):
                trajs = cluster.score(trajs)
            assign_advantages(trajs, cfg)
            need_ref = [tr for tr in trajs if tr.kl_coef > 0]
            times["time/ref"] = 0.0  # the reference is not run at all when every sample's kl_coef is 0
            if need_ref:
                with timed(times, "ref"):
                    for tr, lp in zip(need_ref, cluster.ref_logprobs(need_ref)):
                        tr.ref_logprobs = lp
            with timed(times, "train"):
                sums = cluster.train(make_minibatches(trajs, int(t["mini_batches"]), cfg["seed"], step))
            with timed(times, "sync"):
                cluster.sync_weights()
            times["time/step"] = time.perf_counter() - t0
            generated = sum(tr.num_response_tokens for tr in trajs)
            tracker.log(
                {
                    "step": step,
                    **rollout_metrics(trajs),
                    **trainer_metrics(sums, domains, int(t["mini_batches"])),
                    **times,
                    "throughput/tokens_per_s": generated / times["time/step"],
                    "throughput/rollout_tokens_per_s": generated / max(times["time/rollout"], 1e-9),
                    "data/skipped_long_prompts": mixture.skipped_too_long,
                }
            )
            tracker.save_rollouts(step, trajs)
            if (t["save_every"] and step % int(t["save_every"]) == 0) or step == int(t["total_steps"]):
                save_checkpoint(cluster, mixture, run_dir, step, int(t["keep_checkpoints"]))
    finally:
        tracker.close()
        cluster.shutdown()
    return run_dir
