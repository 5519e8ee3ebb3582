"""Start plans (rollout/vllm_start_plan.py): vLLM instances sharing a GPU start side by side once every one of them has
measured its KV-cache size in an earlier run with the same settings, and measure one after the other otherwise. vLLM
cannot start on this CPU machine: `_Measured` stands in for `vllm.LLM` where only its `collective_rpc` is read (it
runs the real rpc function on an object with the attribute vLLM's GPU worker sets), and the GPU's identity is given;
the side-by-side start itself is timed on a GPU by benchmarks/cold_start.py."""

import json
import logging
from types import SimpleNamespace

import pytest

from rl.engine_specs import ENGINES, EngineSpec
from rollout import vllm_start_plan as sp
from rollout.engines import EngineStart, make_engine

IDENTITY = {"vllm": "0.26.0", "torch": "2.11.0", "cuda": "13.0", "device": "NVIDIA H200", "memory": 150 * 2**30}
ARGS = {"model": "/cache/smollm2", "dtype": "bfloat16", "gpu_memory_utilization": 0.15, "enable_sleep_mode": True,
        "seed": 7}


class _Measured:
    """`vllm.LLM` after a start that measured: its (one) worker holds the measured KV-cache bytes."""

    def __init__(self, kv_bytes: int):
        self.worker = SimpleNamespace(available_kv_cache_memory_bytes=kv_bytes)

    def collective_rpc(self, fn):
        return [fn(self.worker)]


class _Turn:
    def __init__(self):
        self.waited = 0

    def wait(self):
        self.waited += 1


@pytest.fixture
def plans(tmp_path, monkeypatch):
    monkeypatch.setenv("MIXRL_CACHE", str(tmp_path))
    monkeypatch.setattr(sp, "device_identity", lambda: dict(IDENTITY))
    return tmp_path / "vllm_start"


def _start(args, wave, waves=2, plan=True, tp=1, measured=None):
    """One instance's start as VLLMEngine runs it: the turn, then vLLM (measuring when no size was given)."""
    turn, kwargs = _Turn(), dict(args)
    start = sp.StartTurn(kwargs, EngineStart(wait=turn.wait, wave=wave, waves=waves, plan=plan), tp)
    start.record(_Measured(measured if "kv_cache_memory_bytes" not in kwargs else 0))
    return turn.waited, kwargs.get("kv_cache_memory_bytes")


def test_the_key_ignores_the_seed_and_tells_waves_settings_and_gpus_apart():
    key = sp.plan_key(ARGS, 0, 2, IDENTITY)
    assert key == sp.plan_key({**ARGS, "seed": 8}, 0, 2, IDENTITY)  # each instance has its own seed
    others = [sp.plan_key(ARGS, 1, 2, IDENTITY), sp.plan_key(ARGS, 0, 1, IDENTITY),
              sp.plan_key({**ARGS, "gpu_memory_utilization": 0.2}, 0, 2, IDENTITY),
              sp.plan_key(ARGS, 0, 2, {**IDENTITY, "device": "NVIDIA H100 80GB HBM3"}),
              sp.plan_key(ARGS, 0, 2, {**IDENTITY, "vllm": "0.27.0"})]
    assert len({key, *others}) == 6


def test_first_run_measures_in_turn_and_the_next_starts_every_wave_at_once(plans):
    # first run: no plan, so each wave waits its turn (wave 0's wait returns at once) and measures
    assert _start(ARGS, 0, measured=17 * 2**30) == (1, None)
    assert _start({**ARGS, "seed": 8}, 1, measured=16 * 2**30) == (1, None)
    assert len(list(plans.glob("*.json"))) == 2
    # next run: every wave has a plan, so none waits and each gets back what it measured
    assert _start(ARGS, 0) == (0, 17 * 2**30)
    assert _start({**ARGS, "seed": 9}, 1) == (0, 16 * 2**30)
    record = json.loads(next(plans.glob("*.json")).read_text())
    assert record["device"] == "NVIDIA H200" and "seed" not in record["args"]


def test_a_plan_is_used_only_when_every_wave_of_the_gpu_has_one(plans):
    """Wave 0 alone recorded (wave 1 failed last time): a wave 0 that skipped the measurement could not tell, and
    wave 1 would then measure while wave 0 allocates, so both go in turn and wave 1 records its own."""
    _start(ARGS, 0, measured=17 * 2**30)
    assert _start(ARGS, 0) == (1, None)
    assert _start(ARGS, 1, measured=16 * 2**30) == (1, None)
    assert _start(ARGS, 1) == (0, 16 * 2**30)
    # other settings (here: another share of the GPU) have no plan
    assert _start({**ARGS, "gpu_memory_utilization": 0.3}, 1, measured=30 * 2**30) == (1, None)


def test_off_tensor_parallel_and_a_users_own_size_start_as_before(plans):
    _start(ARGS, 0, measured=17 * 2**30)
    _start(ARGS, 1, measured=16 * 2**30)
    assert _start(ARGS, 1, plan=False, measured=16 * 2**30) == (1, None)  # rollout.start_plan=false: in turn
    assert _start(ARGS, 1, tp=2, measured=16 * 2**30) == (1, None)  # its GPUs are its Ray workers'
    before = sorted(p.read_text() for p in plans.glob("*.json"))
    # a size in rollout.engine_args: nothing to measure or wait for, and nothing recorded
    assert _start({**ARGS, "kv_cache_memory_bytes": 2**30}, 1, waves=3) == (0, 2**30)
    assert sorted(p.read_text() for p in plans.glob("*.json")) == before


def test_a_gpu_that_cannot_be_identified_or_a_bad_plan_means_measuring_in_turn(plans, monkeypatch, caplog):
    _start(ARGS, 0, measured=17 * 2**30)
    _start(ARGS, 1, measured=16 * 2**30)
    path = plans / f"{sp.plan_key(ARGS, 1, 2, IDENTITY)}.json"
    path.write_text("{not json")
    with caplog.at_level(logging.WARNING):
        assert _start(ARGS, 0) == (1, None)  # wave 1's plan is unreadable: wave 0 goes in turn too
    assert "unreadable" in caplog.text
    path.write_text(json.dumps({"kv_cache_memory_bytes": -5}))
    assert sp.read_plan(path.stem, plans) is None

    def no_gpu():
        raise RuntimeError("NVML: no device")

    monkeypatch.setattr(sp, "device_identity", no_gpu)
    with caplog.at_level(logging.WARNING):
        assert _start(ARGS, 0, measured=17 * 2**30) == (1, None)
    assert "not identified" in caplog.text


def test_a_read_only_cache_costs_only_the_side_by_side_start(plans, monkeypatch, caplog):
    def refuse(*a, **k):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(sp.Path, "mkdir", refuse)
    with caplog.at_level(logging.WARNING):
        assert _start(ARGS, 0, measured=17 * 2**30) == (1, None)
    assert "not written" in caplog.text and not plans.exists()


class _Toy:
    tokenizer = None

    def generate(self, prompts, sp, *, on_samples_done=None, seeds=None):
        return [[] for _ in prompts]

    def load_state_dict(self, state_dict):
        pass


BUILT: list = []


def build_toy(rcfg, model_cfg, model_path, record_routes, seed=0, start=None):
    BUILT.append(start)
    return _Toy()


def test_make_engine_waits_the_turn_for_an_engine_that_does_not_plan_its_start(monkeypatch):
    monkeypatch.setitem(ENGINES, "toy", EngineSpec("toy", build=f"{__name__}:build_toy", gpu_memory=True,
                                                   weight_sync="state_dict"))
    turn, BUILT[:] = _Turn(), []
    start = EngineStart(wait=turn.wait, wave=1, waves=2, plan=True)
    make_engine({"engine": "toy"}, {}, "unused", record_routes=False, start=start)
    assert turn.waited == 1 and BUILT == [None]  # waited before its build, which was not handed the turn
    monkeypatch.setitem(ENGINES, "toy", EngineSpec("toy", build=f"{__name__}:build_toy", gpu_memory=True,
                                                   weight_sync="state_dict", plans_start=True))
    make_engine({"engine": "toy"}, {}, "unused", record_routes=False, start=start)
    assert turn.waited == 1 and BUILT[-1] is start  # its build takes the turn and decides
    assert ENGINES["vllm"].plans_start and not ENGINES["hf"].plans_start
