"""algorithm.on_policy=bitwise (issue 39): the CPU-checkable parts. The kernels themselves need vLLM on a Hopper GPU
(benchmarks/bitwise_probe.py)."""

import copy
import re
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from transformers import LlamaConfig, Qwen2MoeConfig, Qwen3Config

from rl.bitwise import unsupported_reason
from rl.config import ConfigError, head_options, validate
from trainer.bitwise import value_from

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def base_cfg():
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["+experiment=smol_math"])
    return OmegaConf.to_container(cfg, resolve=True)


def test_value_from_returns_exact_bits_and_the_ordinary_gradient():
    x = torch.randn(7, dtype=torch.float64, requires_grad=True)
    ordinary = (x * 3).sin()
    exact = ordinary.detach() + 1e-9 * torch.randn(7, dtype=torch.float64)  # other bits, as another kernel gives
    out = value_from(ordinary, exact)
    assert torch.equal(out.detach(), exact)  # not ordinary + (exact - ordinary): that rounds
    (out * torch.arange(7.0, dtype=torch.float64)).sum().backward()
    assert torch.allclose(x.grad, 3 * (x * 3).detach().cos() * torch.arange(7.0, dtype=torch.float64))


def test_supported_models_and_named_refusals():
    assert unsupported_reason(LlamaConfig(hidden_act="silu")) is None
    assert unsupported_reason(Qwen3Config()) is None
    assert "qwen2_moe" in unsupported_reason(Qwen2MoeConfig())
    assert "activation 'gelu'" in unsupported_reason(LlamaConfig(hidden_act="gelu"))
    assert "rotary scaling 'linear'" in unsupported_reason(
        LlamaConfig(rope_scaling={"rope_type": "linear", "factor": 2.0}))


@pytest.fixture
def bitwise_cfg(base_cfg):
    cfg = copy.deepcopy(base_cfg)
    cfg["algorithm"]["on_policy"] = "bitwise"
    cfg["rollout"]["engine"] = "vllm"
    cfg["trainer"]["device"] = "auto"  # resolved on the machine; cpu is refused
    cfg["model"]["dtype"] = "bfloat16"
    return cfg


def test_bitwise_config_accepted_and_passed_to_the_head(bitwise_cfg):
    validate(bitwise_cfg)
    assert head_options(bitwise_cfg)["bitwise"] is True


@pytest.mark.parametrize("section,key,value,named", [
    ("rollout", "engine", "hf", "rollout.engine=vllm"),
    ("rollout", "engine_core", "subprocess", "rollout.engine_core=in_process"),
    ("rollout", "tensor_parallel_size", 2, "rollout.tensor_parallel_size=1"),
    ("trainer", "zero_stage", 3, "trainer.zero_stage <= 2"),
    ("model", "fp32_lm_head", True, "model.fp32_lm_head=false"),
    ("model", "dtype", "float32", "model.dtype=bfloat16"),
    ("trainer", "device", "cpu", "trainer.device=cuda or auto"),
    ("rollout", "engine_args", {"kv_cache_dtype": "fp8"}, "no rollout.engine_args ['kv_cache_dtype']"),
])
def test_bitwise_refuses_what_cannot_match(bitwise_cfg, section, key, value, named):
    bitwise_cfg[section][key] = value
    with pytest.raises(ConfigError, match=re.escape(named)):
        validate(bitwise_cfg)


def test_bitwise_needs_the_kept_set_mask_when_sampling_truncates(bitwise_cfg):
    bitwise_cfg["rollout"]["top_p"] = 0.95
    validate(bitwise_cfg)  # keep_sampling_mask: auto turns it on
    bitwise_cfg["algorithm"]["keep_sampling_mask"] = False
    with pytest.raises(ConfigError, match="keep_sampling_mask"):
        validate(bitwise_cfg)


def test_only_the_reference_takes_the_bitwise_path(base_cfg, tiny_dense_path):
    """A teacher may be any family and its grade gains nothing from the engine's bits (trainer/frozen.py)."""
    from trainer.frozen import FrozenModel

    cfg = copy.deepcopy(base_cfg)
    cfg["algorithm"]["on_policy"] = "bitwise"
    cfg["trainer"]["device"] = "cpu"  # building it only: the bitwise forward itself needs vLLM on a Hopper GPU
    assert FrozenModel(cfg, tiny_dense_path, role="reference").head["bitwise"] is True
    assert FrozenModel(cfg, tiny_dense_path, role="teacher").head["bitwise"] is False


def test_unknown_on_policy_mode_is_refused(base_cfg):
    cfg = copy.deepcopy(base_cfg)
    cfg["algorithm"]["on_policy"] = "exact"
    with pytest.raises(ConfigError, match="on_policy"):
        validate(cfg)


def test_an_unsupported_model_is_refused_before_anything_starts(tiny_moe_path, monkeypatch):
    """launch.config.prepare names the layer the bitwise forward cannot reproduce (here: routed experts)."""
    from launch import config as launch_config

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose(config_name="train", overrides=[
            "+experiment=smoke_learn", "algorithm.on_policy=bitwise", "rollout.engine=vllm", "model.dtype=bfloat16",
            "trainer.device=auto", "rollout.top_p=1.0", "rollout.top_k=0"]), resolve=True)
    cfg["model"]["path"] = tiny_moe_path
    monkeypatch.setattr(launch_config, "check_config", lambda cfg: None)  # vLLM is not installed on the CPU machines
    with pytest.raises(ConfigError, match="algorithm.on_policy=bitwise cannot match the engine.*qwen3_moe"):
        launch_config.prepare(cfg)
