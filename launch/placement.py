"""Where the actors run on GPUs: the run's placement group, and the GPU-share checks made before Ray starts
(a wrong share would otherwise hang in Ray, waiting for resources that never come).

`rollout.placement`:
- colocated: one Ray placement group with one GPU per trainer rank; the rollout workers of GPU i (k =
  `rl.config.engines_per_gpu` of them: workers i*k .. i*k+k-1) and trainer rank i share bundle i (their fractional
  `num_gpus` split the GPU); the reference model, the distillation teachers (one FrozenModel per distinct teacher,
  each with `trainer.ref_num_gpus`, like the reference) and the rubric judge join GPU 0 when they ask for a fraction
  of a GPU (a whole GPU or more is placed outside the group, on a GPU of its own). With tensor parallel T > 1, one
  vLLM instance spans the GPUs of T trainer ranks: worker j (taking no GPU itself) runs on bundle j*T, and vLLM's
  Ray executor puts its T workers (`rollout.num_gpus` each) on bundles j*T .. j*T+T-1 (`worker_env`). A judge with
  tensor parallel T (`rewards.judge.tensor_parallel_size`) likewise: the judge actor (no GPU itself) on bundle 0,
  its T workers (`rewards.judge.num_gpus` each) on bundles 0 .. T-1 (`judge_env`).
- split: vLLM workers own their GPUs. With k > 1 instances per rollout GPU (`rollout.num_gpus` = 1/k) a placement
  group holds the rollout GPUs, workers g*k .. g*k+k-1 on bundle g, so that the instances of a GPU are known (the
  weight sync sends to them in waves, launch/weight_sync.py) and Ray cannot spread them over the GPUs the trainer
  needs; without it, no group.
"""

from __future__ import annotations

from collections.abc import Mapping

from rewards.judge import judge_config, judge_tensor_parallel_size, uses_rubric_judge
from rl.config import (
    ROLLOUT_DEFAULTS, ConfigError, check_choice, engines_per_gpu, frozen_models_sharded, is_colocated_vllm, is_split_vllm_on_gpu_shares,
    needs_reference, rollout_placement, teacher_paths,
)


def check_gpu_layout(cfg: Mapping) -> None:
    """The vLLM placement and every actor's GPU share; raises ConfigError naming the key."""
    r, t = cfg["rollout"], cfg["trainer"]
    if "placement" in r:
        check_choice(r, "placement", "rollout", {"colocated", "split"})
    tp = tensor_parallel_size(cfg)
    if tp > 1 and str(r.get("engine")) != "vllm":  # its Ray workers hold the GPUs: the worker itself sees none
        raise ConfigError(f"rollout.tensor_parallel_size={tp} needs rollout.engine=vllm (got {r.get('engine')})")
    if is_colocated_vllm(cfg) and tp > 1:
        n, w = int(t["num_processes"]), int(r["num_workers"])
        if n % tp or w * tp != n:
            raise ConfigError(
                f"rollout.tensor_parallel_size={tp} with rollout.placement=colocated spreads each vLLM instance over "
                f"{tp} trainer ranks' GPUs: it needs trainer.num_processes to be a multiple of it and "
                f"rollout.num_workers = trainer.num_processes / {tp} (got {n} and {w})"
            )
    elif is_colocated_vllm(cfg) and int(r["num_workers"]) % int(t["num_processes"]):
        raise ConfigError(
            "rollout.placement=colocated puts rollout.num_workers / trainer.num_processes vLLM instances on each "
            "trainer rank's GPU: it needs rollout.num_workers to be a multiple of trainer.num_processes (got "
            f"{r['num_workers']} and {t['num_processes']})"
        )
    colocated_shares(cfg)
    check_judge_layout(cfg)
    if is_split_vllm_on_gpu_shares(cfg) and tp != 1:
        raise ConfigError(
            f"rollout.placement=split with rollout.num_gpus={r['num_gpus']} runs vLLM instances on a share of one GPU, "
            f"which needs rollout.tensor_parallel_size == 1 (got {r.get('tensor_parallel_size')}); give each "
            "tensor-parallel instance whole GPUs (rollout.num_gpus=1)"
        )
    k = engines_per_gpu(cfg)
    share = r.get("gpu_memory_utilization", ROLLOUT_DEFAULTS["gpu_memory_utilization"])
    if k > 1 and k * float(share or 0) >= 1:
        where, short = (("rollout.num_workers / trainer.num_processes", "leaves nothing for the trainer")
                        if is_colocated_vllm(cfg) else ("1 / rollout.num_gpus, split placement", "is all of the GPU"))
        raise ConfigError(
            f"rollout.gpu_memory_utilization is per vLLM instance, and {k} instances share each GPU ({where}): "
            f"{k} x {share} {short}; lower it (e.g. the one-instance value / k)"
        )
    if frozen_models_sharded(cfg):  # the reference and teachers live in the trainer ranks: no GPU share of their own
        return
    if t.get("device") == "cuda" and teachers_of(cfg) and not float(t.get("ref_num_gpus") or 0):
        raise ConfigError("trainer.ref_num_gpus: the distillation teachers (FrozenModel actors, placed like the "
                          "reference) would see no GPU with trainer.device=cuda; give them a GPU share (e.g. "
                          "trainer.ref_num_gpus=0.1, on GPU 0 when colocated)")
    if t.get("device") == "cuda" and needs_reference(cfg) and not float(t.get("ref_num_gpus") or 0):
        raise ConfigError(
            "trainer.ref_num_gpus: the reference model (some domain has kl_coef > 0) would see no GPU with "
            "trainer.device=cuda; give it a GPU share (e.g. trainer.ref_num_gpus=0.1, on GPU 0 when colocated)"
        )


def tensor_parallel_size(cfg: Mapping) -> int:
    """GPUs per vLLM instance (`rollout.tensor_parallel_size`)."""
    return int(cfg["rollout"].get("tensor_parallel_size") or 1)


def judge_gpus(cfg: Mapping) -> int:
    """GPUs the run's rubric judge spans (`rewards.judge.tensor_parallel_size`; 1 without a judge)."""
    if not uses_rubric_judge(cfg.get("domains") or {}):
        return 1
    return judge_tensor_parallel_size(judge_config(cfg.get("rewards")))


def check_judge_layout(cfg: Mapping) -> None:
    """A tensor-parallel judge spans trainer ranks' GPUs of the colocated group with a share on each (`judge_env`);
    raises ConfigError naming the keys otherwise."""
    tp = judge_gpus(cfg)
    if tp < 1:
        raise ConfigError(f"rewards.judge.tensor_parallel_size must be >= 1, got {tp}")
    if tp == 1:
        return
    j = judge_config(cfg.get("rewards"))
    share, ranks = float(j.get("num_gpus") or 0), int(cfg["trainer"]["num_processes"])
    needs = {
        "rollout.placement=colocated with rollout.engine=vllm (its GPUs are the trainer ranks' of the run's "
        "placement group)": is_colocated_vllm(cfg),
        f"rewards.judge.num_gpus a fraction of a GPU, its share on each of its {tp} GPUs (got {share:g})":
            0 < share < 1,
        f"trainer.num_processes >= {tp} (got {ranks})": ranks >= tp,
        f"rewards.judge.engine vllm or null (got {j.get('engine')})": j.get("engine") in (None, "vllm", "auto"),
    }
    missing = [k for k, ok in needs.items() if not ok]
    if missing:
        raise ConfigError(f"rewards.judge.tensor_parallel_size={tp} needs " + "; ".join(missing))


def teachers_of(cfg: Mapping) -> list[str]:
    """The teacher models a run starts: those of `domains.<d>.teacher` under algorithm.objective=distill."""
    return teacher_paths(cfg) if (cfg.get("algorithm") or {}).get("objective") == "distill" else []


def teacher_share_key(cfg: Mapping) -> str:
    return f"{len(teachers_of(cfg))} x trainer.ref_num_gpus (teachers)"


def cpu_reservations(cfg: Mapping) -> dict[str, float]:
    """The Ray CPUs the run's actors reserve, by config key: a local Ray cluster with fewer would leave the last
    actors waiting for CPUs forever, with no message."""
    r, t, rw = cfg["rollout"], cfg["trainer"], cfg.get("rewards") or {}
    need = {"trainer.num_processes x trainer.num_cpus": int(t["num_processes"]) * float(t["num_cpus"])}
    if (cfg.get("algorithm") or {}).get("dataset") is not None:  # SFT: the trainer ranks alone
        return need
    need["rollout.num_workers x rollout.num_cpus"] = int(r["num_workers"]) * float(r["num_cpus"])
    need["rewards.num_actors x rewards.actor_num_cpus"] = int(rw.get("num_actors") or 1) * float(rw.get("actor_num_cpus") or 0)
    own_actors = not frozen_models_sharded(cfg)  # sharded: the reference and teachers run in the trainer ranks
    if needs_reference(cfg) and own_actors:
        need["trainer.num_cpus (reference)"] = float(t["num_cpus"])
    if teachers_of(cfg) and own_actors:
        need[f"{len(teachers_of(cfg))} x trainer.num_cpus (teachers)"] = len(teachers_of(cfg)) * float(t["num_cpus"])
    if uses_rubric_judge(cfg.get("domains") or {}):
        need["rewards.judge.num_cpus"] = float((rw.get("judge") or {}).get("num_cpus") or 0)
    return {k: v for k, v in need.items() if v > 0}


def check_cpu_reservations(cfg: Mapping, available: float) -> None:
    """ConfigError naming the keys when the actors reserve more CPUs than the local Ray cluster has."""
    need = cpu_reservations(cfg)
    if sum(need.values()) > available + 1e-9:
        raise ConfigError(f"ray.num_cpus: the actors reserve {sum(need.values()):g} CPUs ("
                          + ", ".join(f"{k} {v:g}" for k, v in need.items()) + f") and the local Ray cluster has "
                          f"{available:g}; lower those reservations, or give Ray more (logical) CPUs, e.g. "
                          f"ray.num_cpus={int(-(-sum(need.values()) // 1))}")


def colocated_shares(cfg: Mapping) -> dict[str, float]:
    """GPU shares that colocated vLLM puts on one GPU: the worker and the trainer rank on every GPU, plus on GPU 0
    the reference model and the rubric judge when they ask for a fraction of a GPU (a tensor-parallel judge's share
    is on GPUs 0 .. T-1 too, none of which holds more than GPU 0). Empty when the run is not colocated vLLM. Raises
    ConfigError naming the keys."""
    if not is_colocated_vllm(cfg):
        return {}
    r, t = cfg["rollout"], cfg["trainer"]
    gpus_r, gpus_t = float(r.get("num_gpus") or 0), float(t.get("num_gpus") or 0)
    if gpus_t <= 0:
        raise ConfigError(f"rollout.placement=colocated: trainer.num_gpus must be > 0 (e.g. 0.5) to share the "
                          f"rollout worker's GPU, got {gpus_t}")
    k = engines_per_gpu(cfg)
    shares = {"rollout.num_gpus" if k == 1 else f"{k} x rollout.num_gpus": gpus_r * k, "trainer.num_gpus": gpus_t}
    own_actors = not frozen_models_sharded(cfg)  # sharded: the reference and teachers take no share of their own
    extra = {"trainer.ref_num_gpus": float(t.get("ref_num_gpus") or 0) if needs_reference(cfg) and own_actors else 0.0,
             "rewards.judge.num_gpus": float(((cfg.get("rewards") or {}).get("judge") or {}).get("num_gpus") or 0)
             if uses_rubric_judge(cfg.get("domains") or {}) else 0.0}
    shares.update({k: v for k, v in extra.items() if 0 < v < 1})
    # teachers with a fraction of a GPU each all join GPU 0: their sum counts there, however large (it must fit)
    per_teacher = float(t.get("ref_num_gpus") or 0)
    if teachers_of(cfg) and own_actors and 0 < per_teacher < 1:
        shares[teacher_share_key(cfg)] = len(teachers_of(cfg)) * per_teacher
    if sum(shares.values()) > 1.0 + 1e-9:
        raise ConfigError("rollout.placement=colocated: the GPU shares on one GPU must sum to <= 1, got "
                          + " + ".join(f"{k} {v}" for k, v in shares.items()))
    return shares


def _spanning_env(bundles, share: float) -> dict[str, str | None]:
    """Where vLLM's Ray executor starts a tensor-parallel instance's workers: one per bundle of the run's group, each
    with `share` of its GPU; the actor driving it holds no GPU, and Ray's empty CUDA_VISIBLE_DEVICES is dropped."""
    return {"VLLM_RAY_BUNDLE_INDICES": ",".join(map(str, bundles)), "VLLM_RAY_PER_WORKER_GPUS": str(share),
            "CUDA_VISIBLE_DEVICES": None}


class GpuPlacement:
    """The run's placement group (see the module's docstring). `options(rank)` (trainer rank) / `worker_options(i)`
    (rollout worker) / `options("reference")` / `options("judge")` give the Ray `.options(...)` kwargs ({} where no
    group is needed, or for a role placed outside the group)."""

    def __init__(self, cfg: dict):
        import ray

        self.pg = None
        self.n = 0  # trainer ranks in the group (colocated)
        self.on_gpu0: set[str] = set()
        self.engines = engines_per_gpu(cfg)
        self.tp = 1  # colocated tensor parallel: GPUs (bundles) per vLLM instance
        self.gpu_share = 0.0
        self.judge_tp, self.judge_share = 1, 0.0  # a tensor-parallel judge's GPUs (bundles 0 .. T-1) and share
        r, t = cfg["rollout"], cfg["trainer"]
        self.split_tp = not is_colocated_vllm(cfg) and tensor_parallel_size(cfg) > 1
        shares = colocated_shares(cfg)
        if shares:
            self.n = int(t["num_processes"])
            self.tp, self.gpu_share = tensor_parallel_size(cfg), float(r["num_gpus"])
            roles = {"reference": "trainer.ref_num_gpus", "judge": "rewards.judge.num_gpus",
                     "teacher": teacher_share_key(cfg)}
            self.on_gpu0 = {role for role, key in roles.items() if key in shares}
            if "judge" in self.on_gpu0:
                self.judge_tp, self.judge_share = judge_gpus(cfg), float(cfg["rewards"]["judge"]["num_gpus"])
            cpus = float(r["num_cpus"]) * self.engines + float(t["num_cpus"])
            bundles = [{"GPU": 1.0, "CPU": cpus} for _ in range(self.n)]
            if "reference" in self.on_gpu0:
                bundles[0]["CPU"] += float(t["num_cpus"])
            if "teacher" in self.on_gpu0:
                bundles[0]["CPU"] += float(t["num_cpus"]) * len(teachers_of(cfg))
            if "judge" in self.on_gpu0:
                bundles[0]["CPU"] += float(cfg["rewards"]["judge"].get("num_cpus") or 0)
        elif is_split_vllm_on_gpu_shares(cfg):
            # instances on a share of a rollout GPU: the GPU theirs alone (Ray would put the trainer on a free share)
            gpus = -(-int(r["num_workers"]) // self.engines)
            bundles = [{"GPU": 1.0, "CPU": float(r["num_cpus"]) * self.engines} for _ in range(gpus)]
        else:
            return
        from ray.util.placement_group import placement_group

        self.pg = placement_group(bundles, strategy="PACK")
        try:
            ray.get(self.pg.ready(), timeout=300)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"{rollout_placement(r)} placement: Ray could not reserve {bundles}") from None

    def _bundle(self, index: int, children: bool = False) -> dict:
        """`children`: the tasks and actors it starts (vLLM's Ray workers) stay in the group."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {"scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=self.pg, placement_group_bundle_index=index, placement_group_capture_child_tasks=children)}

    def options(self, who: int | str) -> dict:
        if who == "judge" and self.judge_tp > 1:  # on GPU 0, and its vLLM workers stay in the group (judge_env)
            return self._bundle(0, children=True)
        if isinstance(who, str):
            if who not in self.on_gpu0:
                return {}
            who = 0
        return self._bundle(who) if self.pg is not None and who < self.n else {}

    def judge_env(self) -> dict[str, str | None]:
        """Environment for the judge's engine: with tensor parallel T > 1, vLLM's Ray executor starts its T workers
        on bundles 0 .. T-1 with the judge's share each (the judge actor, holding no GPU, must not pass Ray's empty
        CUDA_VISIBLE_DEVICES on to them); {} for a judge on one GPU."""
        return {} if self.judge_tp == 1 else _spanning_env(range(self.judge_tp), self.judge_share)

    def worker_options(self, i: int) -> dict:
        """Rollout worker i runs on the group's GPU i // engines_per_gpu (colocated: trainer rank i // k's); with
        tensor parallel T, on GPU i*T, the first of its instance's, and the tasks and actors it starts (vLLM's Ray
        workers) stay in the group."""
        if self.pg is None:
            return {}
        if self.tp > 1:
            return self._bundle(i * self.tp, children=True)
        return self._bundle(i // self.engines)

    def worker_env(self, i: int) -> dict[str, str | None]:
        """Environment for rollout worker i's engine (None: unset), for tensor parallel T > 1. The rollout worker
        holds no GPU itself, so the CUDA_VISIBLE_DEVICES Ray gave it must not reach vLLM's Ray workers. Colocated,
        vLLM's Ray executor starts one worker per GPU of the instance on bundles i*T .. i*T+T-1 of the group, each
        with the worker's GPU share (VLLM_RAY_BUNDLE_INDICES, VLLM_RAY_PER_WORKER_GPUS); split, it makes a placement
        group of whole GPUs itself (not yet run on GPUs: it needs three)."""
        if self.split_tp:
            return {"CUDA_VISIBLE_DEVICES": None}
        if self.pg is None or self.tp == 1:
            return {}
        return _spanning_env(range(i * self.tp, (i + 1) * self.tp), self.gpu_share)

    def remove(self) -> None:
        if self.pg is not None:
            import ray

            ray.util.remove_placement_group(self.pg)
            self.pg = None
