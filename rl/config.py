"""Start-up validation of the resolved Hydra config: every mistake fails here, naming the key.

Hydra already rejects overrides of keys that do not exist (struct mode); this catches what it cannot: keys
added with `+`, wrong types and ranges, inconsistent batch shapes, and per-domain blocks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rl.losses import AGGREGATIONS


class ConfigError(ValueError):
    """A config value is wrong; the message starts with the dotted key."""


DOMAIN_KEYS = {"weight", "dataset", "kl_coef", "opsm_delta", "rewards"}
DATASET_KEYS = {"path", "name", "split", "columns", "system_prompt", "data_files"}
ENGINES = {"hf", "vllm", "auto"}
AUTO_BOOL = {"auto", True, False}
LOGGER_MODES = {"auto", "online", "offline", "disabled"}


def _num(cfg: Mapping, key: str, path: str, *, lo: float | None = None, hi: float | None = None,
         lo_open: bool = False, integer: bool = False, optional: bool = False) -> Any:
    value = cfg.get(key)
    where = f"{path}.{key}"
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{where} is required")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise ConfigError(f"{where} must be {'an integer' if integer else 'a number'}, got {value!r}")
    if math.isnan(value):
        raise ConfigError(f"{where} must not be NaN")
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise ConfigError(f"{where} must be {'>' if lo_open else '>='} {lo}, got {value}")
    if hi is not None and value > hi:
        raise ConfigError(f"{where} must be <= {hi}, got {value}")
    return value


def _choice(cfg: Mapping, key: str, path: str, choices: set) -> Any:
    value = cfg.get(key)
    if value not in choices:
        raise ConfigError(f"{path}.{key} must be one of {sorted(map(str, choices))}, got {value!r}")
    return value


def validate_domains(domains: Any) -> None:
    if domains is None or not isinstance(domains, Mapping) or not domains:
        raise ConfigError("domains is empty: pick an experiment (e.g. +experiment=mixed_rl) or set domains.<name>")
    for name, d in domains.items():
        path = f"domains.{name}"
        if not isinstance(d, Mapping):
            raise ConfigError(f"{path} must be a mapping with keys {sorted(DOMAIN_KEYS)}")
        unknown = set(d) - DOMAIN_KEYS
        if unknown:
            raise ConfigError(f"{path}.{sorted(unknown)[0]}: unknown key; allowed: {sorted(DOMAIN_KEYS)}")
        _num(d, "weight", path, lo=0, lo_open=True)
        _num(d, "kl_coef", path, lo=0)
        _num(d, "opsm_delta", path, lo=0, optional=True)  # absent = null = off
        ds = d.get("dataset")
        if not isinstance(ds, Mapping) or not ds.get("path"):
            raise ConfigError(f"{path}.dataset.path is required (a local file/dir, bundled:<file>, or a hub name)")
        unknown = set(ds) - DATASET_KEYS
        if unknown:
            raise ConfigError(f"{path}.dataset.{sorted(unknown)[0]}: unknown key; allowed: {sorted(DATASET_KEYS)}")
        cols = ds.get("columns") or {}
        if not isinstance(cols, Mapping) or "prompt" not in cols:
            raise ConfigError(f"{path}.dataset.columns must map at least `prompt` to a dataset column")
        rewards = d.get("rewards")
        if not isinstance(rewards, (list, tuple)) or not rewards:
            raise ConfigError(f"{path}.rewards must be a non-empty list of {{name, weight, ...}}")
        for i, spec in enumerate(rewards):
            if not isinstance(spec, Mapping) or "name" not in spec:
                raise ConfigError(f"{path}.rewards[{i}] must be a mapping with a `name`")
            _num(spec, "weight", f"{path}.rewards[{i}]")


def validate(cfg: Mapping) -> None:
    """Raise ConfigError for the first problem found."""
    validate_domains(cfg.get("domains"))
    r, t, a, data = cfg["rollout"], cfg["trainer"], cfg["algorithm"], cfg["data"]
    _num(r, "n_samples", "rollout", lo=1, integer=True)
    _choice(r, "engine", "rollout", ENGINES)
    if "capture" in r:
        _choice(r, "capture", "rollout", {"sampler", "logprobs"})
    if _num(r, "temperature", "rollout", lo=0) and r["temperature"] < 1e-5:
        # vLLM treats such temperatures as greedy (plain logprobs) while the trainer would divide by them
        raise ConfigError(f"rollout.temperature must be 0 (greedy) or >= 1e-5, got {r['temperature']}")
    _num(r, "top_p", "rollout", lo=0, lo_open=True, hi=1)
    _num(r, "top_k", "rollout", lo=0, integer=True)
    _num(r, "max_new_tokens", "rollout", lo=1, integer=True)
    _num(r, "num_workers", "rollout", lo=1, integer=True)
    _num(data, "prompts_per_step", "data", lo=1, integer=True)
    _num(data, "max_prompt_tokens", "data", lo=1, integer=True)
    for key in ("total_steps", "num_processes", "micro_batch_size", "mini_batches"):
        _num(t, key, "trainer", lo=1, integer=True)
    _num(t, "save_every", "trainer", lo=0, integer=True)
    _num(t, "keep_checkpoints", "trainer", lo=0, integer=True)
    _num(t, "warmup_steps", "trainer", lo=0, integer=True)
    _num(t, "logprob_chunk_size", "trainer", lo=1, integer=True)
    _num(t, "grad_clip", "trainer", lo=0)
    _num(t, "lr", "trainer", lo=0)
    _choice(t, "zero_stage", "trainer", {0, 1, 2, 3})
    _num(a, "clip_eps_low", "algorithm", lo=0, hi=1)
    _num(a, "clip_eps_high", "algorithm", lo=0)
    _choice(a, "loss_aggregation", "algorithm", set(AGGREGATIONS))
    for key in ("keep_sampling_mask", "keep_routing"):
        _choice(a, key, "algorithm", AUTO_BOOL)
    _choice(cfg["logger"], "mode", "logger", LOGGER_MODES)
    _check_gpu_layout(cfg)
    samples = data["prompts_per_step"] * r["n_samples"]
    shards = t["mini_batches"] * t["num_processes"]
    if samples % shards:
        raise ConfigError(
            f"trainer.mini_batches: data.prompts_per_step * rollout.n_samples = {samples} samples per step must "
            f"split evenly into trainer.mini_batches * trainer.num_processes = {shards} shards"
        )


def _check_gpu_layout(cfg: Mapping) -> None:
    """vLLM placement and the GPU shares of the actors (checked before Ray starts: a wrong share would hang in Ray
    waiting for resources that never come)."""
    r, t = cfg["rollout"], cfg["trainer"]
    if "placement" in r:
        _choice(r, "placement", "rollout", {"colocated", "split"})
    if r["engine"] == "vllm" and r.get("placement", "colocated") == "colocated" and float(r.get("num_gpus") or 0) > 0:
        if int(r["num_workers"]) != int(t["num_processes"]) or int(r.get("tensor_parallel_size", 1)) != 1:
            raise ConfigError(
                "rollout.placement=colocated pairs trainer rank i with rollout worker i on one GPU: it needs "
                f"rollout.num_workers == trainer.num_processes (got {r['num_workers']} and {t['num_processes']}) "
                f"and rollout.tensor_parallel_size == 1 (got {r.get('tensor_parallel_size', 1)}); use "
                "rollout.placement=split for tensor-parallel rollouts"
            )
    colocated_shares(cfg)
    if t.get("device") == "cuda" and needs_reference(cfg) and not float(t.get("ref_num_gpus") or 0):
        raise ConfigError(
            "trainer.ref_num_gpus: the reference model (some domain has kl_coef > 0) would see no GPU with "
            "trainer.device=cuda; give it a GPU share (e.g. trainer.ref_num_gpus=0.1, on GPU 0 when colocated)"
        )


def colocated_shares(cfg: Mapping) -> dict[str, float]:
    """GPU shares that colocated vLLM puts on one GPU: the worker and the trainer rank on every GPU, plus on GPU 0
    the reference model and the rubric judge when they ask for a fraction of a GPU (a whole GPU or more is placed
    outside, on a GPU of its own). Empty when the run is not colocated vLLM. Raises ConfigError naming the keys."""
    r, t = cfg["rollout"], cfg["trainer"]
    gpus_r, gpus_t = float(r.get("num_gpus") or 0), float(t.get("num_gpus") or 0)
    if r["engine"] == "hf" or r.get("placement", "colocated") != "colocated" or gpus_r <= 0:
        return {}
    if gpus_t <= 0:
        raise ConfigError(f"rollout.placement=colocated: trainer.num_gpus must be > 0 (e.g. 0.5) to share the "
                         f"rollout worker's GPU, got {gpus_t}")
    shares = {"rollout.num_gpus": gpus_r, "trainer.num_gpus": gpus_t}
    extra = {"trainer.ref_num_gpus": float(t.get("ref_num_gpus") or 0) if needs_reference(cfg) else 0.0,
             "rewards.judge.num_gpus": float(((cfg.get("rewards") or {}).get("judge") or {}).get("num_gpus") or 0)
             if _uses_judge(cfg) else 0.0}
    shares.update({k: v for k, v in extra.items() if 0 < v < 1})
    if sum(shares.values()) > 1.0 + 1e-9:
        raise ConfigError("rollout.placement=colocated: the GPU shares on one GPU must sum to <= 1, got "
                         + " + ".join(f"{k} {v}" for k, v in shares.items()))
    return shares


def needs_reference(cfg: Mapping) -> bool:
    """Some domain has kl_coef > 0 (else the reference model is never started)."""
    return any(float(d["kl_coef"]) > 0 for d in (cfg.get("domains") or {}).values())


def _uses_judge(cfg: Mapping) -> bool:
    from rewards.judge import uses_rubric_judge

    return uses_rubric_judge(cfg.get("domains") or {})


def resolve_auto(cfg: dict, is_moe: bool) -> dict:
    """Fill `auto` switches from the sampling settings and the model; returns cfg (mutated)."""
    a, r = cfg["algorithm"], cfg["rollout"]
    if a["keep_sampling_mask"] == "auto":
        a["keep_sampling_mask"] = bool(r["top_p"] < 1.0 or r["top_k"] > 0)
    if a["keep_routing"] == "auto":
        a["keep_routing"] = bool(is_moe)
    if a["keep_routing"] and not is_moe:
        raise ConfigError("algorithm.keep_routing=true but the policy is not a mixture-of-experts model")
    return cfg


def logprob_temperature(rcfg: dict) -> float:
    """The temperature the trainer divides logits by: the sampling one, or 1 for greedy (temperature 0), whose
    reported logprobs are the plain ones in both engines."""
    return float(rcfg["temperature"]) or 1.0
