"""The config at start: compose it (Hydra), check all of it before any actor starts, and fill what depends on
the model. Every mistake stops the run here with a `ConfigError` naming the key.

`rl.config.validate` checks the algorithm, sampling, batch and per-domain keys; this adds what needs the layers
above it: keys that no config file defines (added with `+`), reward names and parameters (`rewards.compose`),
GPU shares (`launch/placement.py`), the objective (`trainer.objectives`), the overlap of rollout and training, the
W&B login, and the model itself (that it exists; MoE and Keep Routing).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path

import yaml

from launch.placement import check_gpu_layout
from launch.tracking import wandb_mode
from rewards.compose import check_reward_specs, reward_section_keys
from rl.bitwise import unsupported_reason
from rl.config import (ROLLOUT_DEFAULTS, ConfigError, bitwise_on_policy, check_choice, check_number, is_colocated_vllm,
                       resolve_auto, teacher_paths, to_plain, trains_on_dataset, validate)
from rl.models import resolve_model_path
from trainer.objectives import OBJECTIVES, objective_of

log = logging.getLogger(__name__)

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def compose(overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """conf/train.yaml composed with Hydra overrides, resolved to plain dicts (what `python -m launch.train` runs).
    Overrides Hydra cannot apply raise ConfigError with one line saying why."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = hydra_compose(config_name="train", overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(hydra_error_line(exc)) from None
    return to_plain(cfg)


def hydra_error_line(exc: Exception) -> str:
    """Hydra's multi-line report of an override it cannot apply, as one line. A misspelled key (one no config file
    defines, given without `+`) is named with the `+` form that would add it."""
    text = str(exc)
    missing = re.match(r"Could not override '([^']+)'\.\s*To append to your config use (\+\S+)", text)
    if missing:
        return (f"{missing.group(1)}: unknown key (a misspelling? to add a key that no config file defines, "
                f"write {missing.group(2)})")
    lines = []
    for line in (ln.strip() for ln in text.splitlines()):
        if line.startswith(("Config search path", "Set the environment")):
            break
        if line:
            lines.append(line)
    return "; ".join(lines).replace(":; ", ": ")[:500] or type(exc).__name__


def check_config(cfg: dict) -> None:
    """Raise ConfigError for the first problem found (nothing is started). Domains switched off (weight 0) are
    checked like the others, then removed from cfg["domains"]."""
    check_known_keys(cfg)
    check_objective(cfg)
    check_agent_domains(cfg)
    validate(cfg)
    try:
        check_reward_specs(cfg["domains"], cfg["rewards"], cfg["rollout"]["max_new_tokens"])
    except ValueError as e:
        raise ConfigError(str(e)) from e
    off = [d for d, block in cfg["domains"].items() if float(block["weight"]) == 0]
    if off:
        log.info("domains switched off (weight 0): %s", ", ".join(off))
        cfg["domains"] = {d: block for d, block in cfg["domains"].items() if d not in off}
        if cfg["algorithm"].get("objective") == "distill" and not teacher_paths(cfg):
            raise ConfigError("algorithm.objective=distill: every domain with a teacher is switched off (weight 0): "
                              "the run would be plain GRPO; give one of them a weight > 0")
    check_gpu_layout(cfg)
    staleness = check_number(cfg["rollout"], "max_staleness", "rollout", lo=0, integer=True, optional=True) or 0
    if staleness > 1:
        # A worker runs one call at a time, so with 1 the next rollout already runs through the whole train step;
        # more queues further rollouts behind it and only makes their weights older.
        raise ConfigError(f"rollout.max_staleness={staleness}: use 0 (synchronous) or 1 (the next step's rollout runs "
                          "while this step trains); larger values add no overlap, only staleness")
    if staleness and is_colocated_vllm(cfg) and cfg["rollout"].get("enable_sleep_mode",
                                                                    ROLLOUT_DEFAULTS["enable_sleep_mode"]):
        # Without sleep mode the instances keep their memory and generate while the trainer trains on the same GPU
        # (worth it where neither fills the GPU: a small model's decode loop and train phase are both CPU-bound).
        raise ConfigError("rollout.max_staleness > 0 overlaps rollout with training, which colocated vLLM cannot do "
                          "while it sleeps as the trainer trains (rollout.enable_sleep_mode=true): set "
                          "rollout.enable_sleep_mode=false (both stay on the GPU), use rollout.placement=split, or 0")
    if "payload_by_reference" in cfg["rollout"]:
        check_choice(cfg["rollout"], "payload_by_reference", "rollout", {True, False})
    if float(cfg["rollout"]["temperature"]) == 0:
        log.warning("rollout.temperature=0 (greedy): the %d samples of a prompt are identical, so every advantage "
                    "is 0 and GRPO learns nothing; sample with a temperature > 0", int(cfg["rollout"]["n_samples"]))
    check_wandb_login(cfg["logger"])


def check_objective(cfg: dict) -> None:
    """`algorithm.objective` exists and its sample source has its config: a dataset objective (SFT) comes with the
    `algorithm=sft` group (its `algorithm.dataset`), and the run's `domains` (RL's prompts) are dropped for it."""
    objective = cfg["algorithm"].get("objective", "grpo")
    if objective not in OBJECTIVES:
        raise ConfigError(f"algorithm.objective must be one of {sorted(OBJECTIVES)}, got {objective!r}")
    source, has_dataset = objective_of(cfg).source, cfg["algorithm"].get("dataset") is not None
    if source == "dataset" and not has_dataset:
        raise ConfigError(f"algorithm.objective={objective} trains on a dataset: choose its config group with "
                          f"algorithm={objective} (or run python -m launch.sft), which brings algorithm.dataset")
    if source != "dataset" and has_dataset:
        raise ConfigError(f"algorithm.objective={objective} trains on rollouts, and algorithm.dataset is set (from "
                          "algorithm=sft?): pick one objective's group, algorithm=grpo or algorithm=sft")
    if source == "dataset" and cfg.get("domains"):
        log.info("algorithm.objective=%s trains on algorithm.dataset; domains (%s) are not used", objective,
                 ", ".join(cfg["domains"]))
        cfg["domains"] = {}


def check_agent_domains(cfg: dict) -> None:
    """`domains.<d>.agent`: its keys, its environment (bundled name or directory), and the tasks: without a
    `dataset.path` the domain draws its environment's own tasks.jsonl."""
    from rollout.agent import AgentConfig
    from rollout.envs.base import load_env

    for name, block in (cfg.get("domains") or {}).items():
        if not isinstance(block, dict) or not block.get("agent"):
            continue
        where = f"domains.{name}.agent"
        try:
            agent = AgentConfig.from_config(block["agent"])
            env = load_env(agent.env)
        except Exception as e:  # noqa: BLE001 - a wrong key, or an environment that does not load
            raise ConfigError(f"{where}: {e}") from None
        if agent.demo:
            check_demonstrations(env, where)
        ds = dict(block.get("dataset") or {})
        if not ds.get("path"):  # the environment's own tasks
            ds["path"], ds["columns"] = str(env.tasks_path), None
        # the episode finds the whole task in its environment by id (the dataset's rows need not carry it), also
        # for the output of launch.filter_tasks
        ds["columns"] = ds.get("columns") or {"prompt": "prompt", "id": "id"}
        block["dataset"] = ds


def check_demonstrations(env, where: str, workers: int = 8) -> None:
    """agent.demo shows each task after another task of the environment solved by its reference solution (built on
    the rollout workers): every task can be the one shown, so every reference solution must run, checked here before
    any actor starts (several at a time, as launch.check_env does: code_repo's 42 sandboxed ones take about 2 s on
    2 cores). The first one, in task order, that does not run stops the run with the domain, environment, task and
    reason."""
    import concurrent.futures as cf

    try:
        tasks = env.tasks()
    except Exception as e:  # noqa: BLE001 - a malformed tasks.jsonl
        raise ConfigError(f"{where}: environment {env.name}: {e}") from None
    if len(tasks) < 2:
        raise ConfigError(f"{where}.demo: environment {env.name} has {len(tasks)} task(s); a demonstration is another "
                          f"task solved, so it needs at least 2 (or set {where}.demo=false)")

    def problem(task: dict) -> str | None:
        try:
            calls = env.reference_solution(task)
        except ValueError as e:  # ReferenceSolutionError: one line naming the environment, task and call
            return (f"{where}.demo: {e}; fix solve in {env.env_dir / 'env.py'} (python -m launch.check_env "
                    f"{env.env_dir} checks every task) or set {where}.demo=false")
        if calls is None:
            return (f"{where}.demo: environment {env.name} has no reference solution (solve in "
                    f"{env.env_dir / 'env.py'}) to show; set {where}.demo=false")
        return None

    pool = cf.ThreadPoolExecutor(max(1, min(workers, os.cpu_count() or 1)), thread_name_prefix="check-demo")
    try:
        for found in pool.map(problem, tasks):  # in task order
            if found:
                raise ConfigError(found)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # a failure leaves the tasks not yet started unrun


def known_keys() -> dict:
    """Every key some config file defines: train.yaml, then the union of each group's files (a tree of dicts;
    an empty mapping in a file, like `engine_args: {}`, takes any keys)."""
    def merge(into: dict, tree: Mapping) -> dict:
        for k, v in tree.items():
            if isinstance(v, Mapping):
                merge(into.setdefault(k, {}), v)
            else:
                into.setdefault(k, None)
        return into

    top = yaml.safe_load((CONF_DIR / "train.yaml").read_text())
    out = merge({}, {k: v for k, v in top.items() if k != "defaults"})
    for entry in top["defaults"]:
        if isinstance(entry, Mapping):
            group = next(iter(entry))
            for f in sorted((CONF_DIR / group).glob("*.yaml")):
                merge(out.setdefault(group, {}), yaml.safe_load(f.read_text()) or {})
    return out


def check_known_keys(cfg: Mapping) -> None:
    """A key added with `+` that no config file defines (`+trainer.foo=1`) stops the run: it would do nothing.
    `domains.*` is checked by rl.config; `rewards.<reward name>` sections take that reward's parameters."""
    def walk(node: Mapping, known: Mapping, path: str) -> None:
        for k, v in node.items():
            where = f"{path}.{k}" if path else str(k)
            if where in ("domains", "hydra"):
                continue
            if path == "rewards" and reward_section_keys(str(k)) is not None:  # a reward's parameter defaults
                allowed = reward_section_keys(str(k)) | set(known.get(k) or {})
                unknown = sorted(set(v) - allowed) if isinstance(v, Mapping) else []
                if unknown:
                    raise ConfigError(f"{where}.{unknown[0]}: unknown key; allowed: {sorted(allowed)}")
                continue
            if path.endswith(".columns"):  # our field -> the dataset's column; the data loader checks the fields
                continue
            if k not in known:
                raise ConfigError(f"{where}: unknown key (no config file defines it; known here: {sorted(known)})")
            sub = known[k]
            if isinstance(v, Mapping) and isinstance(sub, Mapping) and sub:
                walk(v, sub, where)

    walk(cfg, known_keys(), "")


def check_wandb_login(lcfg: Mapping) -> None:
    """logger.mode=online needs an API key; without one W&B fails only after every actor has started."""
    if wandb_mode(lcfg["mode"]) != "online" or os.environ.get("WANDB_API_KEY"):
        return
    import netrc
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        if netrc.netrc().authenticators(host):
            return
    except (OSError, netrc.NetrcParseError):
        pass
    raise ConfigError("logger.mode=online needs a W&B API key: set WANDB_API_KEY or run `wandb login`, or use "
                      "logger.mode=offline (sync later with `wandb sync`)")


def check_model_path(path: str) -> None:
    """model.path: an embedded model, a local directory, a GGUF file, or something the hub resolves (one line if
    not)."""
    if path.startswith("embedded:") or Path(path).expanduser().is_dir():
        return
    if path.startswith("gguf:"):
        from rl.models import find_gguf

        try:
            find_gguf(path.split(":", 1)[1])
        except FileNotFoundError as e:
            raise ConfigError(str(e)) from None
        return
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - any failure: say what to fix in one line
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise ConfigError(f"model.path={path}: not a local model directory, and the hub could not provide it "
                          f"({reason}); give an HF model directory, a hub name reachable from here, or "
                          f"embedded:tiny-moe") from None


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


def check_logit_processing(model_path: str) -> None:
    """Final-logit softcapping (Gemma 2/3 and others) is a non-linear transform after the LM head that the trainer's
    logprob does not apply: refused, so trainer and engine logprobs never silently differ. Linear scalings (Cohere,
    Granite) are measured and folded into the temperature by the trainer (trainer/forward.py:logit_scale)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    cap = getattr(text, "final_logit_softcapping", None)
    if cap:
        raise ConfigError(f"model.path={model_path}: final_logit_softcapping={cap} ({config.model_type}) is not "
                          "supported: the trainer's logprobs would differ from the engine's")


def context_positions(config) -> tuple[int, str] | None:
    """The positions the model was made for, and where that number comes from: max_position_embeddings, times a
    RoPE scaling factor that extends it (yarn, linear, dynamic); None where the config does not say."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    positions = getattr(text, "max_position_embeddings", None)
    if isinstance(positions, bool) or not isinstance(positions, int) or positions <= 0:
        return None
    label = f"max_position_embeddings={positions}"
    scaling = getattr(text, "rope_scaling", None)
    if isinstance(scaling, dict):
        factor, kind = scaling.get("factor"), scaling.get("rope_type", scaling.get("type"))
        # llama3 and longrope already count the extended context in max_position_embeddings
        if isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor > 1 and \
                kind not in ("llama3", "longrope", "su"):
            positions = int(positions * factor)
            label += f" x rope_scaling.factor={factor:g} = {positions}"
    return positions, label


def check_generation_budget(cfg: dict, model_path: str) -> None:
    """rollout.max_new_tokens must fit the model's context after the longest prompt allowed (data.max_prompt_tokens):
    past it, every step generates up to that budget (minutes per step on the transformers engine) into positions the
    model has never seen. A run that samples nothing (SFT) is not checked."""
    if trains_on_dataset(cfg):
        return
    from transformers import AutoConfig

    context = context_positions(AutoConfig.from_pretrained(model_path))
    if context is None:
        return
    positions, label = context
    new = cfg["rollout"]["max_new_tokens"]
    prompt = (cfg.get("data") or {}).get("max_prompt_tokens") or 0
    room = max(positions - int(prompt), 0)
    if new > room:
        minus = f" minus data.max_prompt_tokens={prompt}" if prompt else ""
        raise ConfigError(f"rollout.max_new_tokens={new} is past the model's context: {label} (model.path="
                          f"{cfg['model']['path']}){minus} leaves {room} tokens to generate; lower "
                          f"rollout.max_new_tokens to {room} or less{' (or data.max_prompt_tokens)' if prompt else ''}")


def prepare(cfg: dict) -> str:
    """Check the config, build or find the model, and fill the `auto` switches; returns the model's path."""
    check_config(cfg)
    check_model_path(str(cfg["model"]["path"]))
    model_path = resolve_model_path(cfg["model"]["path"])
    check_logit_processing(model_path)
    check_generation_budget(cfg, model_path)
    if bitwise_on_policy(cfg):  # before any actor starts: the layers the bitwise forward cannot reproduce, by name
        from transformers import AutoConfig

        reason = unsupported_reason(AutoConfig.from_pretrained(model_path))
        if reason:
            raise ConfigError(f"algorithm.on_policy=bitwise cannot match the engine on model.path="
                              f"{cfg['model']['path']}: {reason}")
    moe = model_is_moe(model_path, cfg["algorithm"]["keep_routing"])
    if moe and cfg["trainer"].get("compile"):
        raise ConfigError(f"trainer.compile=true supports dense models; model.path={cfg['model']['path']} has routed "
                          "experts (set trainer.compile=false)")
    resolve_auto(cfg, moe)
    resolve_teachers(cfg, model_path)
    return model_path


def resolve_teachers(cfg: dict, model_path: str) -> None:
    """On-policy distillation: each `domains.<d>.teacher` found or built like model.path (a GGUF converted, an
    embedded model built) and replaced by its local path, which the teacher actors load. The teacher grades the
    student's token ids, so both must share one vocabulary: a teacher whose tokenizer splits text differently is
    refused here, before any actor starts."""
    from rl.models import load_tokenizer

    student, probe = None, "Teacher and student: 12 + 30 = 42. <think>x</think> \\boxed{42}"
    for name, block in (cfg.get("domains") or {}).items():
        if not block.get("teacher"):
            continue
        check_model_path(str(block["teacher"]))
        path = resolve_model_path(str(block["teacher"]))
        student = student or load_tokenizer(model_path)
        teacher = load_tokenizer(path)
        if len(teacher) != len(student) or teacher(probe)["input_ids"] != student(probe)["input_ids"]:
            raise ConfigError(f"domains.{name}.teacher={block['teacher']}: its tokenizer differs from the policy's "
                              f"({len(teacher)} vs {len(student)} tokens, or another split of the same text); "
                              "token-level distillation needs the student's vocabulary")
        check_logit_processing(path)  # the checks model.path gets, for the model the teacher actor loads
        if cfg["trainer"].get("compile") and model_is_moe(path, False):
            raise ConfigError(f"domains.{name}.teacher={block['teacher']}: trainer.compile=true supports dense models, "
                              "and this teacher has routed experts (set trainer.compile=false)")
        block["teacher"] = path
