"""The engine's side of `algorithm.on_policy=bitwise` (rl/bitwise.py, issue 39): vLLM in batch-invariant mode, set up
so that the trainer's forward (trainer/bitwise.py) can call the very kernels vLLM ran, row for row.

- `VLLM_BATCH_INVARIANT=1` before the engine starts: vLLM then reduces every row in a fixed order (its Triton
  RMSNorm and LM head, cuBLAS without split-K, FlashAttention with one KV split).
- Eager (no torch.compile, no CUDA graphs): with custom ops on, each layer runs the kernel its class names, not an
  Inductor fusion the trainer cannot call.
- FlashAttention (FA3 on Hopper) as the attention backend: the trainer calls the same kernel over contiguous
  keys and values.
- One patch inside vLLM: its RMSNorm with a residual (`fused_add_rms_norm`, a CUDA kernel) reduces with a thread
  block whose size depends on the number of tokens in the batch (vLLM issue 48271), so a row's result changes with
  the batch; here it becomes the residual add followed by vLLM's own batch-invariant Triton RMSNorm, the same
  function of the same inputs (the kernel rounds the sum to the model's dtype before normalising, as the add does).
- One more: FlashAttention-3 turns a causal call whose longest query is one token (a pure decode step) into a
  non-causal one, and for head sizes other than 128 that picks wider key blocks (192 keys at head size 64 against
  the causal prefill's 128), so a decoded token's attention sums its keys in other blocks than the trainer's
  prefill over the whole sequence (SmolLM2-135M: every token past 128 keys differed, benchmarks/README.md). Decode
  steps here say their longest query has two tokens: FA3 then keeps the causal kernel, whose mask puts each
  one-token query after all its keys, so the result is the same attention with the prefill's blocks. NOT YET
  EFFECTIVE: on SmolLM2 the bits did not change with this wrapper (benchmarks/README.md), so vLLM's decode reaches
  the kernel another way; models with head size 128 (Qwen3) match without it.
The patches are process-wide, which is why the mode needs the engine core in this process
(`rollout.engine_core=in_process`).
"""

from __future__ import annotations

import os

from rl.bitwise import MATMUL_ENV

_patched: list = []


def _rms_norm_forward_cuda(self, x, residual=None):
    from vllm.model_executor.layers.batch_invariant import rms_norm_batch_invariant

    weight = self.weight.data if (self.pass_weight_add if residual is not None else self.pass_weight) else None
    if residual is None:
        return rms_norm_batch_invariant(x, weight, self.variance_epsilon)
    residual = x + residual
    return rms_norm_batch_invariant(residual, weight, self.variance_epsilon), residual


def patch_rms_norm() -> None:
    """vLLM's RMSNorm with a residual through the batch-invariant Triton kernel (see the module docstring)."""
    if "rms_norm" in _patched:
        return
    from vllm.model_executor.layers.layernorm import RMSNorm

    RMSNorm.forward_cuda = _rms_norm_forward_cuda
    _patched.append("rms_norm")


def patch_decode_attention() -> None:
    """Decode steps through FA3's causal kernel (see the module docstring)."""
    if "attention" in _patched:
        return
    from vllm.v1.attention.backends import flash_attn as backend

    original = backend.flash_attn_varlen_func

    def flash_attn_varlen_func(*args, **kwargs):
        if kwargs.get("causal") and kwargs.get("max_seqlen_q") == 1:
            kwargs["max_seqlen_q"] = 2
        return original(*args, **kwargs)

    backend.flash_attn_varlen_func = flash_attn_varlen_func
    _patched.append("attention")


def bitwise_engine_args(kwargs: dict, *, engine_core_in_process: bool, tensor_parallel_size: int) -> dict:
    """The engine arguments and process settings of the mode; refuses what cannot be bitwise."""
    if not engine_core_in_process:
        raise ValueError("algorithm.on_policy=bitwise patches vLLM's RMSNorm in the rollout worker's process: it needs "
                         "rollout.engine_core=in_process")
    if int(tensor_parallel_size) != 1:
        raise ValueError("algorithm.on_policy=bitwise runs one engine per GPU (rollout.tensor_parallel_size=1): a "
                         "tensor-parallel all-reduce sums the ranks' partial results in another order than one GPU")
    os.environ["VLLM_BATCH_INVARIANT"] = "1"
    os.environ.update(MATMUL_ENV)
    patch_rms_norm()
    patch_decode_attention()
    return {**kwargs, "enforce_eager": True, "attention_backend": "FLASH_ATTN"}
