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

IDENTITY = {"vllm": "0.26.0", "torch": "2.11.0", "cuda": "13.0", "driver": "580.95", "device": "NVIDIA H200",
            "memory": 150 * 2**30, "env": {}}
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


def _start(args, wave, waves=2, plan=True, tp=1, measured=None, before=None, record=True):
    """One instance's start as VLLMEngine runs it: the turn, then vLLM (measuring when no size was given)."""
    turn, kwargs = _Turn(), dict(args)
    start = sp.StartTurn(kwargs, EngineStart(wait=turn.wait, wave=wave, waves=waves, plan=plan, plans_before=before,
                                             record=record), tp)
    start.record(_Measured(measured if "kv_cache_memory_bytes" not in kwargs else 0))
    return turn.waited, kwargs.get("kv_cache_memory_bytes")


def test_the_key_ignores_the_seed_and_tells_waves_settings_gpus_and_models_apart(tmp_path):
    key = sp.plan_key(ARGS, 0, 2, IDENTITY)
    assert key == sp.plan_key({**ARGS, "seed": 8}, 0, 2, IDENTITY)  # each instance has its own seed
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 576}')
    local = sp.plan_key({**ARGS, "model": str(model)}, 0, 2, IDENTITY)
    others = [sp.plan_key(ARGS, 1, 2, IDENTITY), sp.plan_key(ARGS, 0, 1, IDENTITY),
              sp.plan_key({**ARGS, "gpu_memory_utilization": 0.2}, 0, 2, IDENTITY),
              sp.plan_key(ARGS, 0, 2, {**IDENTITY, "device": "NVIDIA H100 80GB HBM3"}),
              sp.plan_key(ARGS, 0, 2, {**IDENTITY, "vllm": "0.27.0"}),
              sp.plan_key(ARGS, 0, 2, {**IDENTITY, "env": {"VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": "0"}}), local]
    assert len({key, *others}) == 8
    (model / "config.json").write_text('{"hidden_size": 1024}')  # the directory rewritten in place
    assert sp.plan_key({**ARGS, "model": str(model)}, 0, 2, IDENTITY) != local
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" in sp.MEMORY_ENV  # rollout.engine_core's switch


def test_first_run_goes_in_turn_and_the_next_starts_every_wave_at_once(plans):
    # first run: no plan, so each wave waits its turn (wave 0's wait returns at once); wave 0 measures, and wave 1,
    # once its turn comes, starts with the size wave 0 measured (the same engine arguments but the seed)
    assert _start(ARGS, 0, measured=17 * 2**30) == (1, None)
    assert _start({**ARGS, "seed": 8}, 1, measured=16 * 2**30) == (1, 17 * 2**30)
    assert len(list(plans.glob("*.json"))) == 2  # wave 1 recorded the size it started with as its own plan
    # next run: every wave has a plan, so none waits
    assert _start(ARGS, 0) == (0, 17 * 2**30)
    assert _start({**ARGS, "seed": 9}, 1) == (0, 17 * 2**30)
    record = json.loads(next(plans.glob("*.json")).read_text())
    assert record["device"] == "NVIDIA H200" and "seed" not in record["args"]


def test_a_later_wave_borrows_only_what_the_wave_before_recorded_in_this_run(plans):
    """As a run has it (EngineStart.plans_before set): wave 1 takes what this run's wave 0 recorded. A record names
    its run, so a plan of wave 0 from an earlier run, with this run's wave 0 not recording (it measured nothing),
    is not taken: wave 1 then measures in turn, as it did before borrowing existed. Wave 0 never borrows."""
    import time

    first = time.time()
    assert _start(ARGS, 0, measured=17 * 2**30, before=first) == (1, None)
    assert _start(ARGS, 1, measured=16 * 2**30, before=first) == (1, 17 * 2**30)
    second = time.time() + 1
    assert [_start(ARGS, w, before=second) for w in (0, 1)] == [(0, 17 * 2**30)] * 2  # the next run: both plans
    other = {**ARGS, "max_model_len": 4096}
    _start(other, 0, measured=17 * 2**30, before=first)  # an earlier run: wave 0 recorded, wave 1 failed
    assert _start(other, 0, measured=0, before=second) == (1, None)  # this run's wave 0 records nothing
    assert _start(other, 1, measured=16 * 2**30, before=second) == (1, None)  # so wave 1 measures
    assert json.loads((plans / f"{sp.plan_key(other, 1, 2, IDENTITY)}.json").read_text())["kv_cache_memory_bytes"] \
        == 16 * 2**30
    assert sp.borrowed_plan(ARGS, 0, 2, IDENTITY, plans) is None
    # three waves: each borrows from the one before it, wave 2 what wave 1 borrowed
    three = {**ARGS, "gpu_memory_utilization": 0.1}
    assert _start(three, 0, waves=3, measured=12 * 2**30, before=first) == (1, None)
    assert _start(three, 1, waves=3, measured=11 * 2**30, before=first) == (1, 12 * 2**30)
    assert _start(three, 2, waves=3, measured=11 * 2**30, before=first) == (1, 12 * 2**30)
    assert [_start(three, w, waves=3, before=second) for w in range(3)] == [(0, 12 * 2**30)] * 3
    # a restarted wave 1 measures beside running instances and takes nothing; a size over the instance's share of
    # the GPU (0.15 of 150 GiB) is not taken
    third = {**ARGS, "max_model_len": 8192}
    _start(third, 0, measured=17 * 2**30, before=first)
    assert _start(third, 1, measured=16 * 2**30, before=first, record=False) == (1, None)
    sp.write_plan(third, 0, 2, IDENTITY, 30 * 2**30, plans, run=second)
    assert _start(third, 1, measured=16 * 2**30, before=second) == (1, None)


def test_the_same_wave_of_several_gpus_keeps_the_smallest_size_of_the_run(plans):
    """Every GPU's wave 0 writes one file (the key has no GPU index): within a run the smallest size stays, so a wave
    1 that borrows it takes no more than any wave 0 measured; a later run's record replaces it."""
    key = sp.plan_key(ARGS, 0, 2, IDENTITY)
    sp.write_plan(ARGS, 0, 2, IDENTITY, 17 * 2**30, plans, run=1.0)
    sp.write_plan(ARGS, 0, 2, IDENTITY, 16 * 2**30, plans, run=1.0)
    sp.write_plan(ARGS, 0, 2, IDENTITY, 18 * 2**30, plans, run=1.0)
    assert sp.read_plan(key, plans, run=1.0) == 16 * 2**30
    assert sp.borrowed_plan(ARGS, 1, 2, IDENTITY, plans, run=1.0) == 16 * 2**30
    assert sp.borrowed_plan(ARGS, 1, 2, IDENTITY, plans, run=2.0) is None  # not this run's
    sp.write_plan(ARGS, 0, 2, IDENTITY, 18 * 2**30, plans, run=2.0)
    assert sp.read_plan(key, plans) == 18 * 2**30


def test_a_plan_is_used_only_when_every_wave_of_the_gpu_has_one(plans):
    """Wave 1's plan missing (it failed last time): a wave 0 that skipped the measurement could not tell, and wave 1
    would then measure while wave 0 allocates, so both go in turn; wave 1 records a plan this time."""
    _start(ARGS, 0, measured=17 * 2**30)
    assert _start(ARGS, 0, measured=17 * 2**30) == (1, None)
    assert _start(ARGS, 1, measured=16 * 2**30) == (1, 17 * 2**30)
    assert _start(ARGS, 1) == (0, 17 * 2**30)
    # other settings (here: another share of the GPU) have no plan, and wave 0 of theirs never measured
    assert _start({**ARGS, "gpu_memory_utilization": 0.3}, 1, measured=30 * 2**30) == (1, None)


def test_plans_written_after_the_run_began_wait_for_the_next_run(plans):
    """The waves of a GPU decide one by one as their imports end. Another GPU's instance, or another run sharing the
    cache, may record the missing plan between two of those decisions: a wave that then skipped its wait would
    allocate while an earlier one measures. Each reads only the plans written before its run created the workers."""
    import time

    _start(ARGS, 0, measured=17 * 2**30)  # wave 1's plan is missing when this run begins
    began = time.time()
    time.sleep(0.05)
    _start(ARGS, 1, measured=16 * 2**30)  # ... and recorded meanwhile by another run
    assert _start(ARGS, 1, before=began) == (1, None)  # this run's wave 1 still goes in turn, as wave 0 did
    assert _start(ARGS, 0, before=time.time() + 1) == (0, 17 * 2**30)  # the next run uses both


def test_a_restarted_instance_records_nothing_and_an_oversized_plan_is_measured_again(plans, caplog):
    # a restart measures beside running instances (the trainer, the other instance): not a plan for its wave
    assert _start(ARGS, 0, measured=5 * 2**30, record=False) == (1, None)
    assert not plans.exists()
    _start(ARGS, 0, measured=17 * 2**30)
    _start(ARGS, 1, measured=16 * 2**30)
    # a plan over the instance's share of the GPU (0.15 of 150 GiB here) would take the trainer's memory: all waves
    # measure again, in turn
    path = plans / f"{sp.plan_key(ARGS, 1, 2, IDENTITY)}.json"
    path.write_text(json.dumps({"kv_cache_memory_bytes": 30 * 2**30}))
    with caplog.at_level(logging.WARNING):
        assert _start(ARGS, 0) == (1, None)
    assert "more than the instance's share" in caplog.text


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


def test_a_rollout_worker_takes_its_wave_from_its_rank_and_a_restart_records_nothing(monkeypatch):
    """launch.cluster.ActorPool starts worker i in wave i % engines_per_gpu; the worker hands its engine that turn,
    the run's start time for the plans, and whether it is a restart (after=None, ActorPool.replace)."""
    from launch.train import CONF_DIR
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rollout.worker import RolloutWorker

    monkeypatch.setitem(ENGINES, "toy", EngineSpec("toy", build=f"{__name__}:build_toy", gpu_memory=True,
                                                   weight_sync="state_dict", plans_start=True))
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = OmegaConf.to_container(compose(config_name="train", overrides=[
            "+experiment=mixed_rl", "rollout.engine=toy", "+rollout.placement=colocated", "rollout.num_workers=4",
            "rollout.num_gpus=0.2", "trainer.num_processes=2"]), resolve=True)
    cfg["domains"] = {k: v for k, v in cfg["domains"].items() if not v.get("agent")}  # (the toy has no tokenizer)
    BUILT[:] = []
    RolloutWorker(cfg, "unused", 3, after=[], plans_before=123.0)
    RolloutWorker(cfg, "unused", 2, after=None)
    first, restart = BUILT
    assert (first.wave, first.waves, first.plans_before, first.record) == (1, 2, 123.0, True)
    assert (restart.wave, restart.waves, restart.record) == (0, 2, False)


# SmolLM2-135M's config.json (the shapes the KV cache depends on)
SMOL_CONFIG = {"model_type": "llama", "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
               "hidden_size": 576, "torch_dtype": "bfloat16", "max_position_embeddings": 8192}


def _local_model(folder, config, weight_bytes=270_000_000):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    with open(folder / "model.safetensors", "wb") as f:
        f.truncate(weight_bytes)
    return str(folder)


def test_kv_bytes_per_token_of_plain_attention_and_none_for_other_layouts():
    assert sp.kv_bytes_per_token(SMOL_CONFIG, "bfloat16") == 2 * 30 * 3 * 64 * 2  # head_dim = 576 / 9
    qwen3 = {"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
             "hidden_size": 1024}
    assert sp.kv_bytes_per_token(qwen3, "bfloat16") == 2 * 28 * 8 * 128 * 2
    assert sp.kv_bytes_per_token(qwen3, "auto", "fp8_e4m3") == 2 * 28 * 8 * 128
    assert sp.kv_bytes_per_token(qwen3, "float32") == 2 * 28 * 8 * 128 * 4
    assert sp.kv_bytes_per_token({**qwen3, "num_key_value_heads": None}, "bfloat16") == 2 * 28 * 16 * 128 * 2
    assert sp.kv_bytes_per_token({**qwen3, "layer_types": ["full_attention", "sliding_attention"]},
                                 "bfloat16") == 2 * 28 * 8 * 128 * 2  # sliding layers hold less: an upper bound
    assert sp.kv_bytes_per_token({**qwen3, "layer_types": ["linear_attention", "full_attention"]}, "bfloat16") is None
    assert sp.kv_bytes_per_token({**qwen3, "mamba_d_state": 128}, "bfloat16") is None
    assert sp.kv_bytes_per_token({"text_config": qwen3}, "bfloat16") is None
    assert sp.kv_bytes_per_token({"num_hidden_layers": 28}, "bfloat16") is None


def test_a_sized_start_takes_max_num_seqs_by_max_model_len_when_it_fits_the_share(tmp_path, caplog):
    model = _local_model(tmp_path / "smol", SMOL_CONFIG)
    args = {**ARGS, "model": model, "max_num_seqs": 256, "max_model_len": 768}
    assert sp.sized_kv_bytes(args, IDENTITY) == 256 * 768 * 23040  # 4.2 GiB in a 22.5 GiB share
    # each sequence rounded up to whole 256-token blocks (vLLM's blocks are at most that long)
    assert sp.sized_kv_bytes({**args, "max_model_len": 700}, IDENTITY) == 256 * 768 * 23040
    # not bounded (vLLM's defaults: the model's 8192 tokens, 1024 sequences on an H200), a hub name, no GPU memory
    assert sp.sized_kv_bytes({**args, "max_num_seqs": None}, IDENTITY) is None
    assert sp.sized_kv_bytes({k: v for k, v in args.items() if k != "max_model_len"}, IDENTITY) is None
    assert sp.sized_kv_bytes({**args, "model": "HuggingFaceTB/SmolLM2-135M-Instruct"}, IDENTITY) is None
    assert sp.sized_kv_bytes(args, {**IDENTITY, "memory": 0}) is None
    # too large for the share once the weights and the spare are out: measured instead
    with caplog.at_level(logging.INFO):
        assert sp.sized_kv_bytes({**args, "max_num_seqs": 1024}, IDENTITY) is not None  # 16.9 + 0.25 + 4.25 GiB
        assert sp.sized_kv_bytes({**args, "max_num_seqs": 1100}, IDENTITY) is None  # 18.1 + 0.25 + 4.25 > 22.5
    assert "no sized vLLM start" in caplog.text
    heavy = _local_model(tmp_path / "heavy", SMOL_CONFIG, weight_bytes=17 * 2**30)
    assert sp.sized_kv_bytes({**args, "model": heavy}, IDENTITY) is None
    (tmp_path / "smol" / "config.json").write_text("{broken")
    assert sp.sized_kv_bytes(args, IDENTITY) is None


def test_a_sized_start_runs_every_wave_at_once_from_the_first_run_and_records_nothing(plans, tmp_path):
    model = _local_model(tmp_path / "smol", SMOL_CONFIG)
    args = {**ARGS, "model": model, "max_num_seqs": 256, "max_model_len": 768}
    sized = 256 * 768 * 23040
    assert [_start({**args, "seed": w}, w, measured=17 * 2**30) for w in (0, 1)] == [(0, sized)] * 2
    assert not plans.exists()
    # it comes before a plan recorded by a measured start of the same arguments
    sp.write_plan(args, 0, 2, IDENTITY, 17 * 2**30, plans)
    sp.write_plan(args, 1, 2, IDENTITY, 17 * 2**30, plans)
    assert _start(args, 1) == (0, sized)
    # rollout.start_plan=false measures, in turn, as before
    assert _start(args, 1, plan=False, measured=17 * 2**30) == (1, None)


def test_smol_math_starts_sized_on_an_h200_and_an_h100(tmp_path):
    """The experiment's own rollout keys, as VLLMEngine hands them to vLLM, give a sized start on both GPUs the
    benchmarks run on (SmolLM2's shapes; its converted bf16 checkpoint is ~270 MB)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from launch.train import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        r = OmegaConf.to_container(compose(config_name="train", overrides=["+experiment=smol_math"]),
                                   resolve=True)["rollout"]
    data_max = 512  # data.max_prompt_tokens: longer prompts are skipped
    assert r["max_model_len"] >= data_max + r["max_new_tokens"]
    args = {"model": _local_model(tmp_path / "smol", SMOL_CONFIG), "dtype": "bfloat16",
            "gpu_memory_utilization": r["gpu_memory_utilization"], "max_num_seqs": r["max_num_seqs"],
            "max_model_len": r["max_model_len"]}
    assert r["max_num_seqs"] >= 32 * 8 // r["num_workers"]  # a step's samples per instance, all at once
    for memory in (143 * 2**30, 80 * 2**30):
        assert sp.sized_kv_bytes(args, {**IDENTITY, "memory": memory}) is not None


def test_rollout_compile_false_gives_vllm_no_torch_compile_and_decode_only_graphs():
    """The vLLM arguments `smol_math`'s `rollout.compile: false` stands for (the ones its GPU runs were timed with);
    an eager engine gets none (enforce_eager, or the bitwise mode, which excludes a compilation_config)."""
    from rollout.vllm_engine import compilation_args

    assert compilation_args(False, False, False) == {"compilation_config": {"mode": 0,
                                                                            "cudagraph_mode": "FULL_DECODE_ONLY"}}
    assert compilation_args(True, False, False) == {}  # vLLM's default: compiled
    assert compilation_args(False, True, False) == {} and compilation_args(False, False, True) == {}
