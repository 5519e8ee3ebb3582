"""`model.attn_implementation=varlen`: attention over packed rows with torch's own variable-length flash kernels.

A packed micro-batch (`trainer.pack_sequences`) is one row of samples back to back. With sdpa, transformers turns
that row into a dense [1, 1, T, T] block-diagonal mask: attention then costs the square of the whole row, and on a
GPU every new row length builds a new cuDNN plan on the host (~2 ms a call; on SmolLM2's SFT 0.59 s of a 1.5 s step,
benchmarks/README.md). flash-attn's varlen kernels avoid both, but flash-attn is a source build (stack-notes). torch
ships the same FlashAttention-2 kernels: `torch.nn.attention.varlen.varlen_attn` (torch >= 2.11 here), which takes
cumulative sequence lengths. This module registers an attention
function with transformers that calls them:

    out[i] = softmax(q_i K_s^T * scale + causal) V_s   for every token i of sample s, keys and values of s only

The trainer passes the samples' boundaries (`cu_seq_lens_q`, `max_length_q`: transformers' FlashAttentionKwargs,
built on the host by `rl.trajectory.collate`, no device sync); without them (a model called with position ids only,
as TRL's padding-free collator does) they are read from the position ids, and without either each row is one
sample. No attention mask is ever built: the implementation is not one of transformers' mask functions, so
`create_causal_mask` returns None. Rows must not carry left padding or a padding mask: the trainer's never do
(right-padded rows under a causal model). Generation with a KV cache is not served: the HF rollout engine runs sdpa
when the trainer runs varlen (`generation_attention`).

The kernels run in bf16/fp16 (a float32 model under autocast: in the autocast dtype). On the CPU (tests, CI), in
float32 without autocast, and on GPUs without the flash kernels (before sm80; warned once) the same attention runs
through sdpa with the block-diagonal mask built from the boundaries (rows that are one sample each: plain causal
sdpa): the same function of the inputs, for checking the plumbing, not a fast path. A model with a sliding window
or logit softcapping is refused at its first forward.
"""

from __future__ import annotations

import functools
import inspect
import logging

import torch

log = logging.getLogger(__name__)

VARLEN = "varlen"  # the `model.attn_implementation` value, and the name registered with transformers


_last_positions: list = [None, -1, None]  # (position_ids, its version, boundaries): a forward's layers share it
_warned: list = []  # the masked stand-in ran on a GPU (warned once)


def _boundaries_from_positions(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """cu_seqlens and the longest sample of a packed row from its position ids (a sample starts where the position
    is 0): device reads once per forward, the layers after the first reuse the answer (not under inference mode,
    whose tensors have no version to tell a changed tensor by)."""
    cacheable = not position_ids.is_inference()
    if cacheable and _last_positions[0] is position_ids and _last_positions[1] == position_ids._version:
        return _last_positions[2]
    flat = position_ids.reshape(-1)
    starts = torch.nonzero(flat == 0).reshape(-1)
    if not len(starts) or int(starts[0]) != 0:
        raise ValueError(f"model.attn_implementation={VARLEN}: the row's position ids start at {int(flat[0])}, not 0 "
                         "(a continuation after a KV cache is not served: generate with sdpa)")
    cu = torch.cat([starts, torch.tensor([flat.numel()], device=flat.device)]).to(torch.int32)
    found = (cu, int((cu[1:] - cu[:-1]).max()))
    if cacheable:
        _last_positions[:] = [position_ids, position_ids._version, found]
    return found


def flash_kernels(device: torch.device) -> bool:
    """Whether torch's varlen flash kernels run on `device` (CUDA, sm80 or newer: Ampere, Hopper, Blackwell)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8


@functools.lru_cache(maxsize=None)
def _varlen_api() -> tuple:
    """torch's `varlen_attn` and whether it takes `enable_gqa` (torch >= 2.13; 2.11-2.12 serve grouped-query
    attention without being asked, the kernels need heads % kv heads == 0 only). Checked on torch 2.11 and 2.13;
    torch 2.10's has no `scale` / `window_size` arguments and is refused with a clear error."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        varlen_attn = None
    params = inspect.signature(varlen_attn).parameters if varlen_attn is not None else {}
    if not {"scale", "window_size"} <= set(params):
        raise RuntimeError(f"model.attn_implementation={VARLEN} needs torch >= 2.11 on a GPU "
                           f"(torch.nn.attention.varlen.varlen_attn with scale and window_size); this is torch "
                           f"{torch.__version__}: use sdpa or flash_attention_2")
    return varlen_attn, "enable_gqa" in params


def _flash_varlen(q, k, v, cu, max_len: int, scale: float | None) -> torch.Tensor:
    """[T, H, D] causal attention within each sample through torch's FlashAttention-2 varlen kernels."""
    varlen_attn, names_gqa = _varlen_api()
    gqa = {"enable_gqa": True} if q.shape[1] != k.shape[1] and names_gqa else {}
    return varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scale, window_size=(-1, 0), **gqa)


def _masked_varlen(q, k, v, cu, scale: float | None) -> torch.Tensor:
    """The same attention through sdpa and a dense block-diagonal causal mask ([T, H, D] in and out)."""
    T = q.shape[0]
    sample = torch.repeat_interleave(torch.arange(len(cu) - 1, device=q.device), (cu[1:] - cu[:-1]).long())
    pos = torch.arange(T, device=q.device)
    mask = (sample[:, None] == sample[None, :]) & (pos[:, None] >= pos[None, :])
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=mask, scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )
    return out[0].transpose(0, 1)


def varlen_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                             sliding_window=None, softcap=None, is_causal=None, **kwargs):
    """transformers' attention-function contract: query [B, H, T, D], key/value [B, H_kv, T, D] -> ([B, T, H, D],
    None). Causal within each sample of each row; see the module docstring for where the samples' boundaries come
    from."""
    if attention_mask is not None or sliding_window is not None or softcap is not None:
        what = "an attention mask" if attention_mask is not None else (
            f"sliding_window={sliding_window}" if sliding_window is not None else f"softcap={softcap}")
        raise ValueError(f"model.attn_implementation={VARLEN} serves causal attention over packed or right-padded rows; "
                         f"{type(module).__name__} passed {what} (use sdpa or flash_attention_2 for this model)")
    if is_causal is False or not getattr(module, "is_causal", True):
        raise ValueError(f"model.attn_implementation={VARLEN} is causal only; {type(module).__name__} is not")
    if dropout:
        raise ValueError(f"model.attn_implementation={VARLEN} has no attention dropout (got {dropout})")
    B, H, T, D = query.shape
    cu, max_len = kwargs.get("cu_seq_lens_q"), kwargs.get("max_length_q")
    if cu is not None and B != 1:
        raise ValueError(f"cu_seq_lens_q describes one packed row; the batch has {B} rows")
    if cu is None and kwargs.get("position_ids") is not None and B == 1:
        cu, max_len = _boundaries_from_positions(kwargs["position_ids"])
    half = _half_dtype(query)
    flash = flash_kernels(query.device) and half is not None
    if cu is None and not flash:  # each row one sample: plain causal sdpa, no mask
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling,
                                                               enable_gqa=H != key.shape[1])
        return out.transpose(1, 2), None
    if cu is None:
        cu, max_len = torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=query.device), T
    cu = cu.to(device=query.device, dtype=torch.int32)
    q, k, v = (t.transpose(1, 2).reshape(B * T, t.shape[1], D) for t in (query, key, value))
    if flash:
        out = _flash_varlen(q.to(half), k.to(half), v.to(half), cu, int(max_len), scaling)
    else:
        if query.is_cuda and not _warned:
            _warned.append(True)
            log.warning("model.attn_implementation=%s: %s on %s has no flash kernels here (16-bit dtypes on sm80+); "
                        "packed rows run through sdpa with a dense block-diagonal mask", VARLEN, query.dtype,
                        torch.cuda.get_device_name(query.device))
        out = _masked_varlen(q, k, v, cu, scaling)
    return out.reshape(B, T, H, D), None


def _half_dtype(q: torch.Tensor) -> torch.dtype | None:
    """The 16-bit dtype the flash kernels run in: the query's own, or under autocast (a float32 model trained with
    bf16 autocast, as TRL does: the rotary embedding hands back float32 queries) the autocast dtype."""
    if q.dtype in (torch.float16, torch.bfloat16):
        return q.dtype
    if q.dtype == torch.float32 and torch.is_autocast_enabled(q.device.type):
        return torch.get_autocast_dtype(q.device.type)
    return None


def register() -> None:
    """Make `attn_implementation="varlen"` known to transformers (idempotent). Only the attention function is
    registered, no mask function: transformers then builds no mask for it."""
    from transformers import AttentionInterface

    AttentionInterface.register(VARLEN, varlen_attention_forward)


def generation_attention(name: str | None) -> str | None:
    """The attention a generating model (the HF rollout engine, KV cache and padding masks) runs for the configured
    `model.attn_implementation`: varlen serves training rows only, so generation runs sdpa."""
    return "sdpa" if name == VARLEN else name
