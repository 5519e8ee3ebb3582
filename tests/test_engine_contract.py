"""The engine contract (rollout/engines.py) and registry (rl/engine_specs.py): every registered engine meets the
contract of its weight sync, `make_engine` builds through the registry and refuses an engine that does not, and a
new engine gets the placement and weight sync its entry names, never another engine's by its name."""

import pytest

from rl import engine_specs
from rl.config import ConfigError, engine_memory_share, is_colocated_vllm, is_split_vllm_on_gpu_shares
from rl.engine_specs import ENGINES, EngineSpec, load
from rollout.engines import Engine, check_engine, make_engine, resolve_engine


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_every_registered_engine_meets_its_contract(name):
    """The class its `build` returns (read from the annotation: vLLM cannot start on CPU) has every method its weight
    sync calls; `available` is callable where given."""
    spec = ENGINES[name]
    build = load(spec.build)
    cls = build.__annotations__["return"]
    cls = getattr(__import__(build.__module__, fromlist=[cls]), cls) if isinstance(cls, str) else cls
    check_engine(cls, spec.weight_sync)
    if spec.available:
        assert isinstance(load(spec.available)(), bool)


def test_make_engine_builds_the_hf_engine_through_the_registry(tiny_dense_path):
    engine = make_engine({"engine": "hf", "device": "cpu", "max_batch_size": 4}, {"dtype": "float32"},
                         tiny_dense_path, record_routes=False)
    assert type(engine).__name__ == "HFEngine" and isinstance(engine, Engine)


class _NoWeights:
    tokenizer = None

    def generate(self, prompts, sp, *, on_samples_done=None, seeds=None):
        return [[] for _ in prompts]


class _StateDictEngine(_NoWeights):
    def load_state_dict(self, state_dict):
        self.weights = state_dict


def build_without_weights(rcfg, model_cfg, model_path, record_routes, seed=0):
    return _NoWeights()


def build_toy(rcfg, model_cfg, model_path, record_routes, seed=0):
    return _StateDictEngine()


def _register(monkeypatch, **spec):
    spec = EngineSpec(**{"name": "toy", "build": f"{__name__}:build_toy", "gpu_memory": False,
                         "weight_sync": "state_dict", **spec})
    monkeypatch.setitem(ENGINES, spec.name, spec)
    return spec


def test_an_engine_without_a_method_of_its_contract_is_refused_at_start(monkeypatch):
    _register(monkeypatch, build=f"{__name__}:build_without_weights")
    with pytest.raises(TypeError, match="missing load_state_dict"):
        make_engine({"engine": "toy"}, {}, "unused", record_routes=False)
    _register(monkeypatch, weight_sync="vllm")  # a state-dict engine entered as a vLLM-synced one
    with pytest.raises(TypeError, match="GPUEngine.*missing .*finish_weight_update"):
        make_engine({"engine": "toy"}, {}, "unused", record_routes=False)
    with pytest.raises(ValueError, match="weight_sync must be one of"):
        EngineSpec("bad", build="m:f", gpu_memory=False, weight_sync="rsync")
    with pytest.raises(ValueError, match="'module:function'"):
        EngineSpec("bad", build="m.f", gpu_memory=False, weight_sync="state_dict")


def _cfg(engine, placement="colocated", num_gpus=0.5):
    return {"rollout": {"engine": engine, "placement": placement, "num_gpus": num_gpus, "num_workers": 2,
                        "gpu_memory_utilization": 0.4, "enable_sleep_mode": True},
            "trainer": {"num_processes": 1}}


def test_a_third_engine_gets_its_own_placement_rules(monkeypatch):
    """Before the registry any name but "hf" counted as vLLM for placement; now the entry decides."""
    _register(monkeypatch)
    engine = make_engine({"engine": "toy"}, {}, "unused", record_routes=False)
    assert isinstance(engine, _StateDictEngine)
    assert not is_colocated_vllm(_cfg("toy")) and not is_split_vllm_on_gpu_shares(_cfg("toy", "split"))
    assert engine_memory_share(_cfg("toy")["rollout"]) is None
    assert is_colocated_vllm(_cfg("vllm")) and is_split_vllm_on_gpu_shares(_cfg("vllm", "split"))
    assert engine_memory_share(_cfg("vllm")["rollout"]) == pytest.approx(0.4)
    _register(monkeypatch, gpu_memory=True)  # one that holds a GPU share follows the GPU rules
    assert is_colocated_vllm(_cfg("toy")) and engine_memory_share(_cfg("toy")["rollout"]) == pytest.approx(0.4)


def test_the_config_names_registered_engines_only(monkeypatch):
    from rl.config import check_choice

    with pytest.raises(ConfigError, match="rollout.engine"):
        check_choice({"engine": "toy"}, "engine", "rollout", engine_specs.engine_names())
    _register(monkeypatch)
    check_choice({"engine": "toy"}, "engine", "rollout", engine_specs.engine_names())
    with pytest.raises(ValueError, match="unknown engine"):
        resolve_engine({"engine": "nope"})


def test_auto_takes_the_first_available_engine(monkeypatch):
    monkeypatch.setitem(ENGINES, "vllm", EngineSpec("vllm", build="rollout.vllm_engine:build", gpu_memory=True,
                                                    weight_sync="vllm", available=f"{__name__}:_yes"))
    assert resolve_engine({"engine": "auto"}) == "vllm"
    monkeypatch.setitem(ENGINES, "vllm", EngineSpec("vllm", build="rollout.vllm_engine:build", gpu_memory=True,
                                                    weight_sync="vllm", available=f"{__name__}:_no"))
    assert resolve_engine({"engine": "auto"}) == "hf"


def _yes():
    return True


def _no():
    return False
