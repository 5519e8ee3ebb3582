"""The engine's side of `algorithm.on_policy=bitwise` (rl/bitwise.py, issue 39): vLLM in batch-invariant mode, set up
so that the trainer's forward (trainer/bitwise.py) can call the very kernels vLLM ran, row for row.

- `VLLM_BATCH_INVARIANT=1` before the engine starts: vLLM then reduces every row in a fixed order (its Triton
  persistent matmul for every linear layer and the LM head, its Triton RMSNorm, FlashAttention with one KV split).
- Eager (no torch.compile, no CUDA graphs): with custom ops on, each layer runs the kernel its class names, not an
  Inductor fusion the trainer cannot call.
- FlashAttention (FA3 on Hopper) as the attention backend: the trainer calls the same kernel over contiguous
  keys and values.
- One patch inside vLLM: its RMSNorm with a residual (`fused_add_rms_norm`, a CUDA kernel) reduces with a thread
  block whose size depends on the number of tokens in the batch (vLLM issue 48271), so a row's result changes with
  the batch; here it becomes the residual add followed by vLLM's own batch-invariant Triton RMSNorm, the same
  function of the same inputs (the kernel rounds the sum to the model's dtype before normalising, as the add does).
- One more: FlashAttention-3 (vLLM's fork) runs a call whose longest query, times the query heads per key head,
  is at most 64 rows on one MMA warpgroup with its own tile, and at head size 64 that tile sums keys in blocks of
  192 where the trainer's prefill over whole sequences (and vLLM's own prefill) uses blocks of 128. Every decode
  step is such a call, so a decoded token's attention over more than 128 keys added them in another order
  (SmolLM2-135M: 2.9% of those tokens equal, benchmarks/README.md). Here every causal call says its longest
  query has at least 65 tokens (`rl.bitwise.FA3_MIN_QUERY_ROWS`): FA3 then takes its ordinary causal tile
  (128-key blocks, as the prefill) and masks each query by its own length, so the attention is the same function
  with the prefill's blocks. (At head size 128 both tiles use 128-key blocks, which is why Qwen3 matched without
  this.)
The patches are process-wide and stay for the process's life (a rollout worker holds one engine), which is why the
mode needs the engine core in this process (`rollout.engine_core=in_process`). The judge is another actor's process
and never gets them.
"""

from __future__ import annotations

from rl.bitwise import FA3_MIN_QUERY_ROWS, gpu_unsupported_reason

_original: dict = {}  # what each patch replaced, by patch name; a name here means the patch is in place


def _rms_norm_forward_cuda(self, x, residual=None):
    from vllm.model_executor.layers.batch_invariant import rms_norm_batch_invariant

    if self.variance_size_override is not None:  # a partial-width variance: not a layer of the supported families
        return _original["rms_norm"](self, x, residual)
    weight = self.weight.data if (self.pass_weight_add if residual is not None else self.pass_weight) else None
    if residual is None:
        return rms_norm_batch_invariant(x, weight, self.variance_epsilon)
    residual = x + residual
    return rms_norm_batch_invariant(residual, weight, self.variance_epsilon), residual


def patch_rms_norm() -> None:
    """vLLM's RMSNorm with a residual through the batch-invariant Triton kernel (see the module docstring)."""
    if "rms_norm" in _original:
        return
    from vllm.model_executor.layers.layernorm import RMSNorm

    _original["rms_norm"] = RMSNorm.forward_cuda
    RMSNorm.forward_cuda = _rms_norm_forward_cuda


def patch_decode_attention() -> None:
    """Decode steps through FA3's ordinary causal tile (see the module docstring)."""
    if "attention" in _original:
        return
    from vllm.v1.attention.backends import flash_attn as backend

    original = _original["attention"] = backend.flash_attn_varlen_func

    def flash_attn_varlen_func(*args, **kwargs):
        if kwargs.get("causal") is True and kwargs.get("max_seqlen_q", FA3_MIN_QUERY_ROWS) < FA3_MIN_QUERY_ROWS:
            kwargs["max_seqlen_q"] = FA3_MIN_QUERY_ROWS
        return original(*args, **kwargs)

    backend.flash_attn_varlen_func = flash_attn_varlen_func


def bitwise_engine_args(kwargs: dict, *, engine_core_in_process: bool, tensor_parallel_size: int) -> dict:
    """The engine arguments and patches of the mode; refuses what cannot be bitwise. `VLLM_BATCH_INVARIANT=1` is set
    by the caller before vLLM is imported (VLLMEngine)."""
    if not engine_core_in_process:
        raise ValueError("algorithm.on_policy=bitwise patches vLLM's RMSNorm in the rollout worker's process: it needs "
                         "rollout.engine_core=in_process")
    if int(tensor_parallel_size) != 1:
        raise ValueError("algorithm.on_policy=bitwise runs one engine per GPU (rollout.tensor_parallel_size=1): a "
                         "tensor-parallel all-reduce sums the ranks' partial results in another order than one GPU")
    reason = gpu_unsupported_reason()
    if reason:
        raise RuntimeError(f"algorithm.on_policy=bitwise: {reason}")
    patch_rms_norm()
    patch_decode_attention()
    return {**kwargs, "enforce_eager": True, "attention_backend": "FLASH_ATTN"}
