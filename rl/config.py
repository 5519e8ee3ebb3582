"""Validation of the resolved Hydra config's algorithm, sampling, batch and per-domain keys (`ConfigError` names
the key), the `auto` switches, and small helpers every layer reads the config with.

Hydra already rejects overrides of keys that do not exist (struct mode); this catches what it cannot: wrong types
and ranges, inconsistent batch shapes, and per-domain blocks. What needs other layers (reward names and
parameters, GPU shares, the model) is checked at start by `launch/config.py`, which calls `validate` first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rl.bitwise import BITWISE, ON_POLICY_MODES
from rl.engine_specs import AUTO, engine_names, installed, placement_spec
from rl.losses import AGGREGATIONS


class ConfigError(ValueError):
    """A config value is wrong; the message starts with the dotted key."""


DOMAIN_KEYS = {"weight", "dataset", "eval_dataset", "kl_coef", "opsm_delta", "rewards", "agent", "teacher", "distill_coef", "reward_coef",
               "thinking"}
DATASET_KEYS = {"path", "name", "split", "columns", "system_prompt", "data_files", "where"}
AUTO_BOOL = {"auto", True, False}
LOGGER_MODES = {"auto", "online", "offline", "disabled"}

# The one default of each optional rollout / trainer key the code reads with a fallback (`rcfg.get(key,
# ROLLOUT_DEFAULTS[key])`): what a config without the key gets (a tool that builds a partial config, a test). The
# YAML holds the same values (conf/rollout/vllm.yaml, and conf/rollout/hf.yaml where it has the key;
# conf/trainer/deepspeed.yaml): tests/test_config_defaults.py compares them, and finds code that reads one of these
# keys with a default of its own.
ROLLOUT_DEFAULTS: dict[str, Any] = {
    "placement": "colocated",
    "tensor_parallel_size": 1,
    "gpu_memory_utilization": 0.4,
    "enable_sleep_mode": True,
    "sleep_level": 2,
    "enforce_eager": False,
    "compile": True,
    "per_request_seed": False,
    "capture": "sampler",
    "engine_core": "in_process",
    "kv_cache_dtype": "auto",
    "kept_set_buffer_mb": 256,
    "start_plan": True,
    "payload_by_reference": True,
    "weight_sync_bucket_mb": 512,
    "weight_sync_packed": True,
    "weight_sync_timeout_s": 1800,
    "timeout_s": 3600,
    "max_staleness": 0,
    "top_p": 1.0,
    "top_k": 0,
}
TRAINER_DEFAULTS: dict[str, Any] = {
    "device": "auto",
    "zero_stage": 2,
    "ref_placement": "actor",
    "ref_num_gpus": 0,
    "pack_sequences": "auto",
    "micro_batch_memory": 0.75,
    "logprob_head": "dense",
    "compile": False,
    "coalesce_grad_reduction": True,
    "save_last": True,
    "profile_step": 0,
    "offload_optimizer": "none",
    "fused_adam": False,
}


def check_number(cfg: Mapping, key: str, path: str, *, lo: float | None = None, hi: float | None = None,
         lo_open: bool = False, integer: bool = False, optional: bool = False, allow_inf: bool = False) -> Any:
    """`cfg[key]` is a number in range; NaN never, +-inf only with `allow_inf` (a key where inf means "no limit",
    e.g. opsm_delta): an infinite weight, lr or temperature would pass here and fail the run minutes later."""
    value = cfg.get(key)
    where = f"{path}.{key}"
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{where} is required")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise ConfigError(f"{where} must be {'an integer' if integer else 'a number'}, got {value!r}")
    if isinstance(value, float):
        if math.isnan(value):
            raise ConfigError(f"{where} must not be NaN")
        if math.isinf(value) and not allow_inf:
            raise ConfigError(f"{where} must be a finite number, got {value}")
    elif not integer:
        try:
            float(value)
        except OverflowError:  # an int past float range: every later float(value) would raise
            raise ConfigError(f"{where} must be a finite number, got an integer of {value.bit_length()} bits") from None
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise ConfigError(f"{where} must be {'>' if lo_open else '>='} {lo}, got {value}")
    if hi is not None and value > hi:
        raise ConfigError(f"{where} must be <= {hi}, got {value}")
    return value


def check_choice(cfg: Mapping, key: str, path: str, choices: set) -> Any:
    """`cfg[key]` is one of `choices`, a bool only where the choices name one: Python's 1 == True would otherwise let
    `trainer.compile=1` or `trainer.zero_stage=true` through."""
    value = cfg.get(key)
    if not any(value == c and isinstance(value, bool) == isinstance(c, bool) for c in choices):
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
        check_number(d, "weight", path, lo=0)  # 0 switches the domain off
        check_number(d, "kl_coef", path, lo=0)
        check_number(d, "opsm_delta", path, lo=0, optional=True, allow_inf=True)  # absent = null = inf = off
        check_number(d, "distill_coef", path, lo=0, optional=True)
        check_number(d, "reward_coef", path, lo=0, optional=True)
        if d.get("teacher") is not None and (not isinstance(d["teacher"], str) or not d["teacher"].strip()):
            raise ConfigError(f"{path}.teacher must be a model path (a run's checkpoints/step_N/hf, an HF dir or name)")
        if d.get("agent") is not None and not isinstance(d["agent"], Mapping):
            raise ConfigError(f"{path}.agent must be a mapping (env, max_turns, budgets...; see rollout/agent.py)")
        validate_thinking(d, path)
        _validate_dataset(d.get("dataset"), f"{path}.dataset")
        if d.get("eval_dataset") is not None:
            _validate_dataset(d["eval_dataset"], f"{path}.eval_dataset")
    if not any(float(d["weight"]) > 0 for d in domains.values()):
        raise ConfigError("domains.<d>.weight: every domain has weight 0 (switched off); give at least one a weight > 0")


def validate_thinking(d: Mapping, path: str) -> None:
    """`domains.<d>.thinking`: true | false | both | null. On an agent domain it replaces `agent.thinking`; both given
    and different is refused (which one would hold is not obvious), as is thinking with `agent.demo` (the
    demonstration's turns carry no reasoning)."""
    value = d.get("thinking")
    # `1 in (True, ...)` holds in Python: only real booleans, the string both, or null
    if not (value is None or isinstance(value, bool) or value == "both"):
        raise ConfigError(f"{path}.thinking must be true, false, both or null, got {value!r}")
    agent = d.get("agent") if isinstance(d.get("agent"), Mapping) else {}
    if value is not None and agent.get("thinking") is not None and agent["thinking"] != value:
        raise ConfigError(f"{path}.thinking={value} and {path}.agent.thinking={agent['thinking']} disagree: set the "
                          f"mode once ({path}.thinking)")
    if value in (True, "both") and agent.get("demo"):
        raise ConfigError(f"{path}.thinking={value}: agent.demo's demonstration carries no reasoning; use it with "
                          "thinking false")


def _validate_dataset(ds: Any, path: str, required: str = "prompt") -> None:
    if not isinstance(ds, Mapping) or not ds.get("path"):
        raise ConfigError(f"{path}.path is required (a local file/dir, bundled:<file>, or a hub name)")
    unknown = set(ds) - DATASET_KEYS
    if unknown:
        raise ConfigError(f"{path}.{sorted(unknown)[0]}: unknown key; allowed: {sorted(DATASET_KEYS)}")
    cols = ds.get("columns") or {}
    if not isinstance(cols, Mapping) or required not in cols:
        raise ConfigError(f"{path}.columns must map at least `{required}` to a dataset column")
    where = ds.get("where")
    if where is not None and (not isinstance(where, Mapping) or not all(
            _is_scalar(v) or (isinstance(v, (list, tuple)) and v and all(map(_is_scalar, v))) for v in where.values())):
        raise ConfigError(f"{path}.where must map dataset columns to a value or a list of values (the rows kept), "
                          f"e.g. {{difficulty: easy}}; got {where!r}")


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool))


def teacher_paths(cfg: Mapping) -> list[str]:
    """The distinct `domains.<d>.teacher` model paths (in domain order): one FrozenModel actor each."""
    paths = [d.get("teacher") for d in (cfg.get("domains") or {}).values() if isinstance(d, Mapping)]
    return list(dict.fromkeys(p for p in paths if p))


def validate_distill(cfg: Mapping) -> None:
    """Teachers are read by algorithm.objective=distill alone: one set under another objective would silently do
    nothing, and distill without a teacher is GRPO under another name."""
    objective = str(cfg["algorithm"].get("objective", "grpo"))
    domains = cfg.get("domains") or {}
    if objective == "distill":
        if not teacher_paths(cfg):
            raise ConfigError("algorithm.objective=distill: no domain has a teacher; set domains.<d>.teacher=<model "
                              "path> (a specialist's checkpoints/step_N/hf)")
        return
    for name, d in domains.items():
        for key in ("teacher", "distill_coef", "reward_coef"):
            if isinstance(d, Mapping) and d.get(key) is not None:
                raise ConfigError(f"domains.{name}.{key}: read only by on-policy distillation; set "
                                  f"algorithm.objective=distill (it is {objective})")


def trains_on_dataset(cfg: Mapping) -> bool:
    """The steps' samples come from a dataset (`algorithm.dataset`: SFT), not from rollouts of the prompt mixture."""
    return (cfg.get("algorithm") or {}).get("dataset") is not None


def packed_step_rows(cfg: Mapping) -> int:
    """algorithm.step_tokens: the packed rows (micro-batches of trainer.micro_batch_tokens) a step fills; 0 without."""
    tokens = (cfg.get("algorithm") or {}).get("step_tokens")
    return int(tokens) // int(cfg["trainer"]["micro_batch_tokens"]) if tokens else 0


def validate_sft(a: Mapping, t: Mapping) -> None:
    """`algorithm=sft` (conf/algorithm/sft.yaml): the dataset of chat rows and the step's size."""
    check_number(a, "max_tokens", "algorithm", lo=2, integer=True)
    if a.get("step_tokens") is None:
        check_number(a, "samples_per_step", "algorithm", lo=1, integer=True)
    else:
        validate_step_tokens(a, t)
    _validate_dataset(a["dataset"], "algorithm.dataset", required="messages")
    if a.get("chat_template_kwargs") is not None and not isinstance(a["chat_template_kwargs"], Mapping):
        raise ConfigError("algorithm.chat_template_kwargs must be a mapping (e.g. {enable_thinking: true})")


def validate_step_tokens(a: Mapping, t: Mapping) -> None:
    """algorithm.step_tokens: a step of packed rows of trainer.micro_batch_tokens tokens (TRL's packed blocks)."""
    if a.get("samples_per_step") is not None:
        raise ConfigError("algorithm.step_tokens and algorithm.samples_per_step both set: a step is either a count "
                          "of conversations or the conversations that fill step_tokens; set the other to null")
    steps = check_number(a, "step_tokens", "algorithm", lo=1, integer=True)
    if t.get("micro_batch_size") != "auto" or t.get("pack_sequences") is not True or not t.get("micro_batch_tokens"):
        raise ConfigError("algorithm.step_tokens packs a step's conversations into rows of trainer.micro_batch_tokens "
                          "tokens: it needs trainer.micro_batch_size=auto, trainer.pack_sequences=true and "
                          f"trainer.micro_batch_tokens set (they are {t.get('micro_batch_size')}, "
                          f"{t.get('pack_sequences')}, {t.get('micro_batch_tokens')})")
    row = int(t["micro_batch_tokens"])
    if steps % row:
        raise ConfigError(f"algorithm.step_tokens={steps} must be a multiple of trainer.micro_batch_tokens={row}: "
                          "the step is that many packed rows")
    if int(a["max_tokens"]) > row:
        raise ConfigError(f"algorithm.max_tokens={a['max_tokens']} is over trainer.micro_batch_tokens={row}: with "
                          "algorithm.step_tokens every conversation must fit one packed row")
    shards = int(t["mini_batches"]) * int(t["num_processes"])
    if steps // row < shards:  # a step may hold one conversation a row: every mini-batch of every rank needs one
        raise ConfigError(f"algorithm.step_tokens={steps} is {steps // row} packed rows of trainer.micro_batch_tokens="
                          f"{row}, fewer than trainer.mini_batches * trainer.num_processes = {shards}: raise it")


def validate(cfg: Mapping) -> None:
    """Raise ConfigError for the first problem found."""
    dataset = trains_on_dataset(cfg)  # SFT: no domains, rollouts or GRPO keys
    if not dataset:
        validate_domains(cfg.get("domains"))
    r, t, a, data = cfg["rollout"], cfg["trainer"], cfg["algorithm"], cfg["data"]
    if check_number(r, "n_samples", "rollout", lo=1, integer=True) < 2 and not dataset:
        raise ConfigError("rollout.n_samples must be >= 2 for GRPO: the advantage is a sample's reward minus its "
                          "group's mean, so a group of one sample always has advantage 0 and nothing is learned")
    check_choice(r, "engine", "rollout", engine_names())
    if "capture" in r:
        check_choice(r, "capture", "rollout", {"sampler", "logprobs"})
    if "engine_core" in r:
        check_choice(r, "engine_core", "rollout", {"in_process", "subprocess"})
    if "kv_cache_dtype" in r:
        check_choice(r, "kv_cache_dtype", "rollout", set(KV_CACHE_DTYPES))
        if r["kv_cache_dtype"] != "auto" and r["engine"] == "hf":
            raise ConfigError(f"rollout.kv_cache_dtype={r['kv_cache_dtype']} is a vLLM setting; the hf (transformers) "
                              "engine keeps its cache in model.dtype: use rollout.engine=vllm or kv_cache_dtype=auto")
    if check_number(r, "temperature", "rollout", lo=0) and r["temperature"] < 1e-5:
        # vLLM treats such temperatures as greedy (plain logprobs) while the trainer would divide by them
        raise ConfigError(f"rollout.temperature must be 0 (greedy) or >= 1e-5, got {r['temperature']}")
    check_number(r, "top_p", "rollout", lo=0, lo_open=True, hi=1)
    check_number(r, "top_k", "rollout", lo=0, integer=True)
    check_number(r, "max_new_tokens", "rollout", lo=1, integer=True)
    check_number(r, "num_workers", "rollout", lo=1, integer=True)
    check_number(r, "max_model_len", "rollout", lo=1, integer=True, optional=True)
    check_number(r, "max_num_seqs", "rollout", lo=1, integer=True, optional=True)
    check_number(r, "weight_sync_timeout_s", "rollout", lo=0, lo_open=True, optional=True)  # null: no limit
    if "compile" in r:
        check_choice(r, "compile", "rollout", {True, False})
    check_number(data, "prompts_per_step", "data", lo=1, integer=True)
    check_number(data, "max_prompt_tokens", "data", lo=1, integer=True)
    if not dataset:
        validate_dynamic_sampling(data.get("dynamic_sampling"))
    for key in ("total_steps", "num_processes", "mini_batches"):
        check_number(t, key, "trainer", lo=1, integer=True)
    if t.get("micro_batch_size") != "auto":
        check_number(t, "micro_batch_size", "trainer", lo=1, integer=True)
    check_number(t, "save_every", "trainer", lo=0, integer=True)
    check_number(t, "keep_checkpoints", "trainer", lo=0, integer=True)
    check_number(t, "warmup_steps", "trainer", lo=0, integer=True)
    check_number(t, "logprob_chunk_size", "trainer", lo=1, integer=True)
    check_number(t, "micro_batch_tokens", "trainer", lo=1, integer=True, optional=True)
    if t.get("micro_batch_memory") is not None:
        check_number(t, "micro_batch_memory", "trainer", lo=0, lo_open=True, hi=1)
    if t.get("profile_step") is not None:
        check_number(t, "profile_step", "trainer", lo=0, integer=True)
    check_number(t, "grad_clip", "trainer", lo=0)
    check_number(t, "lr", "trainer", lo=0)
    check_choice(t, "zero_stage", "trainer", {0, 1, 2, 3})
    for key in ("pack_sequences", "gradient_checkpointing"):
        if key in t:
            check_choice(t, key, "trainer", AUTO_BOOL)
    for key in ("coalesce_grad_reduction", "fused_adam", "save_last"):
        if key in t:
            check_choice(t, key, "trainer", {True, False})
    if "compile" in t:
        check_choice(t, "compile", "trainer", {True, False})
        if t["compile"] and t["zero_stage"] == 3:  # its per-submodule gather hooks would break every compiled layer
            raise ConfigError("trainer.compile=true needs trainer.zero_stage <= 2: ZeRO-3 hooks every submodule to "
                              "gather its parameters, and each hook inside a compiled layer breaks its graph")
    if "logprob_head" in t:
        check_choice(t, "logprob_head", "trainer", {"support", "dense"})
    if "ref_placement" in t:
        check_choice(t, "ref_placement", "trainer", {"actor", "sharded"})
    if "offload_optimizer" in t:
        check_choice(t, "offload_optimizer", "trainer", {"none", "cpu"})
        if t["offload_optimizer"] == "cpu" and t["zero_stage"] == 0:  # ZeRO-0 has no partitioned optimizer to move
            raise ConfigError("trainer.offload_optimizer=cpu needs trainer.zero_stage >= 1 (DeepSpeed offloads the "
                              "optimizer state ZeRO partitions)")
    if dataset:
        validate_sft(a, t)
    else:
        check_number(a, "clip_eps_low", "algorithm", lo=0, hi=1)
        check_number(a, "clip_eps_high", "algorithm", lo=0, allow_inf=True)  # inf: no upper clip
        check_choice(a, "loss_aggregation", "algorithm", set(AGGREGATIONS))
        if "old_logprobs" in a:
            check_choice(a, "old_logprobs", "algorithm", {"inference", "trainer"})
        check_number(a, "tis_cap", "algorithm", lo=1, optional=True, allow_inf=True)  # inf: no cap
        validate_distill(cfg)
    for key in ("keep_sampling_mask", "keep_routing"):
        check_choice(a, key, "algorithm", AUTO_BOOL)
    if "on_policy" in a:
        check_choice(a, "on_policy", "algorithm", set(ON_POLICY_MODES))
        if a["on_policy"] == BITWISE:
            validate_bitwise(cfg)
    for key in ("max_kb_per_sample", "max_mb_per_worker"):
        check_number((cfg.get("rewards") or {}).get("output") or {}, key, "rewards.output", lo=0, optional=True)
    check_choice(cfg["logger"], "mode", "logger", LOGGER_MODES)
    if "worker_logs" in cfg["logger"]:
        check_choice(cfg["logger"], "worker_logs", "logger", {"file", "console"})
    validate_eval(cfg.get("eval") or {})
    if dataset and (cfg.get("eval") or {}).get("only"):
        raise ConfigError("eval.only=true evaluates a policy on the domains' eval_dataset by sampling; an SFT run "
                          "(algorithm=sft) has no domains to evaluate: run it with the RL experiment instead, e.g. "
                          "+experiment=mixed_rl model.path=<the SFT checkpoint's hf dir> eval.only=true")
    if dataset and a.get("step_tokens") is not None:
        return  # a step's count of conversations varies; split_even cuts it over the shards
    samples = a["samples_per_step"] if dataset else data["prompts_per_step"] * r["n_samples"]
    where = "algorithm.samples_per_step" if dataset else "data.prompts_per_step * rollout.n_samples"
    shards = t["mini_batches"] * t["num_processes"]
    if samples % shards:
        raise ConfigError(
            f"trainer.mini_batches: {where} = {samples} samples per step must "
            f"split evenly into trainer.mini_batches * trainer.num_processes = {shards} shards"
        )


def validate_dynamic_sampling(ds: Any) -> None:
    """`data.dynamic_sampling` (rl/dynamic_sampling.py); absent counts as off."""
    if ds is None:
        return
    if not isinstance(ds, Mapping):
        raise ConfigError(f"data.dynamic_sampling must be a mapping ({{enabled, oversample, max_rounds}}), got {ds!r}")
    path = "data.dynamic_sampling"
    check_choice(ds, "enabled", path, {True, False})
    check_number(ds, "oversample", path, lo=1)
    if ds.get("max_rounds") == 0:  # verl's max_num_gen_batches=0 means no limit; here it would never end
        raise ConfigError(f"{path}.max_rounds=0: give a bound >= 1 (there is no unlimited setting: a domain whose "
                          "groups never vary, e.g. a reward no sample can earn, would generate forever)")
    check_number(ds, "max_rounds", path, lo=1, integer=True)


def validate_eval(e: Mapping) -> None:
    """The held-out evaluation block (`eval.*`; `domains.<d>.eval_dataset` says what each domain evaluates on)."""
    check_number(e, "every", "eval", lo=0, integer=True, optional=True)
    check_number(e, "n_samples", "eval", lo=1, integer=True, optional=True)
    check_number(e, "max_prompts", "eval", lo=1, integer=True, optional=True)
    if check_number(e, "temperature", "eval", lo=0, optional=True) and e["temperature"] < 1e-5:
        raise ConfigError(f"eval.temperature must be 0 (greedy) or >= 1e-5, got {e['temperature']}")
    check_number(e, "top_p", "eval", lo=0, lo_open=True, hi=1, optional=True)
    check_number(e, "top_k", "eval", lo=0, integer=True, optional=True)
    check_number(e, "pass_threshold", "eval", optional=True, allow_inf=True)
    for key in ("before_train", "only"):
        if key in e:
            check_choice(e, key, "eval", {True, False})


def needs_reference(cfg: Mapping) -> bool:
    """Some domain has kl_coef > 0 (else the reference model is never started); never when the samples come from a
    dataset (SFT has no reference)."""
    if trains_on_dataset(cfg):
        return False
    return any(float(d["kl_coef"]) > 0 for d in (cfg.get("domains") or {}).values())


def frozen_models_sharded(cfg: Mapping) -> bool:
    """`trainer.ref_placement: sharded`: the reference and the distillation teachers live in the trainer ranks,
    their parameters partitioned over the ranks (ZeRO-3 inference, trainer/frozen.py), instead of one whole copy in
    an actor of their own (`actor`, the default) with a GPU share (`trainer.ref_num_gpus`)."""
    return str((cfg.get("trainer") or {}).get("ref_placement") or TRAINER_DEFAULTS["ref_placement"]) == "sharded"


def rollout_placement(rcfg: Mapping) -> str:
    """`rollout.placement`: colocated (the default) | split. Only vLLM rollouts on GPUs use it."""
    return str(rcfg.get("placement") or ROLLOUT_DEFAULTS["placement"])


def is_colocated_vllm(cfg: Mapping) -> bool:
    """Rollouts that share their GPUs with the trainer ranks: an engine that holds a share of its GPU's memory
    (rl/engine_specs.py, `gpu_memory`: vLLM, and auto, which plans as vLLM)."""
    r = cfg["rollout"]
    return placement_spec(r).gpu_memory and rollout_placement(r) == "colocated" and float(r.get("num_gpus") or 0) > 0


def is_split_vllm_on_gpu_shares(cfg: Mapping) -> bool:
    """vLLM (or auto) rollouts on GPUs of their own (split placement) whose workers each take a share of a GPU
    (0 < rollout.num_gpus < 1): several instances per rollout GPU."""
    r = cfg["rollout"]
    return placement_spec(r).gpu_memory and rollout_placement(r) == "split" and 0 < float(r.get("num_gpus") or 0) < 1


def engines_per_gpu(cfg: Mapping) -> int:
    """vLLM instances (rollout workers) sharing one GPU. Colocated: rollout.num_workers / trainer.num_processes on
    each trainer rank's GPU (launch/placement.py checks that it divides). Split: 1 / rollout.num_gpus on each rollout
    GPU (0.5: two), at most rollout.num_workers. More than one pays off where vLLM's decode loop is CPU-bound (a small
    model: two SmolLM2-135M instances decode 1.8x the tokens/s of one, benchmarks/README.md); each has its own
    `rollout.num_gpus` and `rollout.gpu_memory_utilization`. 1 otherwise (the transformers engine: 1)."""
    r = cfg["rollout"]
    if is_colocated_vllm(cfg):
        return max(1, int(r["num_workers"]) // int(cfg["trainer"]["num_processes"]))
    if not is_split_vllm_on_gpu_shares(cfg):
        return 1
    return max(1, min(int(r["num_workers"]), math.floor(1 / float(r["num_gpus"]) + 1e-9)))


def engine_memory_share(rcfg: Mapping, engines: int = 1) -> float | None:
    """The share of the GPU the colocated vLLM instances of one GPU (`engines`, `engines_per_gpu`) take when they
    wake up (`rollout.gpu_memory_utilization` each); 0.0 when they never sleep (`rollout.enable_sleep_mode: false`:
    their memory stays taken, so they need no room to wake up into); None for the transformers engine, whose memory
    use is not bounded ahead."""
    spec = placement_spec(rcfg)
    utilization = rcfg.get("gpu_memory_utilization", ROLLOUT_DEFAULTS["gpu_memory_utilization"])
    if not spec.gpu_memory or utilization is None:
        return None
    if str(rcfg.get("engine")) == AUTO and not installed(spec):  # auto falls back to the transformers engine
        return None
    if not rcfg.get("enable_sleep_mode", ROLLOUT_DEFAULTS["enable_sleep_mode"]):
        return 0.0
    return float(utilization) * engines


def to_plain(cfg: Any) -> Any:
    """OmegaConf containers -> plain dicts/lists (resolved); anything else unchanged."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(cfg, (DictConfig, ListConfig)):
        return OmegaConf.to_container(cfg, resolve=True)
    return cfg


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


HALF_DTYPES = ("bfloat16", "float16")


def varlen_attention(cfg: Mapping) -> bool:
    """`model.attn_implementation` runs packed rows through variable-length kernels, no mask: flash-attention's
    (flash_attention_*) or torch's own (varlen, rl/attention.py: in a 16-bit model.dtype; a float32 one runs the
    masked stand-in)."""
    name = str(cfg["model"].get("attn_implementation") or "")
    return name.startswith("flash_attention") or (name == "varlen" and cfg["model"].get("dtype") in HALF_DTYPES)


def pack_sequences(cfg: Mapping) -> bool:
    """`trainer.pack_sequences`: auto packs with varlen attention, whose kernels cost what the samples cost.
    With sdpa/eager a packed row gets a block-diagonal mask over its whole length, which costs more attention than
    padding, so auto leaves it off there (true still packs: exact either way)."""
    setting = cfg["trainer"].get("pack_sequences", TRAINER_DEFAULTS["pack_sequences"])
    if setting == "auto":
        return varlen_attention(cfg)
    return bool(setting)


def head_options(cfg: Mapping) -> dict:
    """The trainer-side logprob head's settings, shared by the policy and the frozen reference (keyword arguments
    of `trainer.forward.forward_logprobs`): chunking, the float32 head, the support-only head."""
    return {"chunk_size": int(cfg["trainer"]["logprob_chunk_size"]),
            "fp32_head": bool(cfg["model"].get("fp32_lm_head", False)),
            "support_head": cfg["trainer"].get("logprob_head", TRAINER_DEFAULTS["logprob_head"]) == "support",
            "compiled": bool(cfg["trainer"].get("compile", TRAINER_DEFAULTS["compile"])),
            "bitwise": bitwise_on_policy(cfg)}


def bitwise_on_policy(cfg: Mapping) -> bool:
    """`algorithm.on_policy=bitwise` (rl/bitwise.py): the engine in batch-invariant mode and the trainer's logprobs
    from the same kernels."""
    return (cfg.get("algorithm") or {}).get("on_policy", "default") == BITWISE


# rollout.kv_cache_dtype: vLLM's names; auto = model.dtype, fp8 = fp8_e4m3 on NVIDIA GPUs
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
# engine arguments that would change the kernels the trainer replays (the mode sets the first two itself)
BITWISE_ENGINE_ARGS = {"enforce_eager", "attention_backend", "attention_config", "compilation_config", "quantization",
                       "kv_cache_dtype"}


def validate_bitwise(cfg: Mapping) -> None:
    """What `algorithm.on_policy=bitwise` needs, refused at start by name (the model's layers are checked when the
    trainer loads it: rl.bitwise.unsupported_reason)."""
    r, t, m, a = cfg["rollout"], cfg["trainer"], cfg["model"], cfg["algorithm"]
    truncates = (float(r.get("top_p", ROLLOUT_DEFAULTS["top_p"])) < 1.0
                 or int(r.get("top_k", ROLLOUT_DEFAULTS["top_k"]) or 0) > 0)
    engine_args = set(r.get("engine_args") or {})
    needs = {
        "rollout.engine=vllm (the batch-invariant kernels are vLLM's)": r.get("engine") in ("vllm", AUTO),
        "rollout.engine_core=in_process (vLLM is patched in the rollout worker's process)":
            r.get("engine_core", ROLLOUT_DEFAULTS["engine_core"]) == "in_process",
        "rollout.tensor_parallel_size=1":
            int(r.get("tensor_parallel_size", ROLLOUT_DEFAULTS["tensor_parallel_size"])) == 1,
        "rollout.capture=sampler (the trainer replays the capture's logprob kernel)":
            r.get("capture", ROLLOUT_DEFAULTS["capture"]) == "sampler",
        "trainer.device=cuda or auto": str(t.get("device", TRAINER_DEFAULTS["device"])) != "cpu",
        "trainer.zero_stage <= 2 (the bitwise forward reads whole weights)":
            int(t.get("zero_stage", TRAINER_DEFAULTS["zero_stage"])) <= 2,
        "trainer.ref_placement=actor": t.get("ref_placement", TRAINER_DEFAULTS["ref_placement"]) == "actor",
        "model.fp32_lm_head=false (vLLM's batch-invariant head is bf16)": not m.get("fp32_lm_head", False),
        "model.dtype=bfloat16 (the dtype the mode was checked in)": m.get("dtype") == "bfloat16",
        "algorithm.keep_sampling_mask on when rollout.top_p < 1 or top_k > 0 (the engine's value is over the kept set)":
            not truncates or a.get("keep_sampling_mask", AUTO) in (AUTO, True),
        "rollout.kv_cache_dtype=auto (the trainer replays attention over model.dtype values)":
            r.get("kv_cache_dtype", ROLLOUT_DEFAULTS["kv_cache_dtype"]) == "auto",
        f"no rollout.engine_args {sorted(engine_args & BITWISE_ENGINE_ARGS)} (the mode sets or excludes them)":
            not engine_args & BITWISE_ENGINE_ARGS,
    }
    missing = [k for k, ok in needs.items() if not ok]
    if missing:
        raise ConfigError("algorithm.on_policy=bitwise needs " + "; ".join(missing))


def micro_batch_memory(cfg: Mapping) -> float:
    """`trainer.micro_batch_memory`: the share of the free GPU memory an auto-sized micro-batch may take (the
    policy's and the reference's)."""
    return float(cfg["trainer"].get("micro_batch_memory", TRAINER_DEFAULTS["micro_batch_memory"]))


def logprob_temperature(rcfg: dict) -> float:
    """The temperature the trainer divides logits by: the sampling one, or 1 for greedy (temperature 0), whose
    reported logprobs are the plain ones in both engines."""
    return float(rcfg["temperature"]) or 1.0
