"""The trainer's side of `algorithm.on_policy=bitwise` (rl/bitwise.py, issue 39): the sampled tokens' logprobs computed
with the kernels vLLM ran in batch-invariant mode (rollout/bitwise_engine.py), in vLLM's order of operations, on the
trainer's own weights. When the weights are the engine's, every value equals the engine's bit for bit.

vLLM's decoder layer, as the trainer reproduces it (Llama / Qwen2 / Qwen3 families, one GPU):

    residual = h + residual;  x = rms_norm_bi(residual, w_in)            (first layer: x = rms_norm_bi(h))
    q, k, v  = split(linear_bi(x, [Wq; Wk; Wv]) (+ b))                    vLLM's Triton persistent matmul
    q, k     = rms_norm_bi per head (Qwen3);  rotary_embedding(q, k)      vLLM's CUDA kernel, its cos/sin table
    o        = linear_bi(flash_attn_varlen(q, k, v, causal, num_splits=1), Wo)    FA3, one KV split
    residual = o + residual;  x = rms_norm_bi(residual, w_post)
    h        = linear_bi(silu_and_mul(linear_bi(x, [Wg; Wu])), Wd)        vLLM's CUDA kernel
    logits   = linear_bi(rms_norm_bi(h + residual, w_norm), W_head)       bf16 logits
    z        = temperature(logits) (vLLM's kernel), -inf outside the kept set (Keep Sampling Mask)
    log pi(o_t) = z[o_t] - logsumexp(z)                                   rl/kept_set.py's row kernel, as captured

linear_bi is the function vLLM's linear layers call in the mode (the matmul rounded to bf16, then the bias added
as a second op). Every kernel reduces a row in an order that does not depend on the other rows, so a full-sequence
forward over the trainer's micro-batch gives each position what vLLM's prefill and decode steps gave it. The forward is
inference only (no autograd through vLLM's kernels): `forward_logprobs` takes the values from here and the
gradient from the ordinary forward of the same weights (`value_from`), so the loss sees the engine's numbers and
the backward is the ordinary one.
"""

from __future__ import annotations

import torch

from rl.bitwise import FA3_MIN_QUERY_ROWS, gpu_unsupported_reason, unsupported_reason
from rl.kept_set import reduce_rows
from rl.logprobs import kept_matrix
from rl.models import split_head


def value_from(ordinary: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """`exact`'s values with `ordinary`'s gradient: d(out)/d(ordinary) = identity. (ordinary + (exact - ordinary)
    would round: the returned values must be exact's bits.)"""
    return _ValueFrom.apply(ordinary, exact)


def bitwise_forward(model) -> "BitwiseForward":
    """The model's BitwiseForward, built once (it checks the model's layers)."""
    bf = getattr(model, "_bitwise_forward", None)
    if bf is None:
        bf = BitwiseForward(model)
        object.__setattr__(model, "_bitwise_forward", bf)  # not a submodule: no state_dict entry
    return bf


class _ValueFrom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ordinary, exact):
        return exact.detach().clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def silu_and_mul(out: torch.Tensor, gate_up: torch.Tensor) -> None:
    """vLLM's SiluAndMul kernel (silu(gate) * up in float32, one rounding), registered by `vllm._custom_ops`."""
    torch.ops._C.silu_and_mul(out, gate_up)


def _rope_table(config, head_dim: int, device, dtype) -> torch.Tensor:
    """vLLM's cos/sin table (RotaryEmbedding._compute_cos_sin_cache), computed as vLLM computes it at model build: on
    the GPU in float32, then cast to the model's dtype."""
    params = getattr(config, "rope_parameters", None) or {}
    base = float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
    partial = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    rotary_dim = int(head_dim * float(partial))
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float, device=device) / rotary_dim))
    t = torch.arange(int(config.max_position_embeddings), dtype=torch.float, device=device)
    freqs = torch.einsum("i,j -> ij", t, inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)


class BitwiseForward:
    """The bitwise forward over an HF model (not wrapped, not partitioned: ZeRO-3 is refused with the mode)."""

    def __init__(self, model):
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        reason = unsupported_reason(config) or gpu_unsupported_reason()
        if reason:
            raise ValueError(f"algorithm.on_policy=bitwise: {reason}")
        self.config = config
        self.body, self.head = split_head(model)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.eps = float(config.rms_norm_eps)
        self.scale = self.head_dim**-0.5
        self._rope: torch.Tensor | None = None

    def rope(self, device, dtype) -> torch.Tensor:
        if self._rope is None or self._rope.device != device or self._rope.dtype != dtype:
            self._rope = _rope_table(self.config, self.head_dim, device, dtype)
        return self._rope

    @torch.no_grad()
    def hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int):
        """Final hidden states [T, H] of T tokens (flat): positions [T], samples' boundaries cu_seqlens [S+1]."""
        from vllm import _custom_ops as ops
        from vllm.model_executor.layers.batch_invariant import linear_batch_invariant as linear
        from vllm.model_executor.layers.batch_invariant import rms_norm_batch_invariant as rms_norm
        from vllm.vllm_flash_attn import flash_attn_varlen_func

        body = self.body
        h = torch.nn.functional.embedding(input_ids, body.embed_tokens.weight)
        rope = self.rope(h.device, h.dtype)
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        positions = positions.to(torch.long)
        cu_seqlens = cu_seqlens.to(torch.int32)
        residual = None
        for layer in body.layers:
            att = layer.self_attn
            if residual is None:
                residual, x = h, rms_norm(h, layer.input_layernorm.weight, self.eps)
            else:
                residual = h + residual
                x = rms_norm(residual, layer.input_layernorm.weight, self.eps)
            w_qkv = torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight])
            b_qkv = (torch.cat([att.q_proj.bias, att.k_proj.bias, att.v_proj.bias])
                     if att.q_proj.bias is not None else None)
            q, k, v = linear(x, w_qkv, b_qkv).split([q_size, kv_size, kv_size], dim=-1)
            if hasattr(att, "q_norm"):  # Qwen3: RMSNorm over each head's vector
                q = rms_norm(q.reshape(-1, self.heads, self.head_dim), att.q_norm.weight, self.eps).reshape(q.shape)
                k = rms_norm(k.reshape(-1, self.kv_heads, self.head_dim), att.k_norm.weight, self.eps).reshape(k.shape)
            ops.rotary_embedding(positions, q, k, self.head_dim, rope, True)  # in place, neox style
            o = flash_attn_varlen_func(
                q.reshape(-1, self.heads, self.head_dim), k.reshape(-1, self.kv_heads, self.head_dim),
                v.reshape(-1, self.kv_heads, self.head_dim), max_seqlen_q=max(max_seqlen, FA3_MIN_QUERY_ROWS),
                cu_seqlens_q=cu_seqlens, max_seqlen_k=max_seqlen, cu_seqlens_k=cu_seqlens, softmax_scale=self.scale,
                causal=True, num_splits=1, fa_version=3)
            h = linear(o.reshape(-1, q_size), att.o_proj.weight, att.o_proj.bias)
            residual = h + residual
            x = rms_norm(residual, layer.post_attention_layernorm.weight, self.eps)
            mlp = layer.mlp
            gate_up = linear(x, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
            act = torch.empty(gate_up.shape[0], gate_up.shape[1] // 2, dtype=gate_up.dtype, device=gate_up.device)
            silu_and_mul(act, gate_up)
            h = linear(act, mlp.down_proj.weight)
        return rms_norm(h + residual, body.norm.weight, self.eps)

    @torch.no_grad()
    def token_logprobs(self, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
                       kept_ids: torch.Tensor | None = None, kept_offsets: torch.Tensor | None = None,
                       chunk_size: int = 1024) -> torch.Tensor:
        """log pi(target) per row of `hidden` [N, H] as vLLM's sampler and the capture computed it (float32 [N])."""
        from vllm.model_executor.layers.batch_invariant import linear_batch_invariant

        head = self.head
        offsets_cpu = kept_offsets.cpu() if kept_offsets is not None else None
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        for s in range(0, hidden.shape[0], chunk_size):
            e = min(s + chunk_size, hidden.shape[0])
            z = linear_batch_invariant(hidden[s:e], head.weight, getattr(head, "bias", None))
            if temperature not in (0.0, 1.0):  # vLLM skips its kernel at these
                from vllm.v1.worker.gpu.sample.gumbel import apply_temperature

                rows = torch.zeros(e - s, dtype=torch.int32, device=z.device)
                apply_temperature(z, rows, torch.tensor([temperature], dtype=torch.float32, device=z.device))
            if offsets_cpu is not None:
                z.masked_fill_(kept_matrix(kept_ids, offsets_cpu, targets, s, e, z.shape[1], invert=True),
                               float("-inf"))
            out[s:e] = reduce_rows(z, targets[s:e], logits=True)[0]
        return out

    def logprobs(self, batch, temperature: float, chunk_size: int = 1024) -> torch.Tensor:
        """The sampled tokens' logprobs of a TrainBatch (padded rows or one packed row), in `logit_index` order."""
        ids = batch.input_ids
        if batch.position_ids is not None:  # packed: the collate's boundaries
            positions, cu, longest = batch.position_ids.reshape(-1), batch.cu_seqlens, int(batch.max_seqlen)
        else:  # right-padded rows, each its own sequence (padding after a sample's end changes none of its rows)
            B, T = ids.shape
            positions = torch.arange(T, device=ids.device).repeat(B)
            cu, longest = torch.arange(0, B * T + 1, T, device=ids.device, dtype=torch.int32), T
        hidden = self.hidden(ids.reshape(-1), positions, cu, longest)[batch.logit_index]
        return self.token_logprobs(hidden, batch.targets, temperature, batch.kept_ids, batch.kept_offsets, chunk_size)
