"""Keep Routing for MoE policies: record the experts chosen at sampling, replay them in the training forward.

Why: in an MoE model a tiny numerical difference between the inference engine and the trainer (bf16 kernels,
batching, a weight update in between) can flip a token's top-k expert set, so the trainer would score a token
with a different sub-network than the one that sampled it. DeepSeek-V3.2 ("Keep Routing") stores the expert ids
used at sampling and forces the training forward to use the same ids. The gate *weights* are still recomputed
from the live router at those ids, so the router keeps receiving gradient.

Layout (see `rl/trajectory.py`): per sample `routed_experts` is `[P + R - 1, num_hidden_layers, top_k]`, uint8
(uint16 above 256 experts); row t is the route used when the model processed input token t (the last token has
none); dense layers are rows of zeros (0 is also a valid expert id, so dense layers are known from the config,
never from the values). In a `TrainBatch` the routes are long `[B, T-1, L, K]` with `route_valid` bool `[B, T-1]`.

Pieces:
- `moe_layers(model)` -> `MoESpec` (router modules by layer index, sizes, route dtype) or None for a dense model;
  raises `UnsupportedMoEError` for an MoE family without an adapter.
- `RouteRecorder(model)`: context manager; each forward call appends one `[batch, seq, L, K]` array to `records`
  (prefill and every decode step of a KV-cache generation are separate calls). `stack_records` concatenates them.
- `RouteReplay(model, routed_experts, valid)`: context manager; replaces every MoE router's output with the recorded
  ids at valid positions (positions >= S or invalid keep the model's own routing) and counts `routing_mismatch`.

Mechanics: HF MoE blocks (transformers 5.17 and 5.23 checked) call a router module `layer.mlp.gate` that returns
`(router_logits, top_k_weights, top_k_ids)` over flattened tokens `[batch*seq, ...]`. A forward pre-hook on the
block (`layer.mlp`) notes the `[batch, seq]` shape of its input; a forward hook on the router reads (record) or
rewrites (replay) its output. Replay recomputes the weights from the router's own `router_logits` output (already in
the autograd graph), so no weight is read or cached here: this works unchanged under ZeRO-3 (DeepSpeed gathers the
router weight for its forward) and under gradient checkpointing (the recomputation calls the same hooks, and every
lookup is by layer index, never by call count).

Per family (`_Adapter`): how the weights are formed from the logits at given ids.
- softmax routers (Qwen3-MoE, Qwen2-MoE, OLMoE, Mixtral): probs = softmax(logits, fp32), gather at the ids,
  renormalise if `norm_topk_prob` (Mixtral always). Qwen2-MoE's shared expert is outside the router: untouched.
  Mixtral's router jitter noise (train mode) is switched off for the whole replay context.
- DeepSeek-V3 / V3.2: scores = sigmoid(logits); gather at the ids (the score-correction bias and the
  group-limited selection only choose ids, so replay bypasses both); renormalise if `norm_topk_prob`; times
  `routed_scaling_factor`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from torch import nn

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "MoESpec",
    "RouteRecorder",
    "RouteReplay",
    "UnsupportedMoEError",
    "moe_layer_indices",
    "moe_layers",
    "route_dtype",
    "stack_records",
]


class UnsupportedMoEError(RuntimeError):
    """The model is MoE but its family has no Keep Routing adapter."""


# ----------------------------------------------------------------------------------------------- family adapters


def _softmax_weights(norm: Callable[[nn.Module], bool], cast_to_logits_dtype: bool):
    def weights(router: nn.Module, logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        w = torch.softmax(logits.float(), dim=-1).gather(1, ids)
        if norm(router):
            w = w / w.sum(dim=-1, keepdim=True)
        return w.to(logits.dtype) if cast_to_logits_dtype else w

    return weights


def _deepseek_weights(router: nn.Module, logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    w = logits.float().sigmoid().gather(1, ids)  # no e_score_correction_bias, no group limit: ids are given
    if router.norm_topk_prob:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return w * router.routed_scaling_factor


def _qwen_moe_layers(cfg) -> list[int]:
    if not cfg.num_experts:
        return []
    skip = set(cfg.mlp_only_layers or [])
    step = cfg.decoder_sparse_step
    return [i for i in range(cfg.num_hidden_layers) if i not in skip and (i + 1) % step == 0]


def _deepseek_v3_layers(cfg) -> list[int]:
    return list(range(cfg.first_k_dense_replace, cfg.num_hidden_layers))


def _deepseek_v32_layers(cfg) -> list[int]:
    types = getattr(cfg, "mlp_layer_types", None)
    if types is None:
        return _deepseek_v3_layers(cfg)
    return [i for i, t in enumerate(types) if t == "sparse"]


@dataclass(frozen=True)
class _Adapter:
    layers: Callable  # config -> MoE layer indices
    num_experts: Callable  # config -> number of routed experts
    weights: Callable  # (router, router_logits [N, E], ids [N, K]) -> weights [N, K]
    jitter_attr: str | None = None  # attribute of the MoE block holding train-mode router jitter (zeroed in replay)


_QWEN_WEIGHTS = _softmax_weights(lambda r: r.norm_topk_prob, True)
_ADAPTERS: dict[str, _Adapter] = {
    "qwen3_moe": _Adapter(_qwen_moe_layers, lambda c: c.num_experts, _QWEN_WEIGHTS),
    "qwen2_moe": _Adapter(_qwen_moe_layers, lambda c: c.num_experts, _QWEN_WEIGHTS),
    "olmoe": _Adapter(lambda c: list(range(c.num_hidden_layers)), lambda c: c.num_experts, _QWEN_WEIGHTS),
    "mixtral": _Adapter(
        lambda c: list(range(c.num_hidden_layers)),
        lambda c: c.num_local_experts,
        _softmax_weights(lambda r: True, False),  # HF Mixtral always renormalises and keeps fp32 weights
        jitter_attr="jitter_noise",
    ),
    "deepseek_v3": _Adapter(_deepseek_v3_layers, lambda c: c.n_routed_experts, _deepseek_weights),
    "deepseek_v32": _Adapter(_deepseek_v32_layers, lambda c: c.n_routed_experts, _deepseek_weights),
}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(_ADAPTERS)
_MOE_CONFIG_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts")


# ------------------------------------------------------------------------------------------------------- spec


def route_dtype(num_experts: int) -> np.dtype:
    """The dtype of recorded routes: uint8 up to 256 experts, uint16 above (same as vLLM)."""
    return np.dtype(np.uint8) if num_experts <= 256 else np.dtype(np.uint16)


def looks_moe(cfg) -> bool:
    """Whether a model config describes routed experts (any family)."""
    for key in _MOE_CONFIG_KEYS:
        value = getattr(cfg, key, None)
        if isinstance(value, int) and value > 1:
            return True
    return False


def moe_layer_indices(config) -> list[int] | None:
    """Indices of the MoE layers of a supported family from its config alone (dense layers excluded), e.g. for
    masking dense rows of routes that came from vLLM. None for a dense config; raises for an unsupported MoE."""
    model_type = getattr(config, "model_type", None)
    adapter = _ADAPTERS.get(model_type)
    if adapter is None:
        if looks_moe(config):
            raise UnsupportedMoEError(
                f"Keep Routing does not support MoE model_type {model_type!r}; "
                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        return None
    layers = adapter.layers(config)
    return layers or None


@dataclass
class MoESpec:
    model_type: str
    num_hidden_layers: int
    top_k: int
    num_experts: int
    routers: dict[int, nn.Module]  # layer index -> router module (`layer.mlp.gate`), MoE layers only
    blocks: dict[int, nn.Module]  # layer index -> MoE block (`layer.mlp`)
    first_layer: nn.Module  # decoder layer 0: its pre-hook marks the start of a forward call
    adapter: _Adapter = field(repr=False)

    @property
    def dtype(self) -> np.dtype:
        return route_dtype(self.num_experts)

    @property
    def layer_ids(self) -> list[int]:
        return sorted(self.routers)

    def moe_mask(self) -> np.ndarray:
        """bool [num_hidden_layers]: True for MoE layers (dense layers carry zero rows)."""
        mask = np.zeros(self.num_hidden_layers, dtype=bool)
        mask[self.layer_ids] = True
        return mask


def _decoder_layers(model: nn.Module, n: int) -> nn.ModuleList:
    for path in ("model.layers", "layers", "model.language_model.layers", "language_model.layers"):
        obj = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, nn.ModuleList) and len(obj) == n:
            return obj
    for module in model.modules():  # fallback: first module list with one entry per decoder layer
        if isinstance(module, nn.ModuleList) and len(module) == n:
            return module
    raise UnsupportedMoEError(f"could not find the {n} decoder layers of {type(model).__name__}")


def moe_layers(model: nn.Module) -> MoESpec | None:
    """Describe the MoE layers of `model`; None for a dense model, `UnsupportedMoEError` for an unsupported MoE."""
    cfg = model.config
    layer_ids = moe_layer_indices(cfg)
    if layer_ids is None:
        return None
    adapter = _ADAPTERS[cfg.model_type]
    layers = _decoder_layers(model, cfg.num_hidden_layers)
    routers, blocks = {}, {}
    for i, layer in enumerate(layers):
        block = getattr(layer, "mlp", None)
        is_moe = block is not None and hasattr(block, "gate") and hasattr(block, "experts")
        if is_moe != (i in layer_ids):
            raise UnsupportedMoEError(
                f"{cfg.model_type}: layer {i} is {'MoE' if is_moe else 'dense'} in the model but "
                f"{'MoE' if i in layer_ids else 'dense'} by the config; this transformers version is not supported"
            )
        if is_moe:
            routers[i], blocks[i] = block.gate, block
    return MoESpec(
        model_type=cfg.model_type,
        num_hidden_layers=cfg.num_hidden_layers,
        top_k=cfg.num_experts_per_tok,
        num_experts=adapter.num_experts(cfg),
        routers=routers,
        blocks=blocks,
        first_layer=layers[0],
        adapter=adapter,
    )


def _require_spec(model: nn.Module) -> MoESpec:
    spec = moe_layers(model)
    if spec is None:
        raise ValueError(f"{type(model).__name__} ({model.config.model_type}) is not an MoE model")
    return spec


def stack_records(records: list[np.ndarray]) -> np.ndarray:
    """Concatenate per-call records (prefill, then one per decode step) along seq: [batch, total_seq, L, K]."""
    return np.concatenate(records, axis=1)


# ------------------------------------------------------------------------------------------------ shared hooks


class _Hooks:
    """Installs a pre-hook on each MoE block (notes [batch, seq]) and a forward hook on each router."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.spec = _require_spec(model)
        self._handles: list = []
        self._shape: dict[int, tuple[int, int]] = {}  # layer -> (batch, seq) of the block's current input

    def _install(self) -> None:
        for i in self.spec.layer_ids:
            pre = self._block_pre_hook(i)
            self._handles.append(self.spec.blocks[i].register_forward_pre_hook(pre, with_kwargs=True))
            self._handles.append(self.spec.routers[i].register_forward_hook(self._router_hook(i)))

    def _block_pre_hook(self, layer: int):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            self._shape[layer] = (hidden.shape[0], hidden.shape[1]) if hidden.dim() == 3 else (1, hidden.shape[0])

        return hook

    def _router_hook(self, layer: int):
        def hook(module, args, output):
            return self.on_router(layer, module, output)

        return hook

    def on_router(self, layer: int, router: nn.Module, output):  # pragma: no cover - overridden
        raise NotImplementedError

    def _remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._shape.clear()


# ---------------------------------------------------------------------------------------------------- capture


class RouteRecorder(_Hooks):
    """Record the top-k expert ids of every forward call while active.

    `records[c]` is a numpy array `[batch, seq, num_hidden_layers, top_k]` in the route dtype for the c-th forward
    call (a KV-cache generation gives the prefill, then one `seq=1` array per decode step); dense layers are zero
    rows. The ids stay on the device until `records` is read (one transfer per call), so recording adds no sync.
    Meant for sampling forwards (no gradient checkpointing: a recomputed layer would be recorded as a new call).
    """

    def __init__(self, model: nn.Module):
        super().__init__(model)
        self._pending: list[dict[int, torch.Tensor]] = []
        self._done: list[np.ndarray] = []

    def __enter__(self) -> "RouteRecorder":
        self._handles.append(self.spec.first_layer.register_forward_pre_hook(self._new_call))
        self._install()
        return self

    def __exit__(self, *exc) -> None:
        self._remove()

    def _new_call(self, module, args) -> None:
        self._pending.append({})

    def on_router(self, layer: int, router: nn.Module, output):
        if not self._pending:  # the router ran without decoder layer 0 (e.g. a block called on its own)
            self._pending.append({})
        batch, seq = self._shape[layer]
        self._pending[-1][layer] = output[2].detach().reshape(batch, seq, -1)
        return None

    def _finalize(self) -> None:
        spec = self.spec
        small = spec.num_experts <= 256
        for call in self._pending:
            if not call:
                continue
            ref = next(iter(call.values()))
            routes = torch.zeros(
                (*ref.shape[:2], spec.num_hidden_layers, spec.top_k),
                dtype=torch.uint8 if small else torch.int32,
                device=ref.device,
            )
            for layer, ids in call.items():
                routes[:, :, layer] = ids.to(routes.dtype)
            self._done.append(routes.cpu().numpy().astype(spec.dtype, copy=False))
        self._pending.clear()

    @property
    def records(self) -> list[np.ndarray]:
        self._finalize()
        return self._done

    def clear(self) -> None:
        self._pending.clear()
        self._done.clear()


# ----------------------------------------------------------------------------------------------------- replay


class RouteReplay(_Hooks):
    """Force recorded routes on every MoE router while active.

    routed_experts: long `[B, S, num_hidden_layers, top_k]`; valid: bool `[B, S]`. The forward's batch must be B;
    its seq length T may exceed S (positions >= S use the model's own routing, e.g. S = T-1 for the last token), as
    do positions with `valid=False` (padding). At replayed positions the ids are the recorded ones and the weights
    are recomputed from the live router logits (gradient flows into the router weight).

    Mismatch counters: `mismatch_count` / `total_count` count (valid position, MoE layer) pairs where the router's
    own top-k set (sorted) differs from the recorded set. Dedupe choice: the stats are kept per layer index and
    overwritten each time that layer runs, so the re-run of a layer by gradient checkpointing (same inputs, same
    result) is not counted twice. Consequence: with several forwards in one context the counters describe the last
    one; use one context per micro-batch. Counts stay on the device until read.

    Gradient checkpointing: the recomputation runs inside `backward()`, so call `backward()` before leaving the
    context (otherwise the recomputed layers route on their own; torch's non-reentrant checkpoint then usually
    raises a CheckpointError). The counters stay readable after the context exits.
    """

    def __init__(self, model: nn.Module, routed_experts: torch.Tensor, valid: torch.Tensor | None = None):
        super().__init__(model)
        spec = self.spec
        if routed_experts.dim() != 4 or tuple(routed_experts.shape[2:]) != (spec.num_hidden_layers, spec.top_k):
            raise ValueError(
                f"routed_experts must be [B, S, {spec.num_hidden_layers}, {spec.top_k}], "
                f"got {tuple(routed_experts.shape)}"
            )
        if valid is None:
            valid = torch.ones(routed_experts.shape[:2], dtype=torch.bool)
        if tuple(valid.shape) != tuple(routed_experts.shape[:2]):
            raise ValueError(f"valid must be {tuple(routed_experts.shape[:2])}, got {tuple(valid.shape)}")
        self.routed_experts = routed_experts.long()
        self.valid = valid.bool()
        self._dev: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._stats: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._jitter: dict[int, float] = {}

    def __enter__(self) -> "RouteReplay":
        attr = self.spec.adapter.jitter_attr
        if attr is not None:
            for i, block in self.spec.blocks.items():
                if hasattr(block, attr):
                    self._jitter[i] = getattr(block, attr)
                    setattr(block, attr, 0.0)
        self._install()
        return self

    def __exit__(self, *exc) -> None:
        self._remove()
        attr = self.spec.adapter.jitter_attr
        for i, value in self._jitter.items():
            setattr(self.spec.blocks[i], attr, value)
        self._jitter.clear()

    def _on_device(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._dev:
            self._dev[device] = (self.routed_experts.to(device), self.valid.to(device))
        return self._dev[device]

    def on_router(self, layer: int, router: nn.Module, output):
        logits, own_w, own_ids = output[0], output[1], output[2]
        batch, seq = self._shape[layer]
        routed, valid = self._on_device(own_ids.device)
        if routed.shape[0] != batch:
            raise ValueError(f"RouteReplay holds routes for {routed.shape[0]} sequences, forward has {batch}")
        n = min(seq, routed.shape[1])
        k = own_ids.shape[-1]
        rec = own_ids.new_zeros((batch, seq, k))
        rec[:, :n] = routed[:, :n, layer]
        use = torch.zeros((batch, seq), dtype=torch.bool, device=own_ids.device)
        use[:, :n] = valid[:, :n]
        rec, use = rec.reshape(batch * seq, k), use.reshape(batch * seq, 1)

        with torch.no_grad():
            differs = (own_ids.sort(dim=-1).values != rec.sort(dim=-1).values).any(dim=-1, keepdim=True)
            self._stats[layer] = ((differs & use).sum(), use.sum())

        ids = torch.where(use, rec, own_ids)
        weights = self.spec.adapter.weights(router, logits.reshape(batch * seq, -1), ids).to(own_w.dtype)
        weights = torch.where(use, weights, own_w)
        return (logits, weights, ids, *output[3:])

    @property
    def mismatch_count(self) -> int:
        return int(sum(int(m) for m, _ in self._stats.values()))

    @property
    def total_count(self) -> int:
        return int(sum(int(t) for _, t in self._stats.values()))

    def device_counts(self) -> tuple:
        """(mismatch_count, total_count) as they are on the device (0 before any MoE layer ran): summing them needs
        no wait for the GPU, unlike the properties, which read them."""
        return (sum((m for m, _ in self._stats.values()), 0), sum((t for _, t in self._stats.values()), 0))

    @property
    def mismatch_frac(self) -> float:
        total = self.total_count
        return self.mismatch_count / total if total else 0.0
