"""The Ray side of the driver: start the actors, fan work out to them, and survive a dead worker.

Roles (one class each, easy to find): `rollout.worker.RolloutWorker`, `rewards.worker.RewardWorker`,
`trainer.policy.PolicyTrainer` (one per data-parallel rank), `trainer.reference.ReferenceModel`.
Rollout and reward workers are stateless apart from weights, so one that dies is replaced (and re-synced) and
its share is retried once; a dead trainer rank ends the run with a pointer to the last checkpoint.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError

from rl.trajectory import Trajectory

log = logging.getLogger(__name__)


def start_ray(rcfg: dict) -> None:
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if rcfg.get("address"):
        ray.init(address=rcfg["address"], log_to_driver=True)
    else:
        ray.init(
            num_cpus=rcfg.get("num_cpus"),
            num_gpus=rcfg.get("num_gpus"),
            include_dashboard=False,
            log_to_driver=True,
            runtime_env={"env_vars": {k: v for k, v in os.environ.items() if k.startswith(("HF_", "TRANSFORMERS_", "WANDB_", "MIXRL_", "TOKENIZERS_", "DS_"))}},
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _split(items: list, n: int) -> list[list]:
    bounds = np.linspace(0, len(items), n + 1).round().astype(int)
    return [items[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


class ColocatedPlacement:
    """Colocated vLLM: a Ray placement group of one GPU per trainer rank, so rollout worker i and trainer rank i
    land on the same GPU (their fractional `num_gpus` share it); the reference and the judge join GPU 0 when they
    ask for a fraction of a GPU. `options(i)` / `options("reference")` / `options("judge")` give the Ray
    `.options(...)` kwargs ({} when not colocated, or for a role placed outside the group)."""

    def __init__(self, cfg: dict):
        self.pg = None
        from rl.config import colocated_shares

        shares = colocated_shares(cfg)
        if not shares:
            return
        from ray.util.placement_group import placement_group

        r, t = cfg["rollout"], cfg["trainer"]
        self.n = int(t["num_processes"])
        roles = {"reference": "trainer.ref_num_gpus", "judge": "rewards.judge.num_gpus"}
        self.on_gpu0 = {role for role, key in roles.items() if key in shares}
        cpus = float(r["num_cpus"]) + float(t["num_cpus"])
        bundles = [{"GPU": 1.0, "CPU": cpus} for _ in range(self.n)]
        if "reference" in self.on_gpu0:
            bundles[0]["CPU"] += float(t["num_cpus"])
        if "judge" in self.on_gpu0:
            bundles[0]["CPU"] += float(cfg["rewards"]["judge"].get("num_cpus") or 0)
        self.pg = placement_group(bundles, strategy="PACK")
        try:
            ray.get(self.pg.ready(), timeout=300)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"colocated placement: Ray could not reserve {bundles}") from None

    def options(self, who: int | str) -> dict:
        if self.pg is None:
            return {}
        if isinstance(who, str):
            if who not in self.on_gpu0:
                return {}
            who = 0
        if who >= self.n:
            return {}
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {"scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=self.pg,
                                                                        placement_group_bundle_index=who)}

    def remove(self) -> None:
        if self.pg is not None:
            ray.util.remove_placement_group(self.pg)
            self.pg = None


class ActorPool:
    """Stateless workers of one class; a worker that dies or exceeds `timeout_s` on a call is replaced and its
    share retried once (a second failure ends the run with the reason)."""

    def __init__(self, name: str, factory: Callable[[int], ray.actor.ActorHandle], size: int,
                 on_restart: Callable[[ray.actor.ActorHandle], None] | None = None, timeout_s: float | None = None):
        self.name, self.factory, self.on_restart, self.timeout_s = name, factory, on_restart, timeout_s
        self.actors = [factory(i) for i in range(size)]

    def wait_ready(self) -> None:
        ray.get([a.ready.remote() for a in self.actors])

    def _replace(self, i: int) -> None:
        ray.kill(self.actors[i])  # a hung actor would otherwise keep its CPUs/GPU
        self.actors[i] = self.factory(i)
        ray.get(self.actors[i].ready.remote())
        if self.on_restart is not None:
            self.on_restart(self.actors[i])

    def map(self, method: str, items: list, *args) -> list:
        """Split items across the workers, call `method(share, *args)`, concatenate results in order."""
        shares = _split(items, len(self.actors))
        refs = [getattr(a, method).remote(s, *args) if s else None for a, s in zip(self.actors, shares)]
        out: list = []
        for i, (ref, share) in enumerate(zip(refs, shares)):
            if ref is None:
                continue
            try:
                out.extend(ray.get(ref, timeout=self.timeout_s))
            except (RayActorError, GetTimeoutError) as e:
                what = "timed out" if isinstance(e, GetTimeoutError) else f"died ({e})"
                log.error("%s worker %d %s; replacing it and retrying its %d items", self.name, i, what, len(share))
                self._replace(i)
                try:
                    out.extend(ray.get(getattr(self.actors[i], method).remote(share, *args), timeout=self.timeout_s))
                except GetTimeoutError:
                    raise RuntimeError(
                        f"{self.name} worker {i}: {method} exceeded {self.timeout_s}s twice; raise the timeout "
                        f"({self.name} timeout_s) or look for a hang (checkpoints are in run_dir)"
                    ) from None
        return out


class Cluster:
    def __init__(self, cfg: dict, model_path: str):
        from rewards.worker import RewardWorker
        from rollout.worker import RolloutWorker
        from trainer.policy import PolicyTrainer
        from trainer.reference import ReferenceModel

        self.cfg = cfg
        r, t, rw = cfg["rollout"], cfg["trainer"], cfg["rewards"]
        self._latest_weights = None
        self._weight_sync = None  # vLLM: GPU weight sync (trainer/weight_sync.py); hf: the CPU path below
        from rl.config import needs_reference

        self._placement = ColocatedPlacement(cfg)  # colocated vLLM: worker i and trainer rank i share GPU i
        rollout_cls = ray.remote(num_cpus=r["num_cpus"], num_gpus=r["num_gpus"])(RolloutWorker)
        self.rollout = ActorPool(
            "rollout",
            lambda i: rollout_cls.options(**self._placement.options(i)).remote(cfg, model_path, i),
            int(r["num_workers"]),
            on_restart=self._reload_worker,
            timeout_s=r.get("timeout_s"),
        )
        if r["engine"] != "hf":
            self.rollout.wait_ready()  # vLLM profiles GPU memory at start: start it before the trainers allocate
        self.judge = None  # one rubric-judge actor for the run, shared by the reward workers (rewards/judge.py)
        from rewards.judge import JudgeWorker, uses_rubric_judge

        if uses_rubric_judge(cfg["domains"]):
            jc = rw["judge"]
            # max_restarts: a judge that dies is restarted; the batches in flight meanwhile score 0 with the reason.
            judge_cls = ray.remote(num_cpus=jc["num_cpus"], num_gpus=jc["num_gpus"], max_restarts=3)(JudgeWorker)
            # rewards.judge.model null -> the policy's model_path
            self.judge = judge_cls.options(**self._placement.options("judge")).remote(cfg, model_path)
            if float(jc["num_gpus"] or 0) > 0:
                ray.get(self.judge.ready.remote())  # a vLLM judge, too, must profile memory before the trainers
        reward_cls = ray.remote(num_cpus=rw["actor_num_cpus"])(RewardWorker)
        self.rewards = ActorPool(
            "reward", lambda i: reward_cls.remote(cfg, judge=self.judge), int(rw["num_actors"]),
            timeout_s=rw.get("actor_timeout_s"),
        )
        n = int(t["num_processes"])
        port = _free_port()
        trainer_cls = ray.remote(num_cpus=t["num_cpus"], num_gpus=t["num_gpus"])(PolicyTrainer)
        self.trainers = [
            trainer_cls.options(**self._placement.options(rank)).remote(cfg, model_path, rank, n, "127.0.0.1", port)
            for rank in range(n)
        ]
        self.reference = None
        if needs_reference(cfg):
            ref_cls = ray.remote(num_cpus=t["num_cpus"], num_gpus=t["ref_num_gpus"])(ReferenceModel)
            self.reference = ref_cls.options(**self._placement.options("reference")).remote(cfg, model_path)
        self.rollout.wait_ready()
        self.rewards.wait_ready()
        if self.judge is not None:
            ray.get(self.judge.ready.remote())
        self._get_trainers([a.ready.remote() for a in self.trainers])
        if self.reference is not None:
            ray.get(self.reference.ready.remote())
        if ray.get(self.rollout.actors[0].engine_name.remote()) == "vllm":
            from trainer.weight_sync import VLLMWeightSync

            self._weight_sync = VLLMWeightSync(cfg, self.rollout.actors, self.trainers)
            self._weight_sync.init()

    def _get_trainers(self, refs: list):
        try:
            return ray.get(refs)
        except RayActorError as e:
            raise RuntimeError(
                f"a PolicyTrainer rank died ({e}). Weights and optimizer state since the last checkpoint are lost; "
                f"restart with trainer.resume=auto and the same run_dir={self.cfg['run_dir']} to continue from it."
            ) from e

    # -- phases ------------------------------------------------------------------------------------------
    def generate(self, requests: list[dict], step: int) -> list[Trajectory]:
        trajs = self.rollout.map("generate", requests, step)
        if self._weight_sync is not None:
            self._weight_sync.after_generate()  # colocated + sleep mode: give the GPU memory to the trainer
        return trajs

    def score(self, trajs: list[Trajectory]) -> list[Trajectory]:
        return self.rewards.map("score", trajs)

    def ref_logprobs(self, trajs: list[Trajectory]) -> list[np.ndarray]:
        return ray.get(self.reference.logprobs.remote(trajs))

    def train(self, minibatches: list[list[Trajectory]]) -> list[dict]:
        """Each mini-batch is split evenly across ranks; the loss is normalised by the whole mini-batch."""
        n = len(self.trainers)
        norms = [(len(mb), int(sum(t.generated_mask().sum() for t in mb))) for mb in minibatches]
        shards = [[_split(mb, n)[rank] for mb in minibatches] for rank in range(n)]
        return self._get_trainers([a.train_step.remote(shards[r], norms) for r, a in enumerate(self.trainers)])

    def sync_weights(self) -> None:
        """Trainer -> rollout workers: vLLM's GPU weight transfer (CUDA IPC / NCCL), else the object store."""
        if self._weight_sync is not None:
            self.last_sync = self._weight_sync.sync()
            return
        self._latest_weights = self._full_weights()
        ray.get([w.load_state_dict.remote(self._latest_weights) for w in self.rollout.actors])

    def _full_weights(self) -> ray.ObjectRef:
        """Rank 0's whole state dict in the object store (every rank takes part: a collective under ZeRO-3)."""
        refs = [a.full_state_dict.remote(self.cfg["model"]["dtype"]) for a in self.trainers]
        self._get_trainers(refs[1:])
        return refs[0]

    def _reload_worker(self, actor) -> None:
        """A restarted rollout worker gets the current weights (vLLM: once through the CPU path, then back on IPC)."""
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
        for a in [*self.rollout.actors, *self.rewards.actors, *self.trainers, self.reference, self.judge]:
            if a is not None:
                ray.kill(a)
        self._placement.remove()
