"""The rollout engines the config can name (`rollout.engine`), and the rules that follow from each.

An engine is one file under rollout/ (its class, meeting `rollout.engines.Engine`, and a `build` function) plus one
entry here. The entry says everything the rest of the project decides by engine, so a new engine never falls into
another one's placement or weight sync by its name:
- `build`: "module:function" that makes the engine from (rcfg, model_cfg, model_path, record_routes, seed);
- `gpu_memory`: the engine takes a fixed share of its GPU's memory (`rollout.gpu_memory_utilization`) and profiles it
  at start: it starts before the trainers allocate, and the colocated/split GPU placement rules and the trainer's
  room-to-wake-up accounting (rl/config.py) apply to it;
- `weight_sync`: how the trainer's new weights reach it. "state_dict": the full weights through Ray's object store
  into `load_state_dict` (any device). "vllm": vLLM's weight-transfer API, CUDA IPC colocated or NCCL split
  (launch/weight_sync.py), with sleep mode; the engine then also meets `rollout.engines.GPUEngine`;
- `available`: "module:function" -> bool, whether it can run here (for `rollout.engine=auto`, which takes the first
  available engine of AUTO_ORDER); `requires`: the package it imports, looked up without importing it (a process
  that sizes memory around an `auto` engine, without starting CUDA);
- `preload`: modules its start imports, imported by a worker while it waits for its turn to start the engine (the
  instances sharing a GPU start one after another, launch.cluster.ActorPool);
- `plans_start`: its `build` takes `start` (rollout.engines.EngineStart) and waits for its turn itself, or not at
  all when it knows its memory without measuring (vLLM: rollout/vllm_start_plan.py); otherwise the worker waits
  before the build.
This module imports no engine code (rl/ sits below rollout/): the strings are resolved in rollout/engines.py, which
builds engines and resolves `auto`.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass

WEIGHT_SYNCS = ("state_dict", "vllm")


@dataclass(frozen=True)
class EngineSpec:
    name: str
    build: str  # "module:function"
    gpu_memory: bool
    weight_sync: str  # one of WEIGHT_SYNCS
    available: str | None = None  # "module:function" -> bool; None: always available
    requires: str | None = None  # the package the engine imports (None: only the project's own dependencies)
    # modules the engine's start imports, worth importing while a worker waits for its turn to start it
    preload: tuple[str, ...] = ()
    plans_start: bool = False  # build(..., start=EngineStart) waits for its turn itself

    def __post_init__(self):
        if self.weight_sync not in WEIGHT_SYNCS:
            raise ValueError(f"engine {self.name!r}: weight_sync must be one of {WEIGHT_SYNCS}, got {self.weight_sync!r}")
        for field in ("build", "available"):
            value = getattr(self, field)
            if value is not None and value.count(":") != 1:
                raise ValueError(f"engine {self.name!r}: {field} must be 'module:function', got {value!r}")


ENGINES: dict[str, EngineSpec] = {
    "hf": EngineSpec("hf", build="rollout.hf_engine:build", gpu_memory=False, weight_sync="state_dict"),
    "vllm": EngineSpec("vllm", build="rollout.vllm_engine:build", gpu_memory=True, weight_sync="vllm",
                       available="rollout.vllm_engine:vllm_available", requires="vllm",
                       preload=("vllm.entrypoints.llm",), plans_start=True),
}
AUTO = "auto"
AUTO_ORDER = ("vllm", "hf")  # rollout.engine=auto: the first of these that is available


def load(ref: str):
    """The object a "module:function" string names."""
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


def engine_names() -> set[str]:
    """What `rollout.engine` may say."""
    return set(ENGINES) | {AUTO}


def engine_spec(name: str) -> EngineSpec:
    if name not in ENGINES:
        raise ValueError(f"rollout.engine={name!r}: unknown engine (available: {', '.join(sorted(engine_names()))})")
    return ENGINES[name]


def installed(spec: EngineSpec) -> bool:
    """Whether the package the engine needs is installed (imports nothing)."""
    return spec.requires is None or importlib.util.find_spec(spec.requires) is not None


def placement_spec(rcfg: Mapping) -> EngineSpec:
    """The engine whose placement rules apply. `auto` plans as its first choice (vLLM): the driver that places the
    actors need not be able to run it, and where the workers cannot, they fall back to one that needs no GPU share."""
    name = str(rcfg["engine"])
    return ENGINES[AUTO_ORDER[0]] if name == AUTO else engine_spec(name)
