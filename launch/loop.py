"""The training loop (runs in the Ray driver process), one for every objective:

    samples from the objective's source -> policy update (mini-batches) -> [weight sync, held-out eval] -> log
    -> checkpoint

A dataset source knows the next step's samples before this step's update ends: their update is submitted right
behind this one (`update`), so the trainer ranks do not wait for the driver between steps.

The source (launch/sources.py) is the rollouts for GRPO (prompts -> rollout -> rewards -> advantages -> [reference
logprobs], then the weight sync) or a dataset for SFT (the next conversations; no rollout, reward or reference
workers start). The objective (trainer/objectives.py) is the loss the trainer takes and the metrics it logs.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from launch.checkpoint import RunError, find_resume, load_checkpoint_state, save_checkpoint, set_aside_newer
from launch.cluster import Cluster, start_ray
from launch.config import prepare
from launch.run_dir import RunDirLock, write_config
from launch.sources import make_source, timed
from launch.startup import StartupTimeline, warn_uncached_bytecode
from launch.tracking import Tracker
from rollout.vllm_model_info import ModelInfoPrewarm, prewarm_wanted
from rl.batching import minibatches
from rl.flops import PerfMeter, load_body_flops, resolve_peak_tflops
from rl.metrics import trainer_metrics
from rl.models import load_tokenizer
from trainer.objectives import OBJECTIVES, objective_of

log = logging.getLogger(__name__)


def start_prewarm(cfg: dict, timeline: StartupTimeline) -> ModelInfoPrewarm | None:
    """vLLM's answers about the model's class, worked out while the model is found and Ray starts (rollout/
    vllm_model_info.py; marked `vllm_model_info` on the timeline when written); None for a run without vLLM rollouts."""
    objective = OBJECTIVES.get(str(cfg["algorithm"].get("objective", "grpo")))  # an unknown one: prepare() says so
    if objective is None or objective.source != "rollouts" or not prewarm_wanted(cfg["rollout"]):
        return None
    return ModelInfoPrewarm(lambda _: timeline.mark("vllm_model_info"))


def train(cfg: dict, launched: float | None = None) -> dict:
    """Run the whole job described by the resolved config; returns the run's summary (launch/tracking.py).
    `launched`: when the command started (time.time()), where the start-up timeline counts from."""
    timeline = StartupTimeline(launched or time.time())
    warn_uncached_bytecode()
    prewarm = start_prewarm(cfg, timeline)
    lock = cluster = tracker = None
    try:
        model_path = prepare(cfg)
        if prewarm is not None:
            prewarm.send(model_path)
        timeline.mark("model")  # found, converted or built
        run_dir, t = Path(cfg["run_dir"]).resolve(), cfg["trainer"]
        lock = RunDirLock(run_dir)  # before anything is written there
        total, objective = int(t["total_steps"]), objective_of(cfg)
        source = make_source(cfg, objective.source, load_tokenizer(model_path))  # its data checked before any actor
        candidates = find_resume(t["resume"], run_dir)
        write_config(run_dir, cfg)
        timeline.mark("data")
        start_ray(cfg["ray"], run_dir, cfg["logger"])
        timeline.mark("ray")
        only = bool((cfg.get("eval") or {}).get("only"))
        # actors write there (trainer.profile_step); eval.only of model.path (no checkpoint to resume) needs no trainer
        trainers = not (only and not candidates)
        cluster = Cluster({**cfg, "run_dir": str(run_dir)}, model_path, timeline, trainers=trainers)
        # eval.only writes no checkpoint, so it leaves the run's checkpoints where they are
        start = resume(cluster, source, candidates, run_dir=None if only else run_dir)
        if only:  # verl's val_only: evaluate the weights the run starts from (a row of step `start`), train nothing
            total = start
        tracker = Tracker(cfg, run_dir, total, start, resume=bool(candidates), launched=timeline.launched,
                          start_up=timeline.ordered, truncate=not only)
        source.start(cluster, tracker, total)
        if only:
            source.evaluate_now(start)
        peak = (resolve_peak_tflops(t.get("peak_tflops", "auto"), cluster.trainer_device_name()) if cluster.trainers
                else None)  # absent: auto, as conf/trainer/deepspeed.yaml
        perf = PerfMeter(load_body_flops(model_path), peak, int(t["num_processes"]),
                         recompute_old=cfg["algorithm"].get("old_logprobs") == "trainer")
        split = lambda trajs, s: minibatches(trajs, int(t["mini_batches"]), cfg["seed"], s)  # noqa: E731
        queued, results_at = None, 0.0  # the next step's update, submitted behind this one's (see `update`)
        for step in range(start + 1, total + 1):
            times: dict[str, float] = {}
            t0 = time.perf_counter()
            samples = source.take(step, times)
            sent_before = queued is not None
            with timed(times, "train"):
                sums, queued = update(cluster, source, split, samples, step, queued, checkpoint_due(step, total, t))
            if sent_before:  # the rank began it when the previous update ended: time/train is the rank's period
                times["time/train"] = time.perf_counter() - results_at
            results_at = time.perf_counter()
            metrics = source.after_update(step, times)
            metrics.update(perf.metrics(samples.trajs, samples.ref_trajs, times))
            metrics.update(trainer_metrics(sums, source.domains, int(t["mini_batches"]), objective.metrics))
            times["time/step"] = time.perf_counter() - t0  # all of the step but writing its metrics (and a checkpoint)
            tracker.log({**source.step_metrics(step, times), **metrics})
            if step == start + 1:
                timeline.mark("first_step")
                log.info("start-up: %s", timeline.format())
            if checkpoint_due(step, total, t):
                state = {"step": step, "data": source.state_dict()}
                save_checkpoint(cluster, state, run_dir, step, int(t["keep_checkpoints"]))
    finally:  # also when start-up failed part-way: close what was started, and free the run_dir
        try:
            summary = tracker.close() if tracker is not None else None
        finally:
            if cluster is not None:
                cluster.shutdown()
            if prewarm is not None:
                prewarm.stop()
            if lock is not None:
                lock.release()
    return summary


def update(cluster: Cluster, source, split, samples, step: int, queued: list | None, checkpoint_after: bool):
    """The step's policy update: the one submitted a step ahead (`queued`) or sent now. When the source already
    knows the next step's samples (a dataset) and no checkpoint must save this step's state first, the next update
    is submitted right behind this one: a rank runs its calls in order, so it goes on without waiting for the
    driver's round trip (~10 ms of a 0.2 s SFT step of SmolLM2 on an H200). Returns (this step's metric sums, the
    next step's submitted update or None)."""
    submitted = queued or cluster.submit_train(split(samples.trajs, step))
    ahead = None if checkpoint_after else source.next_step_samples()
    queued = cluster.submit_train(split(ahead, step + 1)) if ahead else None
    return cluster.train_results(submitted), queued


def checkpoint_due(step: int, total: int, tcfg: dict) -> bool:
    """After this step: every `trainer.save_every` steps, and after the last one unless `trainer.save_last` is off."""
    every = int(tcfg["save_every"] or 0)
    return bool(every and step % every == 0) or (step == total and bool(tcfg.get("save_last", True)))


def resume(cluster: Cluster, source, candidates: list[Path], run_dir: Path | None = None) -> int:
    """Load the first candidate checkpoint that loads, weights and data position (a damaged one gives way to the
    next, with a warning); returns its step (0: a fresh run). `run_dir`: the run's own folder; once a checkpoint is
    loaded, every newer one there (skipped as damaged, failed to load, or passed over by an explicit
    trainer.resume) is moved aside (launch/checkpoint.py `set_aside_newer`), so the checkpoints this run writes are
    never pruned in favour of one it did not continue, and a later resume=auto continues this run."""
    fresh = source.state_dict() if candidates else None  # what a half-loaded data position is reset to
    failed: dict[Path, str] = {}
    for ckpt in candidates:
        touched = False
        try:
            state = load_checkpoint_state(ckpt)
            step = int(state["step"])
            cluster.load(str(ckpt))
            touched = True
            source.load_state_dict(state["data"])
        except Exception as e:  # noqa: BLE001 - a rank's load error arrives wrapped by Ray
            last = [ln for ln in str(e).strip().splitlines() if ln.strip()]
            failed[ckpt] = last[-1][:200] if last else type(e).__name__
            log.warning("checkpoint %s does not load (%s); trying an older one", ckpt, failed[ckpt])
            if touched:
                source.load_state_dict(fresh)
            continue
        cluster.sync_weights()  # to the rollout workers (none for a dataset source)
        if run_dir is not None:
            set_aside_newer(run_dir, ckpt, step, failed)
        log.info("resumed from %s at step %d", ckpt, step + 1)
        return step
    if candidates:
        raise RunError(f"no checkpoint of {candidates[0].parent} loads (see the warnings above); start a new run_dir "
                       "or repair the newest checkpoint")
    return 0
