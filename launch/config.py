"""The config at start: compose it (Hydra), check all of it before any actor starts, and fill what depends on
the model. Every mistake stops the run here with a `ConfigError` naming the key.

`rl.config.validate` checks the algorithm, sampling, batch and per-domain keys; this adds what needs the layers
above it: reward names and parameters (`rewards.compose`), GPU shares (`launch/placement.py`), the objective
(`trainer.objectives`), the overlap of rollout and training, and the model itself (MoE and Keep Routing).
"""

from __future__ import annotations

from pathlib import Path

from launch.placement import check_gpu_layout, is_colocated_vllm
from rewards.compose import check_reward_specs
from rl.config import ConfigError, check_number, resolve_auto, to_plain, validate
from rl.models import resolve_model_path
from trainer.objectives import OBJECTIVES

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def compose(overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """conf/train.yaml composed with Hydra overrides, resolved to plain dicts (what `python -m launch.train` runs)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return to_plain(hydra_compose(config_name="train", overrides=list(overrides)))


def check_config(cfg: dict) -> None:
    """Raise ConfigError for the first problem found (nothing is started)."""
    validate(cfg)
    try:
        check_reward_specs(cfg["domains"], cfg["rewards"], cfg["rollout"]["max_new_tokens"])
    except ValueError as e:
        raise ConfigError(str(e)) from e
    check_gpu_layout(cfg)
    objective = cfg["algorithm"].get("objective", "grpo")
    if objective not in OBJECTIVES:
        raise ConfigError(f"algorithm.objective must be one of {sorted(OBJECTIVES)}, got {objective!r}")
    staleness = check_number(cfg["rollout"], "max_staleness", "rollout", lo=0, integer=True, optional=True) or 0
    if staleness and is_colocated_vllm(cfg):
        raise ConfigError("rollout.max_staleness > 0 overlaps rollout with training, which colocated vLLM cannot do "
                          "(it sleeps while the trainer trains): use rollout.placement=split, or 0")


def model_is_moe(model_path: str, keep_routing) -> bool:
    """Whether the policy is a mixture of experts; with Keep Routing wanted, also that its router is supported."""
    from transformers import AutoConfig

    from rl.routing import UnsupportedMoEError, moe_layer_indices

    config = AutoConfig.from_pretrained(model_path)
    try:
        return moe_layer_indices(config) is not None
    except UnsupportedMoEError as e:
        if keep_routing is False:
            return True  # an MoE we cannot replay, and the user turned replay off: fine
        raise ConfigError(f"algorithm.keep_routing: {e} (set algorithm.keep_routing=false to train without it)") from e


def prepare(cfg: dict) -> str:
    """Check the config, build or find the model, and fill the `auto` switches; returns the model's path."""
    check_config(cfg)
    model_path = resolve_model_path(cfg["model"]["path"])
    resolve_auto(cfg, model_is_moe(model_path, cfg["algorithm"]["keep_routing"]))
    return model_path
