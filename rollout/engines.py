"""The rollout engines behind one interface, and how the config picks and builds one.

`rollout.engine`: hf (the transformers engine, `rollout/hf_engine.py`: CPU default, any device) | vllm
(`rollout/vllm_engine.py`, GPU) | auto (vLLM when CUDA and vllm are importable, else hf). Every engine takes token
ids and `rollout.sampling.SamplingParams` and returns `rollout.sampling.Generation`s (`Engine`); one whose weights
arrive through vLLM's weight-transfer API also meets `GPUEngine`. Which engines exist, and the placement and weight
sync each gets, is `rl/engine_specs.py`: a new engine is its own file with a `build` function plus one entry there.
The rollout workers and the rubric judge's model both build theirs here (`make_engine`), which checks the contract.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from rl.engine_specs import AUTO, AUTO_ORDER, ENGINES, engine_spec, load
from rollout.sampling import Generation, SamplingParams

__all__ = ["Engine", "EngineStart", "GPUEngine", "check_engine", "import_engine", "make_engine", "resolve_engine",
           "sampling_params"]


@runtime_checkable
class Engine(Protocol):
    """What the rollout worker, the agent loop and the judge call on every engine."""

    tokenizer: Any

    def generate(self, prompts: list[list[int]], sp: SamplingParams, *, on_samples_done=None,
                 seeds: list[int] | None = None) -> list[list[Generation]]:
        """`sp.n` samples of every prompt, grouped per prompt; `on_samples_done([(prompt index, samples)])` as
        samples finish (the worker scores them meanwhile); `seeds`: one per prompt (per-request seeding)."""

    def load_state_dict(self, state_dict: dict) -> None:
        """Whole new weights (weight_sync "state_dict"; also a restarted worker's first weights)."""


@runtime_checkable
class GPUEngine(Engine, Protocol):
    """An engine on weight_sync "vllm": sleep mode and vLLM's weight-transfer calls (launch/weight_sync.py)."""

    def sleep(self, level: int) -> None: ...
    def wake_up(self, tags: list[str] | None = None) -> None: ...
    def init_weight_transfer_engine(self, request: dict) -> None: ...
    def start_weight_update(self) -> None: ...
    def update_weights(self, request: dict) -> None: ...
    def finish_weight_update(self) -> None: ...
    def reset_prefix_cache(self) -> None: ...


CONTRACTS = {"state_dict": Engine, "vllm": GPUEngine}


def set_environment(env: dict[str, str | None] | None) -> None:
    """Set (None: unset) the variables an engine reads as it starts: where a tensor-parallel vLLM instance's Ray
    workers go (launch.placement.GpuPlacement.worker_env / judge_env)."""
    import os

    for key, value in (env or {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _no_wait() -> None:
    return None


@dataclass(frozen=True)
class EngineStart:
    """When an engine that takes GPU memory may start. `wait()` returns once the instances that must measure the GPU's
    free memory before it have started (an earlier wave of the instances sharing its GPU, launch.cluster.ActorPool);
    `wave` of `waves` is its turn among them. `plan`: it may skip the measurement, and so the wait, with a start plan
    (rollout/vllm_start_plan.py: the KV-cache size each wave got in an earlier run) written before `plans_before`
    (time.time(); None: any); `record`: what it measures is kept as its wave's plan (not for a restarted worker,
    which measures beside running instances)."""

    wait: Callable[[], None] = _no_wait
    wave: int = 0
    waves: int = 1
    plan: bool = False
    plans_before: float | None = None
    record: bool = True


def check_engine(engine_or_class, weight_sync: str) -> None:
    """Raise if an engine (or its class) lacks a method its weight sync calls: at start, not at the first sync."""
    contract = CONTRACTS[weight_sync]
    names = [n for n in dir(contract) if not n.startswith("_") and callable(getattr(contract, n, None))]
    missing = [n for n in names if not callable(getattr(engine_or_class, n, None))]
    if missing:
        what = getattr(engine_or_class, "__name__", type(engine_or_class).__name__)
        raise TypeError(f"engine {what} does not meet {contract.__name__} (weight_sync={weight_sync!r}): missing "
                        f"{', '.join(missing)}")


def resolve_engine(rcfg: dict) -> str:
    """`rollout.engine` with auto resolved here: the first available engine of AUTO_ORDER (rl/engine_specs.py)."""
    name = str(rcfg["engine"])
    if name != AUTO:
        engine_spec(name)
        return name
    for candidate in AUTO_ORDER:
        spec = ENGINES[candidate]
        if spec.available is None or load(spec.available)():
            return candidate
    raise ValueError(f"rollout.engine=auto: none of {AUTO_ORDER} is available")


def import_engine(name: str) -> None:
    """Import what engine `name` is built from (its module and its `preload` modules: vLLM's take seconds) without
    starting it: a worker does this while it waits for its turn to start the engine."""
    spec = engine_spec(name)
    for module in (spec.build.split(":")[0], *spec.preload):
        importlib.import_module(module)


def sampling_params(rcfg: dict, seed: int, record_kept_set: bool = True) -> SamplingParams:
    """The rollout's sampling settings (`rollout.*`) for one call; `record_kept_set` = Keep Sampling Mask."""
    return SamplingParams(
        n=int(rcfg["n_samples"]),
        temperature=float(rcfg["temperature"]),
        top_p=float(rcfg["top_p"]),
        top_k=int(rcfg["top_k"]),
        max_new_tokens=int(rcfg["max_new_tokens"]),
        stop_token_ids=list(rcfg.get("stop_token_ids") or []),
        seed=seed,
        record_kept_set=record_kept_set,
    )


def make_engine(rcfg: dict, model_cfg: dict, model_path: str, record_routes: bool, seed: int = 0,
                start: EngineStart | None = None, bitwise: bool = False):
    """An engine for `model_path` from the rollout (`rcfg`) and model (`model_cfg`) config sections, built by its
    registered `build` (rl/engine_specs.py) and checked against the contract of its weight sync. `start`: its turn
    to start; an engine whose spec `plans_start` takes it and waits itself, any other is built after `start.wait()`.
    `bitwise`: `algorithm.on_policy=bitwise` (vLLM only, rl/config.py)."""
    spec = engine_spec(resolve_engine(rcfg))
    if bitwise and spec.weight_sync != "vllm":
        raise ValueError(f"algorithm.on_policy=bitwise needs the vLLM engine; rollout.engine resolved to {spec.name}")
    extra = {"bitwise": True} if bitwise else {}
    if start is not None:
        if spec.plans_start:
            extra["start"] = start
        else:
            start.wait()
    engine = load(spec.build)(rcfg, model_cfg, model_path, record_routes=record_routes, seed=seed, **extra)
    check_engine(engine, spec.weight_sync)
    return engine
