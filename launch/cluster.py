"""The actors of a run and the calls that fan work out to them (runs in the Ray driver).

Roles, one class each: `rollout.worker.RolloutWorker`, `rewards.worker.RewardWorker`,
`rollout.judge_worker.JudgeWorker` (when a domain uses the rubric judge), `trainer.policy.PolicyTrainer` (one per
data-parallel rank) and `trainer.frozen.FrozenModel` (the KL reference, when a domain has kl_coef > 0; and one per
distinct distillation teacher, algorithm.objective=distill; with `trainer.ref_placement=sharded` these live inside
the trainer ranks instead, partitioned over them, and each rank scores a share of the samples). An objective
that trains on a dataset (SFT: `Objective.source`) starts the trainer ranks only.
Rollout and reward workers are stateless apart from weights, so one that dies or hangs is replaced (and re-synced)
and its share retried once; a dead trainer rank ends the run with a pointer to the last checkpoint. Calls to a
pool are submitted and collected separately, so a rollout can run while the trainer trains (the loop's
`rollout.max_staleness`).
"""

from __future__ import annotations

import copy
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError

from launch.placement import GpuPlacement, check_cpu_reservations, teachers_of, tensor_parallel_size
from launch.startup import StartupTimeline
from rewards.judge import uses_rubric_judge
from rewards.worker import RewardWorker
from rl.batching import minibatch_norm, split_even
from rl.config import (
    ROLLOUT_DEFAULTS, engines_per_gpu, frozen_models_sharded, is_split_vllm_on_gpu_shares, needs_reference,
)
from rl.engine_specs import engine_spec, placement_spec
from rl.trajectory import Trajectory
from rollout.judge_worker import JudgeWorker
from rollout.payload_holder import PayloadHolder
from rollout.worker import RolloutWorker
from trainer.dist import node_address, open_store
from trainer.frozen import FrozenModel
from trainer.objectives import objective_of
from trainer.policy import PolicyTrainer

log = logging.getLogger(__name__)
# Environment variables every actor inherits from the driver (offline switches, caches, W&B, DeepSpeed).
FORWARDED_ENV = ("HF_", "TRANSFORMERS_", "WANDB_", "MIXRL_", "TOKENIZERS_", "DS_")


def start_ray(ray_cfg: dict, run_dir: Path, lcfg: dict) -> None:
    """Join `ray.address` or start a local cluster. Workers inherit the driver's offline/cache/W&B environment; with
    `logger.worker_logs=file` their output (logging, prints, library noise) goes to run_dir/train.log instead of
    breaking up the driver's progress bar."""
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    to_file = lcfg.get("worker_logs", "file") == "file"
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_ENV)}
    runtime_env: dict = {"env_vars": env}
    if to_file:
        env["MIXRL_WORKER_LOG"] = str(run_dir / "train.log")
        runtime_env["worker_process_setup_hook"] = "launch.worker_logs.to_run_log"
    if ray_cfg.get("address"):
        ray.init(address=ray_cfg["address"], log_to_driver=not to_file, runtime_env=runtime_env)
    else:
        ray.init(num_cpus=ray_cfg.get("num_cpus"), num_gpus=ray_cfg.get("num_gpus"), include_dashboard=False,
                 log_to_driver=not to_file, runtime_env=runtime_env)


def when_ready(ref: ray.ObjectRef, callback: Callable[[], None]) -> None:
    """Run `callback()` on a Ray thread once `ref`'s task has ended (its value or its error exists). Newer Ray's
    `_on_ready` does not fetch the value; `future()` fetches and deserializes it, once more than the caller will."""
    if hasattr(ref, "_on_ready"):
        ref._on_ready(lambda _error: callback())
    else:
        ref.future().add_done_callback(lambda _future: callback())


class _Call:
    """One call on one pool actor, for its deadline. An actor runs its calls one at a time, so a call starts once
    its arguments are ready (`ready_at`: its submission; a call on the result of another call: when that is in) and
    the call submitted before it on the same actor (`prev`) has ended. It is overdue `timeout_s` after it started;
    queued behind a call still running, it is overdue `timeout_s` after that call is."""

    def __init__(self, ref: ray.ObjectRef, ready_at: float | None, prev: "_Call | None"):
        self.ready_at, self.prev, self.ended = ready_at, prev, None
        when_ready(ref, self._end)  # the closure holds no reference to the result

    def _end(self) -> None:  # on a Ray thread
        self.ended = time.perf_counter()
        self.prev = None  # keeps no chain of earlier calls alive

    def arguments_ready(self) -> None:
        """Its arguments are in (a call made on another call's result, whose deadline could not count before)."""
        self.ready_at = time.perf_counter()

    def deadline(self, timeout_s: float) -> float:
        """perf_counter() past which it is overdue; inf while its arguments are not in."""
        prev = self.prev  # read once: `_end` on another thread may drop it
        if self.ready_at is None:
            return float("inf")
        if prev is None:
            return self.ready_at + timeout_s
        if prev.ended is not None:
            return max(self.ready_at, prev.ended) + timeout_s
        return max(self.ready_at, prev.deadline(timeout_s)) + timeout_s


class PendingMap:
    """One `ActorPool.submit` in flight; `collect()` returns the results in item order."""

    def __init__(self, pool: "ActorPool", method: str, shares: list[list], args: tuple,
                 started: tuple[list, list, list] | None = None):
        """`started`: (actors, refs, calls) of calls already made (one per pool slot, None where a slot got nothing;
        `calls`: what `pool.track` returned for each, for its deadline)."""
        self.pool, self.method, self.shares, self.args = pool, method, shares, args
        self.retried: set[int] = set()  # shares whose first call failed (their results came from a retry)
        if started is not None:
            self.actors, self.refs, self.calls = started
            return
        self.actors = list(pool.actors)  # the handles this call went to (another call may replace one meanwhile)
        self.refs = [getattr(a, method).remote(s, *args) if s else None for a, s in zip(self.actors, shares)]
        now = time.perf_counter()
        self.calls = [pool.track(a, ref, now) if ref is not None else None for a, ref in zip(self.actors, self.refs)]

    def collect(self) -> list:
        """Wait for every share; results in item order (see `as_completed`)."""
        done = dict(self.as_completed())
        return [x for i in sorted(done) for x in done[i]]

    def as_completed(self):
        """Yield (worker index, its share's results) as shares finish. A worker that died, or one whose share is
        overdue (running for the pool's timeout since it started on that worker: `_Call`), is replaced and its share
        retried once (a second failure ends the run with the reason). Only the overdue share's worker is replaced:
        the others (a long tail of slow agent episodes, a share queued behind the worker's earlier call) go on."""
        pool = self.pool
        waiting = {ref: i for i, ref in enumerate(self.refs) if ref is not None}
        while waiting:
            wait_s = None
            if pool.timeout_s is not None:
                first = min(self.calls[i].deadline(pool.timeout_s) for i in waiting.values())
                # a deadline not known yet (a call's arguments not in): look again after a timeout's length
                wait_s = max(0.0, min(first - time.perf_counter(), pool.timeout_s))
            ready, _ = ray.wait(list(waiting), num_returns=1, timeout=wait_s)
            if not ready:
                now = time.perf_counter()
                overdue = {ref: d for ref in waiting if (d := self.calls[waiting[ref]].deadline(pool.timeout_s)) <= now}
                if overdue:  # the most overdue: replaced and retried; the others are looked at again
                    i = waiting.pop(min(overdue, key=overdue.get))
                    yield i, self._retry(i, GetTimeoutError())
                continue
            i = waiting.pop(ready[0])
            try:
                yield i, ray.get(ready[0])
            except RayActorError as e:
                yield i, self._retry(i, e)

    def _retry(self, i: int, error: Exception) -> list:
        pool, share = self.pool, self.shares[i]
        self.retried.add(i)
        what = "timed out" if isinstance(error, GetTimeoutError) else f"died ({error})"
        if pool.actors[i] is self.actors[i]:
            log.error("%s worker %d %s; replacing it and retrying its %d items", pool.name, i, what, len(share))
            pool.replace(i)
        else:  # an earlier call in flight already replaced it: retry on the replacement
            log.error("%s worker %d %s; retrying its %d items on its replacement", pool.name, i, what, len(share))
        try:
            return ray.get(getattr(pool.actors[i], self.method).remote(share, *self.args), timeout=pool.timeout_s)
        except (RayActorError, GetTimeoutError) as e2:
            what = f"exceeded {pool.timeout_s}s" if isinstance(e2, GetTimeoutError) else f"died ({e2})"
            raise RuntimeError(
                f"{pool.name} worker {i}: {self.method} failed twice (last: {what}); raise the timeout "
                f"({pool.name} timeout_s) or look for a hang or crash in run_dir/train.log (checkpoints are "
                "in run_dir)"
            ) from None


class Scoring:
    """The reward calls of one rollout, one per generated share (`Cluster.collect_rollout`)."""

    def __init__(self, by_share: dict[int, PendingMap]):
        self.by_share = by_share

    def collect(self) -> list[Trajectory]:
        return [t for i in sorted(self.by_share) for t in self.by_share[i].collect()]


class RolloutInFlight:
    """One rollout whose shares go to the reward workers straight from the rollout workers: Ray hands each
    finished share on as the argument of its `score` call, so a share is scored as soon as it is generated, also
    while the driver is busy training (`rollout.max_staleness` = 1). Share i goes whole to reward worker
    i mod rewards.num_actors, which has already scored the share's groups that finished early (RewardWorker.prescore)."""

    def __init__(self, rollout: "ActorPool", rewards: "ActorPool", requests: list, step: int, overrides: dict | None,
                 after: "RolloutInFlight | None" = None):
        """`after`: the rollout submitted before this one; worker i takes its share of this one up once its share of
        that one is generated (an actor runs one call at a time): where this one starts (`generation_seconds`)."""
        self.rewards = rewards
        self.scorers = list(rewards.actors)
        self.submitted, self._after, self._start, self._end = time.perf_counter(), after, None, None
        # The scorers go along too: each rollout worker sends its finished groups to its share's scorer early.
        self.generate = rollout.submit("generate", requests, step, overrides, self.scorers)
        self.early = [self.scorers[i % len(self.scorers)].score.remote(ref) if ref is not None else None
                      for i, ref in enumerate(self.generate.refs)]
        # each early call's deadline counts from when its share is generated (or from the end of the call before it
        # on that reward worker): ActorPool.track, in the order the calls were made, which is the order they run in
        self._early_calls = [rewards.track(self.scorers[i % len(self.scorers)], ref, None) if ref is not None else None
                             for i, ref in enumerate(self.early)]
        # When each share is generated, also when nobody waits for it (max_staleness 1: the driver is training)
        self._ended: dict[int, float] = {}
        self._shares = {i: ref for i, ref in enumerate(self.generate.refs) if ref is not None}
        for i, ref in self._shares.items():
            when_ready(ref, lambda i=i: self._generated(i))

    def _generated(self, i: int) -> None:  # on a Ray thread
        self._ended[i] = time.perf_counter()
        self._early_calls[i].arguments_ready()

    def generated_at(self) -> float | None:
        """perf_counter() when the last share was generated; None while one still generates."""
        if self._end is not None:
            return self._end
        return max(self._ended.values()) if len(self._ended) == len(self._shares) else None

    def wait_generated(self) -> None:
        """Block until every share is generated (or failed; `scoring` retries it), at most the pool's timeout."""
        if self._shares:
            ray.wait(list(self._shares.values()), num_returns=len(self._shares), timeout=self.generate.pool.timeout_s)

    def generation_seconds(self) -> float:
        """Seconds the workers spent on this rollout: from the first worker's start on it (its submission, or when
        that worker's share of the rollout before it was generated, if later) to its last share generated (a retried
        share: to when `scoring` got it). Call after `scoring`."""
        if self._start is None:
            before = self._after._ended if self._after is not None else {}  # when each worker's share of it ended
            self._start = min((max(self.submitted, before.get(i, self.submitted)) for i in self._shares),
                              default=self.submitted)
            self._after = None  # keeps no chain of earlier rollouts alive
        end = self.generated_at() or time.perf_counter()  # a done-callback can trail ray.wait by a moment
        return max(end - self._start, 1e-9)

    def scoring(self) -> Scoring:
        """Wait for the generation (a worker that died or hung is replaced and its share retried); the scoring
        under way. A retried share's early `score` call failed with it: it is scored now, by the same reward worker,
        which holds the groups its rollout worker sent it during generation (`RewardWorker.prescore`)."""
        by_share, n = {}, len(self.scorers)
        for i, share in self.generate.as_completed():
            shares = [[] for _ in range(n)]
            shares[i % n] = share  # the share, should its reward worker need a retry
            if i in self.generate.retried:
                by_share[i] = PendingMap(self.rewards, "score", shares, ())
                continue
            refs, calls = [None] * n, [None] * n
            refs[i % n], calls[i % n] = self.early[i], self._early_calls[i]
            by_share[i] = PendingMap(self.rewards, "score", shares, (), started=(self.scorers, refs, calls))
        if self.generate.retried:  # a retry's result came after its first call ended
            self._end = time.perf_counter()
        return Scoring(by_share)


class ActorPool:
    """Stateless workers of one class; each call splits its items evenly across them (`rl.batching.split_even`)."""

    def __init__(self, name: str, factory: Callable[[int, list], ray.actor.ActorHandle], size: int,
                 on_restart: Callable[[ray.actor.ActorHandle], None] | None = None, timeout_s: float | None = None,
                 start_waves: int = 1):
        """`factory(i, after)` starts worker i, whose engine must wait for the `ready` calls in `after`
        (`trainer.dist.wait_for`). `start_waves` > 1: the workers start in that many waves (wave w: workers i with
        i % start_waves == w), each wave's engines after the wave before: vLLM instances sharing a GPU must not
        profile its memory at the same time (each would count the other's allocations as its own). Every worker is
        created at once, so a later wave's process start and imports overlap the earlier waves' engine starts, and
        this returns without waiting (`wait_ready`)."""
        self.name, self.factory, self.on_restart, self.timeout_s = name, factory, on_restart, timeout_s
        self._last_call: dict = {}  # actor id -> the last call made on it (`track`)
        self.actors: list = [None] * size
        try:
            after: list = []
            for wave in range(start_waves):
                started = range(wave, size, start_waves)
                for i in started:
                    self.actors[i] = factory(i, after)
                if start_waves > 1:
                    after = [self.actors[i].ready.remote() for i in started]
        except BaseException:  # the caller never gets the pool: stop what started
            for a in self.actors:
                if a is not None:
                    ray.kill(a)
            raise

    def wait_ready(self) -> None:
        ray.get([a.ready.remote() for a in self.actors])

    def track(self, actor, ref: ray.ObjectRef, ready_at: float | None) -> _Call:
        """Note a call on `actor` (one of this pool's), for its deadline (`PendingMap.as_completed`): it starts once
        `ready_at` is past and the call made on `actor` before it has ended."""
        key = actor._actor_id
        call = self._last_call[key] = _Call(ref, ready_at, self._last_call.get(key))
        return call

    def replace(self, i: int) -> None:
        self._last_call.pop(self.actors[i]._actor_id, None)
        ray.kill(self.actors[i])  # a hung actor would otherwise keep its CPUs/GPU
        self.actors[i] = self.factory(i, None)  # None: a restart, which waits for nothing (and records no start plan)
        ray.get(self.actors[i].ready.remote())
        if self.on_restart is not None:
            self.on_restart(self.actors[i])

    def submit(self, method: str, items: list, *args) -> PendingMap:
        """Start `method(share, *args)` on every worker with its share of `items`; collect it later."""
        return PendingMap(self, method, split_even(items, len(self.actors)), args)

    def map(self, method: str, items: list, *args) -> list:
        return self.submit(method, items, *args).collect()


class PayloadHolders:
    """One `rollout.payload_holder.PayloadHolder` per node that runs rollout workers, started here in the driver: they own
    the samples' per-token arrays (rollout.payload_by_reference), so the arrays outlive the worker that made them.
    The pool replaces a hung or dead worker and retries its share (`PendingMap`); what that worker made before
    (dynamic sampling's earlier rounds, under max_staleness=1 the step that trains next) is still fetched by the
    trainer (trainer/payload.py). An actor lives as long as its creator, so the driver creates them, not the workers;
    they end with the run (`shutdown`), and a node's holder dies only with its node."""

    def __init__(self):
        self.by_node: dict[str, ray.actor.ActorHandle] = {}
        self._cls = ray.remote(num_cpus=0, max_concurrency=8)(PayloadHolder)

    def attach(self, workers: list) -> None:
        """Hand each of `workers` (RolloutWorker handles, started) its node's holder, starting the holders missing."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = ray.get([w.node_id.remote() for w in workers])
        for node in dict.fromkeys(nodes):
            if node not in self.by_node:
                self.by_node[node] = self._cls.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
        ray.get([w.set_payload_holder.remote(self.by_node[n]) for w, n in zip(workers, nodes)])

    def shutdown(self) -> None:
        for holder in self.by_node.values():
            ray.kill(holder)
        self.by_node.clear()


@ray.remote(num_cpus=0)
class RendezvousStore:
    """The trainer ranks' torch.distributed store for the whole run (`trainer.dist.open_store`: its port is bound
    as it is chosen, so no other process can take it before the ranks connect)."""

    def __init__(self):
        self.store = open_store()

    def address(self) -> tuple[str, int]:
        """(this node's IP, the port) where the ranks connect."""
        return node_address(), self.store.port


def numbered(role: str, i: int, size: int) -> str:
    """An actor's name on the start-up timeline: its role, with its index when the role has several actors."""
    return role if size == 1 else f"{role}{i}"


class Cluster:
    def __init__(self, cfg: dict, model_path: str, timeline: StartupTimeline | None = None, trainers: bool = True):
        """`timeline`: where each actor's readiness and the weight sync's set-up are marked (launch/startup.py).
        `trainers=False`: no trainer ranks, reference or teachers (`eval.only` of model.path: the rollout workers
        load those weights themselves, and nothing trains or syncs)."""
        self.cfg = cfg
        self.with_trainers = trainers
        self.timeline = timeline
        if not (cfg.get("ray") or {}).get("address"):  # a cluster we started: its CPUs are all there will be
            check_cpu_reservations(cfg, float(ray.cluster_resources().get("CPU", 0)))
        self._latest_weights = None
        self._store = None  # the trainer ranks' rendezvous (RendezvousStore)
        self._weight_sync = None  # vLLM: GPU weight sync (launch/weight_sync.py); hf: the object store, below
        self._last_rollout: RolloutInFlight | None = None  # where the next rollout's generation starts
        self._start_refs: list = []  # the ready calls actors wait for as they start (`_start`)
        self._placement = GpuPlacement(cfg)  # colocated: rank i and its workers share GPU i; split: k workers a GPU
        # owners of the samples' per-token arrays, one per node of rollout workers (rollout.payload_by_reference)
        by_reference = (cfg.get("rollout") or {}).get("payload_by_reference", ROLLOUT_DEFAULTS["payload_by_reference"])
        self._holders = PayloadHolders() if by_reference else None
        self.rollout = self.rewards = self.judge = self.reference = None
        self.trainers: list = []
        self.teachers: dict = {}  # teacher model path -> its FrozenModel actor (trainer.ref_placement=actor)
        self.teacher_paths: list[str] = []  # the teachers the run scores with, either placement
        self.frozen_sharded = frozen_models_sharded(cfg)  # the reference and teachers inside the trainer ranks
        try:
            self._start(cfg, model_path)
        except BaseException:  # an actor that failed to start: stop the ones that did (their GPUs, their CPUs)
            self.shutdown()
            raise

    def _start(self, cfg: dict, model_path: str) -> None:
        if objective_of(cfg).source != "rollouts":  # samples from a dataset: no rollout, reward or judge workers
            self._start_trainers(cfg, model_path, [])
            self._get_trainers([a.ready.remote() for a in self.trainers])
            return
        r, rw = cfg["rollout"], cfg["rewards"]
        gpu_judge = uses_rubric_judge(cfg["domains"]) and float(rw["judge"]["num_gpus"] or 0) > 0
        # vLLM profiles its GPU's free memory as it starts, so whatever allocates on a GPU starts its engine or loads
        # its model there only after it (`gpu_after`: their ready calls; `trainer.dist.wait_for`), while every actor
        # is created at once and imports side by side. Unless split instances take GPU shares: then the placement
        # group holds the rollout GPUs (GpuPlacement), no trainer can land there, and the trainers load while the
        # instances start (a vLLM judge may be placed on any GPU, so it still starts before them)
        trainers_first = is_split_vllm_on_gpu_shares(cfg) and not gpu_judge
        if trainers_first:
            self._start_trainers(cfg, model_path, [])
        # tensor parallel: vLLM's Ray workers hold the instance's GPUs (the rollout worker drives them; placement.py)
        rollout_gpus = 0 if tensor_parallel_size(cfg) > 1 else r["num_gpus"]
        rollout_cls = ray.remote(num_cpus=r["num_cpus"], num_gpus=rollout_gpus)(RolloutWorker)
        plans_before = time.time()  # vLLM start plans this run's instances may use (rollout/vllm_start_plan.py)
        self.rollout = ActorPool(
            "rollout",
            self._watched("rollout", int(r["num_workers"]), lambda i, after: rollout_cls.options(
                **self._placement.worker_options(i)).remote(cfg, model_path, i, self._placement.worker_env(i), after,
                                                            plans_before)),
            int(r["num_workers"]),
            on_restart=self._reload_worker,
            timeout_s=r.get("timeout_s", ROLLOUT_DEFAULTS["timeout_s"]),
            start_waves=engines_per_gpu(cfg),
        )
        gpu_after = [a.ready.remote() for a in self.rollout.actors] if placement_spec(r).gpu_memory else []
        # kept for the cluster's life: a restarted judge runs its constructor again with the same references, which
        # Ray would otherwise have freed once the first start had read them
        self._start_refs = gpu_after
        if uses_rubric_judge(cfg["domains"]):  # one rubric-judge actor for the run, shared by the reward workers
            jc = rw["judge"]
            # max_restarts: a judge that dies is restarted; the batches in flight meanwhile score 0 with the reason.
            # tensor parallel: vLLM's Ray workers hold the judge's GPU shares (placement.py judge_env)
            actor_gpus = 0 if self._placement.judge_tp > 1 else jc["num_gpus"]
            judge_cls = ray.remote(num_cpus=jc["num_cpus"], num_gpus=actor_gpus, max_restarts=3)(JudgeWorker)
            # rewards.judge.model null -> the policy's model_path. A vLLM judge, too, profiles its GPU's memory (and
            # one given no GPU share may still see the GPUs and start an engine there)
            self.judge = judge_cls.options(**self._placement.options("judge")).remote(
                cfg, model_path, gpu_after, self._placement.judge_env())
            self._watch("judge", self.judge)
            if gpu_judge:
                gpu_after = [*gpu_after, self.judge.ready.remote()]
                self._start_refs = gpu_after
        reward_cls = ray.remote(num_cpus=rw["actor_num_cpus"])(RewardWorker)
        self.rewards = ActorPool(
            "reward",
            self._watched("reward", int(rw["num_actors"]), lambda i, after: reward_cls.remote(cfg, judge=self.judge)),
            int(rw["num_actors"]), timeout_s=rw.get("actor_timeout_s"),
        )
        if not trainers_first:
            self._start_trainers(cfg, model_path, gpu_after)
        self.rollout.wait_ready()
        if self._holders is not None:
            self._holders.attach(self.rollout.actors)
        self.rewards.wait_ready()
        if self.judge is not None:
            ray.get(self.judge.ready.remote())
        self._get_trainers([a.ready.remote() for a in self.trainers])
        if self.reference is not None:
            ray.get(self.reference.ready.remote())
        ray.get([a.ready.remote() for a in self.teachers.values()])
        if self.trainers and engine_spec(ray.get(self.rollout.actors[0].engine_name.remote())).weight_sync == "vllm":
            from launch.weight_sync import VLLMWeightSync

            self._weight_sync = VLLMWeightSync(cfg, self.rollout.actors, self.trainers)
            self._weight_sync.init()
            if self.timeline is not None:
                self.timeline.mark("weight_sync_ready")

    def _watch(self, name: str, actor) -> None:
        """Mark `name` on the start-up timeline when `actor` is ready (its constructor has ended: an actor whose
        constructor raised is marked then too; the run usually ends with it, a restarted judge does not)."""
        if self.timeline is not None:
            when_ready(actor.ready.remote(), lambda: self.timeline.mark(name))

    def _watch_all(self, role: str, actors: list) -> None:
        """`_watch` each of `actors`: `role`, or `role<i>` of several."""
        for i, actor in enumerate(actors):
            self._watch(numbered(role, i, len(actors)), actor)

    def _watched(self, role: str, size: int, factory: Callable[[int, list], ray.actor.ActorHandle]):
        """`factory`, each actor it starts watched as it starts (`numbered`): a pool that starts in waves starts each
        wave's engines after the wave before, and only a mark from the start shows each one's own time."""
        def start(i: int, after: list):
            actor = factory(i, after)
            self._watch(numbered(role, i, size), actor)
            return actor

        return start

    def _start_trainers(self, cfg: dict, model_path: str, gpu_after: list) -> None:
        """Create the trainer ranks, the reference model and the teachers (their `ready` is awaited later); each
        loads its model to the GPU once the calls in `gpu_after` have returned (`trainer.dist.wait_for`)."""
        if not self.with_trainers:
            return
        t = cfg["trainer"]
        n = int(t["num_processes"])
        trainer_cls = ray.remote(num_cpus=t["num_cpus"], num_gpus=t["num_gpus"])(PolicyTrainer)
        # The ranks meet at the store, wherever it runs (beside rank 0 when there is a placement group); no rank
        # has to run on its node (a 0-CPU actor may land on a node with no GPU for a trainer)
        self._store = RendezvousStore.options(**self._placement.options(0)).remote()
        addr, port = ray.get(self._store.address.remote())
        self.trainers = [trainer_cls.options(**self._placement.options(rank)).remote(
            cfg, model_path, rank, n, addr, port, gpu_after) for rank in range(n)]
        self._watch_all("trainer", self.trainers)
        if "teacher" in objective_of(cfg).needs:
            self.teacher_paths = teachers_of(cfg)
        if self.frozen_sharded:  # built by each trainer rank (PolicyTrainer.frozen)
            return
        if needs_reference(cfg) and "reference" in objective_of(cfg).needs:
            ref_cls = ray.remote(num_cpus=t["num_cpus"], num_gpus=t["ref_num_gpus"])(FrozenModel)
            self.reference = ref_cls.options(**self._placement.options("reference")).remote(
                cfg, model_path, after=gpu_after)
            self._watch("reference", self.reference)
        if "teacher" in objective_of(cfg).needs:
            teacher_cls = ray.remote(num_cpus=t["num_cpus"], num_gpus=t["ref_num_gpus"])(FrozenModel)
            self.teachers = {path: teacher_cls.options(**self._placement.options("teacher")).remote(
                cfg, path, "teacher", after=gpu_after) for path in teachers_of(cfg)}
            self._watch_all("teacher", list(self.teachers.values()))

    def _get_trainers(self, refs: list, role: str = "a PolicyTrainer rank"):
        """Results of the stateful actors (trainer ranks, the reference): one that died ends the run."""
        try:
            return ray.get(refs)
        except RayActorError as e:
            raise RuntimeError(
                f"{role} died ({e}). Weights and optimizer state since the last checkpoint are lost; "
                f"restart with trainer.resume=auto and the same run_dir={self.cfg['run_dir']} to continue from it."
            ) from e

    # -- phases ------------------------------------------------------------------------------------------
    def submit_rollout(self, requests: list[dict], step: int, overrides: dict | None = None) -> RolloutInFlight:
        """`overrides`: sampling keys for held-out evaluation (see RolloutWorker.generate)."""
        self._last_rollout = RolloutInFlight(self.rollout, self.rewards, requests, step, overrides,
                                             after=self._last_rollout)
        return self._last_rollout

    def collect_rollout(self, pending: RolloutInFlight, sleep: bool = True) -> "Scoring":
        """Wait for the rollout; each worker's share was sent on to a reward worker when it was generated, so
        scoring overlaps the rest of the rollout (and, with max_staleness = 1, the training step). Returns the
        scoring under way (`Scoring.collect()`: the scored trajectories in request order). `sleep`: colocated vLLM
        with sleep mode then frees its GPU memory for the trainer (a rollout after the weight sync, like the
        held-out eval, must not: the next step generates from those weights)."""
        scoring = pending.scoring()
        if sleep:
            self.rollouts_done()
        return scoring

    def rollouts_done(self) -> None:
        """The step's rollouts are in: colocated vLLM with sleep mode gives its GPU memory to the trainer (nothing
        otherwise). `collect_rollout` calls it unless told not to, as dynamic sampling's rounds are (launch/sources.py)."""
        if self._weight_sync is not None:
            self._weight_sync.after_generate()

    def trainer_device_name(self) -> str:
        return self._get_trainers([self.trainers[0].device_name.remote()])[0]

    def ref_logprobs(self, trajs: list[Trajectory]) -> list[np.ndarray]:
        if self.frozen_sharded:
            return self._sharded_logprobs("reference", trajs)
        return self._get_trainers(self.reference.logprobs.remote(trajs), "the reference model (FrozenModel)")

    def teacher_logprobs(self, path: str, trajs: list[Trajectory]) -> list[np.ndarray]:
        if self.frozen_sharded:
            return self._sharded_logprobs(path, trajs)
        return self._get_trainers(self.teachers[path].logprobs.remote(trajs), f"the teacher {path} (FrozenModel)")

    def _sharded_logprobs(self, name: str, trajs: list[Trajectory]) -> list[np.ndarray]:
        """A frozen model partitioned over the trainer ranks: each rank scores a contiguous share, in order. The
        ranks run one agreed number of forwards (each gathers partitions from all ranks), which their shares must
        allow: the shares are made equal, at least one sample each, by scoring copies of the last sample again on
        the ranks short of one (their results dropped)."""
        n = len(self.trainers)
        size = max(1, -(-len(trajs) // n))
        padded = list(trajs) + [copy.copy(trajs[-1]) for _ in range(size * n - len(trajs))]
        shares = split_even(padded, n)
        outs = self._get_trainers([a.frozen_logprobs.remote(name, share) for a, share in zip(self.trainers, shares)])
        return [lp for out in outs for lp in out][:len(trajs)]

    def submit_train(self, minibatches: list[list[Trajectory]]) -> list:
        """Send a step's update to the ranks (`train_results` waits for it). Each mini-batch is split evenly across
        ranks; the loss is normalised by the whole mini-batch. A rank runs its calls in order, so an update submitted
        while the previous one runs starts as soon as it ends."""
        n = len(self.trainers)
        norms = [minibatch_norm(mb) for mb in minibatches]
        shards = [[split_even(mb, n)[rank] for mb in minibatches] for rank in range(n)]
        return [a.train_step.remote(shards[r], norms) for r, a in enumerate(self.trainers)]

    def train_results(self, submitted: list) -> list[dict]:
        """Each rank's metric sums of a submitted update."""
        return self._get_trainers(submitted)

    def sync_weights(self) -> dict[str, float]:
        """Trainer -> rollout workers: vLLM's GPU weight transfer (CUDA IPC / NCCL), else the object store.
        Returns the seconds of its parts, vLLM only (`VLLMWeightSync.sync`: wake, send, send_rank, finish). Nothing
        without rollout workers (SFT)."""
        if self.rollout is None:
            return {}
        if self._weight_sync is not None:
            done = self._weight_sync.sync()
            return {k: done[k] for k in ("wake", "send", "send_rank", "finish")}
        from launch.weight_sync import sync_timeout_s, wait_all

        self._latest_weights = self._full_weights()
        wait_all([(f"rollout worker {i}", "load_state_dict", w.load_state_dict.remote(self._latest_weights))
                  for i, w in enumerate(self.rollout.actors)], sync_timeout_s(self.cfg["rollout"]))
        return {}

    def _full_weights(self) -> ray.ObjectRef:
        """Rank 0's whole state dict in the object store (every rank takes part: a collective under ZeRO-3)."""
        refs = [a.full_state_dict.remote(self.cfg["model"]["dtype"]) for a in self.trainers]
        self._get_trainers(refs[1:])
        return refs[0]

    def _reload_worker(self, actor) -> None:
        """A restarted rollout worker gets its node's payload holder and the current weights (vLLM: once through the
        CPU path, then back on IPC)."""
        if self._holders is not None:
            self._holders.attach([actor])
        if self._weight_sync is not None:
            ray.get(actor.load_state_dict.remote(self._full_weights()))
            self._weight_sync.reattach(actor)
        elif self._latest_weights is not None:
            ray.get(actor.load_state_dict.remote(self._latest_weights))

    def save(self, ckpt_dir: str, client_state: dict) -> None:
        self._get_trainers([a.save.remote(ckpt_dir, client_state) for a in self.trainers])

    def load(self, ckpt_dir: str) -> dict:
        return self._get_trainers([a.load.remote(ckpt_dir) for a in self.trainers])[0]

    def shutdown(self) -> None:
        """Stop every actor started so far (also those of a start that failed part-way) and free the placement."""
        pooled = [a for pool in (self.rollout, self.rewards) if pool is not None for a in pool.actors]
        for a in [*pooled, *self.trainers, self.reference, *self.teachers.values(), self.judge, self._store]:
            if a is not None:
                ray.kill(a)
        if self._holders is not None:  # after the workers: nothing puts arrays any more
            self._holders.shutdown()
        self._placement.remove()
