"""Start plans: the KV-cache size each vLLM instance of a GPU got when it measured the GPU's memory, kept between runs
so that a later run's instances of the GPU start side by side instead of one after the other.

vLLM sizes its KV cache by profiling: it runs the model, reads how much of the GPU's memory is in use, and takes what
is left of `gpu_memory_utilization`. Another instance allocating meanwhile would be counted as its own use, so the
instances sharing a GPU start in waves, each after the one before (`launch.cluster.ActorPool`, `start_waves`), which
cost ~14-30 s a wave on a GPU machine (benchmarks/README.md, cold_start.py). Yet for one engine configuration on one
kind of GPU the size is the same every time. So each instance that measured writes the size it got under
`MIXRL_CACHE/vllm_start`, keyed by everything the size depends on (the engine's arguments, the instance's wave and
the number of waves, the vLLM / torch / CUDA versions, the GPU's name and memory), and a later run passes it back as
vLLM's `kv_cache_memory_bytes`: vLLM then skips the measurement, and the instance need not wait for the waves before
it. vLLM 0.26 has the same idea for one instance (`VLLM_ENABLE_STARTUP_PLAN`), but its plan is keyed by a hash that
does not tell the instances of a GPU apart, and it is refused whenever less memory is free than when it was
recorded, which is so for every instance that starts beside another.

An instance uses a plan only when every wave of its GPU has a usable one (`plan_for`): then all of them skip the
measurement, or none does, and none measures while another allocates. Without one, the waves go in turn, and a later
wave starts with the size the wave before it recorded in this run (`borrowed_plan`) instead of measuring again: its
engine arguments are the same but for the seed, so it would measure the same size (20.26 and 20.32 GiB for the two
SmolLM2 instances of `smol_math` on an H200), and the measurement is work of its own. It records that size as its
own wave's plan; a record names
the run that wrote it (its `EngineStart.plans_before`), so "this run" is decided without comparing clocks.

For all waves to decide alike, each reads only the plans written before its run began (`EngineStart.plans_before`):
a plan another GPU's instance or another run records meanwhile is for the next run. A plan larger than the
instance's `gpu_memory_utilization` share of the GPU is not usable (vLLM would take it whatever the share). A
restarted instance (`EngineStart.record` off) records nothing: it measures, if at all, beside running instances.
A `kv_cache_memory_bytes` in `rollout.engine_args` is a plan the user made. vLLM still checks at start that its share
of the GPU is free, and a GPU shared with another job should run with `rollout.start_plan=false` (the measurement
then sees that job's memory).

Before any of that, a sized start (`sized_kv_bytes`): when the engine's arguments bound what its KV cache can ever
hold (`max_num_seqs` sequences of `max_model_len` tokens, both set: `rollout.max_num_seqs`, `rollout.max_model_len`)
and that bound fits the instance's share of the GPU with room to spare, every instance starts at once with exactly
that size, in its first run too: vLLM never schedules more than that, so measuring could only give it KV cache it
cannot use. Only a local model with a plain attention layout is sized (the per-token bytes come from its config.json);
anything else measures.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path

from rl.models import cache_root, torch_dtype
from rollout.engines import EngineStart

log = logging.getLogger(__name__)

PLAN_VERSION = 1
# Engine arguments that do not change the memory an instance takes (each instance has its own seed)
NOT_MEMORY = ("seed",)
# Environment variables that change what vLLM measures or allocates (backends, model runner, whether CUDA-graph memory
# is taken out of the KV cache, where the engine core runs, the allocator's settings)
MEMORY_ENV = ("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "VLLM_ATTENTION_BACKEND", "VLLM_USE_V2_MODEL_RUNNER",
              "VLLM_USE_FLASHINFER_SAMPLER", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_BATCH_INVARIANT",
              "PYTORCH_CUDA_ALLOC_CONF")


def plan_dir() -> Path:
    """MIXRL_CACHE/vllm_start."""
    return cache_root() / "vllm_start"


def memory_args(engine_args: dict) -> dict:
    """The engine arguments a plan depends on (all but NOT_MEMORY)."""
    return {k: v for k, v in engine_args.items() if k not in NOT_MEMORY}


def device_identity() -> dict:
    """What the KV-cache size depends on besides the engine's arguments: library and driver versions, the environment
    variables of MEMORY_ENV, and this process's GPU (read through NVML, without creating a CUDA context)."""
    import torch
    import vllm
    from vllm.platforms import current_platform
    from vllm.utils.import_utils import import_pynvml

    pynvml = import_pynvml()
    pynvml.nvmlInit()
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
    finally:
        pynvml.nvmlShutdown()
    return {"vllm": vllm.__version__, "torch": torch.__version__, "cuda": torch.version.cuda or "",
            "driver": driver.decode() if isinstance(driver, bytes) else str(driver),
            "device": current_platform.get_device_name(0), "memory": int(current_platform.get_device_total_memory(0)),
            "env": {k: os.environ[k] for k in MEMORY_ENV if k in os.environ}}


def model_fingerprint(model: str) -> str:
    """The model's config.json (its shapes), so a directory rewritten in place gets new plans; "" when `model` is not
    a local directory (a hub name: its revision is in the engine arguments when pinned)."""
    try:
        return hashlib.sha256((Path(model) / "config.json").read_bytes()).hexdigest()[:16]
    except OSError:
        return ""


def plan_key(engine_args: dict, wave: int, waves: int, identity: dict) -> str:
    """The file name of wave `wave`'s plan (of `waves` instances on the GPU) for these vLLM arguments."""
    factors = {"plan": PLAN_VERSION, "args": memory_args(engine_args), "model_config": model_fingerprint(str(engine_args.get("model", ""))),
               "wave": int(wave), "waves": int(waves), **identity}
    blob = json.dumps(factors, sort_keys=True, default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def read_plan(key: str, folder: Path | None = None, before: float | None = None,
              limit: int | None = None, run: float | None = None) -> int | None:
    """The recorded KV-cache bytes under `key`, or None: absent, written at or after `before` (time.time()), not
    recorded by run `run` (its EngineStart.plans_before, written into the record: no clocks compared), unreadable,
    not a positive size, or over `limit` bytes."""
    path = (folder or plan_dir()) / f"{key}.json"
    try:
        if before is not None and path.stat().st_mtime >= before:
            return None
        record = json.loads(path.read_text())
        if run is not None and record.get("run") != run:
            return None
        value = record.get("kv_cache_memory_bytes")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError) as e:
        log.warning("start plan %s unreadable (%s): the instance measures the GPU's memory", path, e)
        return None
    if not isinstance(value, int) or value <= 0:
        return None
    if limit is not None and value > limit:
        log.warning("start plan %s holds %.2f GiB of KV cache, more than the instance's share of the GPU (%.2f GiB): "
                    "the instances measure again", path, value / 2**30, limit / 2**30)
        return None
    return value


def share_limit(engine_args: dict, identity: dict) -> int | None:
    """The bytes of the instance's `gpu_memory_utilization` share of the GPU: no plan may hold more."""
    share = engine_args.get("gpu_memory_utilization")
    return int(float(share) * identity["memory"]) if share and identity.get("memory") else None


# Each sequence's blocks are rounded up to this many tokens (vLLM's block sizes are powers of two up to 256), and
# beyond the KV cache the share must hold the weights (the checkpoint's files) and this much for activations, CUDA
# graphs and the CUDA context: 2 GiB and a tenth of the share (smol_math measured 0.75 GiB on an H200).
SIZED_ROUND_TOKENS = 256
SIZED_SPARE_BYTES = 2 * 2**30
SIZED_SPARE_FRACTION = 0.1
# Config keys of layouts whose per-token KV bytes are not 2 x layers x KV heads x head dim (state-space layers)
NOT_PLAIN_ATTENTION = ("mamba_d_state", "ssm_state_size", "linear_num_key_heads", "text_config")
PLAIN_LAYERS = ("full_attention", "sliding_attention")


def _value_bytes(name: str) -> int | None:
    """Bytes per cached value of a vLLM dtype name (fp8 variants: 1); None for a name the sizing does not know."""
    if name.startswith("fp8"):
        return 1
    try:
        name = name.replace("torch.", "")
        return torch_dtype({"float": "float32", "half": "float16"}.get(name, name)).itemsize  # (vLLM's aliases)
    except ValueError:
        return None


def kv_bytes_per_token(config: dict, dtype: str, kv_cache_dtype: str | None = None) -> int | None:
    """2 (K and V) x layers x KV heads x head dim x bytes per value: a plain attention model's KV cache per token, an
    upper bound for sliding-window and latent-attention layers (they hold less); None when the config is not one
    (state-space or linear-attention layers, a multimodal wrapper) or lacks the shapes."""
    if any(k in config for k in NOT_PLAIN_ATTENTION) or any(
            t not in PLAIN_LAYERS for t in config.get("layer_types") or []):
        return None
    try:
        layers, heads = int(config["num_hidden_layers"]), int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    if kv_cache_dtype and str(kv_cache_dtype) != "auto":
        value = _value_bytes(str(kv_cache_dtype))
    else:
        value = _value_bytes(str(dtype) if dtype and str(dtype) != "auto" else str(config.get("torch_dtype") or "bfloat16"))
    if not value or min(layers, kv_heads, head_dim) < 1:
        return None
    return 2 * layers * kv_heads * head_dim * value


def weights_bytes(model: Path) -> int:
    """The bytes of a local checkpoint's weight files (what its weights take on the GPU in their stored dtype)."""
    return sum(f.stat().st_size for pattern in ("*.safetensors", "*.bin", "*.pt") for f in model.glob(pattern))


def sized_kv_bytes(engine_args: dict, identity: dict) -> int | None:
    """The KV-cache bytes of `max_num_seqs` sequences of `max_model_len` tokens (each rounded up to
    SIZED_ROUND_TOKENS), when both are set, the model is a local directory of a plain attention layout, and that size
    plus the weights and SIZED_SPARE fits the instance's `gpu_memory_utilization` share; else None (measure)."""
    seqs, length = engine_args.get("max_num_seqs"), engine_args.get("max_model_len")
    share = share_limit(engine_args, identity)
    model = Path(str(engine_args.get("model", "")))
    if not seqs or not length or not share or not (model / "config.json").is_file():
        return None
    try:
        config = json.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        return None
    per_token = kv_bytes_per_token(config, engine_args.get("dtype"), engine_args.get("kv_cache_dtype")) \
        if isinstance(config, dict) else None
    if per_token is None:
        return None
    tokens = -(-int(length) // SIZED_ROUND_TOKENS) * SIZED_ROUND_TOKENS
    kv = int(seqs) * tokens * per_token
    spare = SIZED_SPARE_BYTES + SIZED_SPARE_FRACTION * share
    if kv + weights_bytes(model) + spare > share:
        log.info("no sized vLLM start: %d sequences of %d tokens take %.2f GiB of KV cache, more than the share of "
                 "the GPU leaves (%.2f GiB, less the weights and %.2f GiB spare): the instances measure", int(seqs),
                 int(length), kv / 2**30, share / 2**30, spare / 2**30)
        return None
    return kv


def plan_for(engine_args: dict, wave: int, waves: int, identity: dict, folder: Path | None = None,
             before: float | None = None) -> int | None:
    """This instance's KV-cache bytes when every wave of its GPU has a usable plan written before `before`; else None
    (measure, in turn). Every wave reads the same files against the same limit, so all decide alike."""
    limit = share_limit(engine_args, identity)
    plans = [read_plan(plan_key(engine_args, w, waves, identity), folder, before, limit) for w in range(int(waves))]
    return plans[int(wave)] if all(p is not None for p in plans) else None


def borrowed_plan(engine_args: dict, wave: int, waves: int, identity: dict, folder: Path | None = None,
                  run: float | None = None) -> int | None:
    """For a wave after the first whose turn has come: the size the wave before it recorded in run `run` (what that
    wave measured, or itself borrowed; None: any run), or None (measure). Called once the wave before has started,
    so nothing measures while this instance allocates."""
    if int(wave) < 1:
        return None
    return read_plan(plan_key(engine_args, int(wave) - 1, waves, identity), folder,
                     limit=share_limit(engine_args, identity), run=run)


def write_plan(engine_args: dict, wave: int, waves: int, identity: dict, kv_cache_memory_bytes: int,
               folder: Path | None = None, run: float | None = None) -> Path | None:
    """Keep what this instance measured (atomic: instances and runs may race; the last write wins). The same wave of
    several GPUs of one kind writes one file: within run `run` the smallest size they got is kept, so a later wave
    that borrows it never takes more than any of them measured."""
    folder = folder or plan_dir()
    path = folder / f"{plan_key(engine_args, wave, waves, identity)}.json"
    size = int(kv_cache_memory_bytes)
    if run is not None:
        earlier = read_plan(path.stem, folder, run=run)
        size = min(size, earlier) if earlier is not None else size
    record = {"kv_cache_memory_bytes": size, "recorded": time.strftime("%Y-%m-%dT%H:%M:%S"), "run": run,
              "wave": int(wave), "waves": int(waves), **identity,
              "args": memory_args(engine_args)}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(record, sort_keys=True, default=repr))
        os.replace(tmp, path)
    except OSError as e:  # a read-only cache costs the next run its side-by-side start, nothing else
        log.warning("start plan not written to %s (%s)", path, e)
        return None
    return path


def measured_kv_bytes_rpc(worker) -> int:
    """On a vLLM worker (`LLM.collective_rpc`): the KV-cache bytes its memory profile gave (0 if it did not profile:
    a size was given)."""
    return int(getattr(worker, "available_kv_cache_memory_bytes", 0) or 0)


class StartTurn:
    """An instance's turn to start (`rollout.engines.EngineStart`): with a start plan for every wave of its GPU
    (rollout/vllm_start_plan.py) it starts at once with its recorded KV-cache size; otherwise it waits for the waves
    before it, measures, and records what it got for the next run. Adds `kv_cache_memory_bytes` to `kwargs`."""

    def __init__(self, kwargs: dict, start: EngineStart | None, tensor_parallel_size: int):
        self.identity = None  # set when this instance measures (or borrows) and should record what it gets
        self.borrowed = None  # the KV-cache bytes taken from the wave before (borrowed_plan)
        self.kwargs = dict(kwargs)
        self.start = start or EngineStart()
        if "kv_cache_memory_bytes" in kwargs:  # the user's own size (rollout.engine_args): nothing to measure
            return
        if not self.start.plan or tensor_parallel_size > 1:  # (a tensor-parallel instance's GPUs are its Ray workers')
            self.start.wait()
            return
        try:
            identity = device_identity()
        except Exception as e:  # noqa: BLE001 - no plan then, as before plans existed
            log.warning("no vLLM start plan: this GPU is not identified (%s: %s)", type(e).__name__, e)
            self.start.wait()
            return
        kv = sized_kv_bytes(self.kwargs, identity)
        if kv is not None:  # all the engine can use fits its share: nothing to measure, nothing to record
            kwargs["kv_cache_memory_bytes"] = kv
            log.info("vLLM start plan: wave %d of %d starts now with a %.2f GiB KV cache, its max_num_seqs x "
                     "max_model_len", self.start.wave, self.start.waves, kv / 2**30)
            return
        kv = plan_for(self.kwargs, self.start.wave, self.start.waves, identity, before=self.start.plans_before)
        if kv is None:
            self.start.wait()
            if not self.start.record:  # a restart: it measures beside running instances and records nothing
                return
            self.identity = identity
            self.borrowed = borrowed_plan(self.kwargs, self.start.wave, self.start.waves, identity,
                                          run=self.start.plans_before)
            if self.borrowed is not None:
                kwargs["kv_cache_memory_bytes"] = self.borrowed
                log.info("vLLM start plan: wave %d of %d starts with the %.2f GiB KV cache wave %d recorded in this "
                         "run", self.start.wave, self.start.waves, self.borrowed / 2**30, self.start.wave - 1)
            return
        kwargs["kv_cache_memory_bytes"] = kv
        log.info("vLLM start plan: wave %d of %d starts now with the %.2f GiB KV cache it measured before",
                 self.start.wave, self.start.waves, kv / 2**30)

    def record(self, llm) -> None:
        if self.identity is None:
            return
        run = self.start.plans_before
        if self.borrowed is not None:  # it did not measure: the size it started with is its wave's plan
            write_plan(self.kwargs, self.start.wave, self.start.waves, self.identity, self.borrowed, run=run)
            return
        measured = [int(b) for b in llm.collective_rpc(measured_kv_bytes_rpc)]
        if measured and min(measured) > 0:
            write_plan(self.kwargs, self.start.wave, self.start.waves, self.identity, min(measured), run=run)
