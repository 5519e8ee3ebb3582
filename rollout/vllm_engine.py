"""The vLLM rollout engine: same interface as `rollout.hf_engine.HFEngine`, on `vllm.LLM` (vLLM 0.26).

Token ids in (`prompt_token_ids`), token ids out (`detokenize=False`: nothing is re-tokenised). What the trainer
needs, per response token, comes from vLLM's processed distribution (`LLM(logprobs_mode="processed_logprobs")`:
after temperature/top-k/top-p, i.e. the truncated renormalised distribution the token was drawn from):
- the sampled token's processed logprob;
- the kept set (Keep Sampling Mask, CSR): vLLM 0.26 has no mask output, so it is the set of finite entries of the
  processed distribution. `capture=sampler` records every one of them, whatever the set's size (in a GPU buffer
  of `kept_set_buffer_mb`); `capture=logprobs` sees at most K = `max_logprobs` of them. A position whose set
  could not be recorded whole (logprobs: the K-th entry is still kept; sampler: the buffer filled up) is counted
  in `Generation.kept_set_cut`, warned about, and left out of the loss (`Generation.loss_mask` 0 there), since the
  trainer cannot rebuild pi_old's normaliser from a cut set;
- the MoE routes (Keep Routing): `LLM(enable_return_routed_experts=True)`; rows of dense layers are zeroed using
  the config (`rl.routing.moe_layer_indices`), since 0 is also a valid expert id.
Two ways to take the first two (`rollout.capture`): `sampler` (default) reduces them on the GPU next to vLLM's
sampler (rollout/vllm_capture.py; exact kept-set sizes, so a cut is known) and asks vLLM for no logprobs;
`logprobs` asks vLLM for `SamplingParams(logprobs=K, flat_logprobs=True)` and converts the flat arrays with numpy
(a set is flagged as maybe cut when its K-th entry is still finite) - simpler, but vLLM's own handling of K+1
entries per token cost 49% of the tokens/s on a 0.6B model (benchmarks/README.md).

Weights: `update_weights` & co. forward vLLM's native weight-transfer API (CUDA IPC when colocated, NCCL when
split; see trainer/weight_sync.py); `load_state_dict` is the slow CPU fallback (a restarted worker).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from contextlib import contextmanager

import numpy as np

from rewards.text import log_safe
from rl.config import ROLLOUT_DEFAULTS, rollout_placement
from rl.models import load_tokenizer, to_checkpoint_format
from rollout.engines import EngineStart
from rollout.sampling import Generation, SamplingParams, eos_token_ids
from rollout.vllm_capture import Capture, flat_to_capture, sampler_capture
from rollout.vllm_start_plan import StartTurn

log = logging.getLogger(__name__)


def vllm_available() -> bool:
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


def default_num_logprobs(top_k: int) -> int:
    """K: top_k + 1 recovers every top-k set and flags only ties; without top-k, 64 (then cuts are flagged)."""
    return int(top_k) + 1 if top_k and top_k > 0 else 64


def _per_prompt(vsp, n_prompts: int, seeds: list[int] | None = None):
    """A seeded call (`rollout.per_request_seed`) gives prompt i the seed seed + i * 1_000_003, so equal prompts in
    one call (the first turns of an agent task's episodes) still draw different samples, or `seeds[i]` where the
    caller gives one per prompt; vLLM itself offsets the seed of each of a request's n samples."""
    if vsp.seed is None or (n_prompts == 1 and seeds is None):
        return vsp
    params = []
    for i in range(n_prompts):
        p = vsp.clone()
        p.seed = (int(seeds[i]) if seeds is not None else vsp.seed + i * 1_000_003) % (2**63)
        params.append(p)
    return params


def _one_request_per_sample(params, n_prompts: int, n: int):
    """The same samples as `params` (one SamplingParams, or one per prompt) asking n each, as n requests of one
    sample per prompt (prompt i's at positions i*n..i*n+n-1). vLLM runs a request for n samples as n requests of one
    anyway, the j-th seeded seed + j when seeded (vllm/v1/engine/parallel_sampling.py); sent as separate requests,
    each sample comes out of `LLMEngine.step` when it ends rather than with its whole group."""
    if not isinstance(params, list) and params.seed is None:
        one = params.clone()
        one.n = 1
        return one  # unseeded: one shared SamplingParams
    per_prompt = params if isinstance(params, list) else [params] * n_prompts
    out = []
    for p in per_prompt:
        for j in range(n):
            q = p.clone()
            q.n = 1
            if p.seed is not None:
                q.seed = (p.seed + j) % (2**63)
            out.append(q)
    return out


def _finish_reason(completion) -> str:
    """Ours from vLLM's: "length" when the token budget ran out, "stop" otherwise (EOS, a stop token, an abort)."""
    return "length" if completion.finish_reason == "length" else "stop"


class PrefixCacheNotReset(RuntimeError):
    """vLLM would not reset its prefix cache after a weight update (requests still running hold KV blocks)."""


class RouteRowsMissing(ValueError):
    """vLLM returned routes for fewer positions than the sequence has (Keep Routing cannot replay them)."""


def align_routes(routes: np.ndarray, rows: int, dense_layers: list[int], dtype: np.dtype) -> np.ndarray:
    """vLLM routed_experts [S, L, K] -> [rows, L, K] in the route dtype with dense-layer rows zeroed.

    vLLM 0.26's rows are positions 0, 1, ... of prompt + response (S = rows); extra rows past `rows` are dropped.
    Fewer rows raise `RouteRowsMissing`: which positions are missing is not known (an engine that disaggregates
    prefill and decode leaves the prompt's rows out), and every row of a Trajectory's routes is replayed (`collate`
    marks them all valid), so padding them (zeros: expert 0) would force the trainer onto experts nobody chose."""
    out = np.asarray(routes).astype(dtype, copy=True)
    if out.shape[0] > rows:
        out = out[:rows]
    elif out.shape[0] < rows:  # never seen with vLLM 0.26
        raise RouteRowsMissing(
            f"Keep Routing: vLLM returned routed_experts for {out.shape[0]} of the sequence's {rows} positions "
            "(prompt + response - 1); which positions are missing is unknown, so none of them can be replayed. Set "
            "algorithm.keep_routing=false to train without replaying routes")
    if dense_layers:
        out[:, dense_layers] = 0
    return np.ascontiguousarray(out)


def _num_experts(config) -> int:
    for key in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return 0


def compilation_args(torch_compile: bool, enforce_eager: bool, bitwise: bool) -> dict:
    """`rollout.compile=false`: no torch.compile of the model (a fresh machine's first start spent ~30 s an instance
    compiling, benchmarks/README.md cold_start.py) and CUDA graphs for decode only, which need none. Nothing for an
    eager engine (enforce_eager, or algorithm.on_policy=bitwise, which sets its own)."""
    if torch_compile or enforce_eager or bitwise:
        return {}
    return {"compilation_config": {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY"}}


class VLLMEngine:
    def __init__(
        self,
        model_path: str,
        dtype: str = "bfloat16",
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.4,
        enable_sleep_mode: bool = False,
        max_logprobs: int = 64,
        record_routes: bool = True,
        weight_transfer_backend: str | None = None,
        max_model_len: int | None = None,
        max_num_seqs: int | None = None,
        enforce_eager: bool = False,
        torch_compile: bool = True,
        seed: int = 0,
        per_request_seed: bool = False,
        capture: str = "sampler",
        extra_args: dict | None = None,
        kept_set_buffer_mb: float = 256.0,
        fp32_lm_head: bool = False,
        engine_core_in_process: bool = True,
        start: EngineStart | None = None,
        bitwise: bool = False,
        kv_cache_dtype: str = "auto",
    ):
        # IPC handles travel pickled; the sampler needs no flashinfer.
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        try:
            import flashinfer  # noqa: F401
        except Exception:
            os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        if bitwise:  # vLLM reads some of its settings when its modules are imported
            os.environ["VLLM_BATCH_INVARIANT"] = "1"
        from transformers import AutoConfig
        from vllm import LLM

        from rl.routing import moe_layer_indices, route_dtype

        self.tokenizer = load_tokenizer(model_path)
        config = AutoConfig.from_pretrained(model_path)
        self.max_logprobs = int(max_logprobs)
        self.kept_buffer_ids = int(float(kept_set_buffer_mb) * 2**20) // 4  # int32 ids (capture=sampler)
        self.per_request_seed = bool(per_request_seed)
        moe = moe_layer_indices(config) if record_routes else None
        self.record_routes = bool(moe)
        self.dense_layers = sorted(set(range(config.num_hidden_layers)) - set(moe or []))
        self.route_dtype = route_dtype(_num_experts(config)) if moe else None
        kwargs = dict(
            model=model_path,
            dtype=dtype,
            tensor_parallel_size=int(tensor_parallel_size),
            gpu_memory_utilization=float(gpu_memory_utilization),
            enable_sleep_mode=bool(enable_sleep_mode),
            logprobs_mode="processed_logprobs",
            max_logprobs=self.max_logprobs,
            enforce_eager=bool(enforce_eager),
            seed=int(seed),
        )
        if int(tensor_parallel_size) > 1 and "distributed_executor_backend" not in (extra_args or {}):
            # vLLM's Ray executor: one Ray worker per GPU, placed where the run's placement group says
            # (launch/placement.py). The engine core runs in this process, not in a subprocess of its own, so the
            # executor finds this actor's placement group and the Ray connection it already has
            kwargs["distributed_executor_backend"] = "ray"
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if self.record_routes:
            kwargs["enable_return_routed_experts"] = True
        if max_model_len:
            kwargs["max_model_len"] = int(max_model_len)
        if max_num_seqs:
            kwargs["max_num_seqs"] = int(max_num_seqs)
        if kv_cache_dtype != "auto":  # rollout.kv_cache_dtype: fewer bytes read per decode step (and per cached token)
            kwargs["kv_cache_dtype"] = kv_cache_dtype
        if weight_transfer_backend:
            try:
                from vllm.config import WeightTransferConfig

                kwargs["weight_transfer_config"] = WeightTransferConfig(backend=weight_transfer_backend)
            except ImportError:
                kwargs["weight_transfer_config"] = {"backend": weight_transfer_backend}
        kwargs.update(compilation_args(torch_compile, enforce_eager, bitwise))
        kwargs.update(extra_args or {})
        if bitwise:  # algorithm.on_policy=bitwise (rollout/bitwise_engine.py)
            from rollout.bitwise_engine import bitwise_engine_args

            kwargs = bitwise_engine_args(kwargs, engine_core_in_process=engine_core_in_process,
                                         tensor_parallel_size=int(tensor_parallel_size))
        if engine_core_in_process:
            # vLLM's engine core runs in this process instead of a spawned one that imports vLLM and torch again
            # (~13 s of each instance's start on a GPU machine, benchmarks/README.md cold_start.py)
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        elif int(tensor_parallel_size) == 1:  # vLLM's own default, whatever an earlier engine of this process set
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        plan = StartTurn(kwargs, start, int(tensor_parallel_size))  # may wait for the waves before it
        self.llm = LLM(**kwargs)
        plan.record(self.llm)
        if capture not in ("sampler", "logprobs"):
            raise ValueError(f"rollout.capture must be sampler or logprobs, got {capture!r}")
        self.capture = capture
        if capture == "sampler":
            from rollout.vllm_capture import install_rpc

            reasons = sorted({r for r in self.llm.collective_rpc(install_rpc) if r})
            if bitwise and not reasons:  # the trainer replays the V2 runner's sampler (processed logits)
                if not all(self.llm.collective_rpc(_v2_runner_rpc)):
                    reasons = ["vLLM's V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0?) returns other logprobs"]
            if reasons and bitwise:
                raise RuntimeError("algorithm.on_policy=bitwise needs rollout.capture=sampler on vLLM's V2 model "
                                   f"runner: {'; '.join(reasons)}")
            if reasons:
                log.warning("rollout.capture=sampler unavailable (%s): using vLLM's logprobs output", "; ".join(reasons))
                self.capture = "logprobs"
        self.fp32_lm_head = bool(fp32_lm_head)
        if fp32_lm_head:
            reasons = sorted({r for r in self.llm.collective_rpc(_fp32_head_rpc) if r})
            if reasons:
                raise RuntimeError(f"model.fp32_lm_head: cannot compute vLLM's LM head in float32 here ({'; '.join(reasons)})")
        self.eos_ids = eos_token_ids(model_path, self.tokenizer)
        self._asleep: set[str] = set()
        self.last_convert_seconds = 0.0
        self.last_collect_seconds = 0.0  # sampler capture: moving the recorded rows out of vLLM's engine process
        self.last_flush_seconds = 0.0  # sampler capture: GPU -> CPU moves during generation (inside vLLM's loop)
        self.last_generate_seconds = 0.0  # vLLM's generate call alone (capture's in-loop work included)
        # sampler capture, per generate: CPU seconds recording rows (flushes excluded), decode steps recorded, and
        # with `capture_profile` the GPU seconds of the reduction kernel (CUDA events; benchmarks only)
        self.capture_profile = False
        self.last_capture_timing: dict = {}

    # -- sampling ------------------------------------------------------------------------------------------
    def _sampling_params(self, sp: SamplingParams, capture: bool = True):
        from vllm import SamplingParams as VSP

        return VSP(
            n=int(sp.n),
            temperature=float(sp.temperature),
            top_p=float(sp.top_p),
            top_k=int(sp.top_k) if sp.top_k > 0 else 0,
            max_tokens=int(sp.max_new_tokens),
            stop_token_ids=sorted({*self.eos_ids, *sp.stop_token_ids}),
            seed=sp.seed if (self.per_request_seed and sp.seed is not None) else None,
            logprobs=(self.max_logprobs if sp.records_kept_sets else 0) if capture else None,
            flat_logprobs=True,
            detokenize=False,
        )

    @staticmethod
    def _prompts(prompts: list[list[int]]):
        try:
            from vllm.inputs import TokensPrompt
        except ImportError:  # pragma: no cover - older layouts
            TokensPrompt = dict  # noqa: N806
        for p in prompts:
            if len(p) == 0:
                raise ValueError("cannot generate from an empty prompt")
        return [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts]

    def generate(self, prompts: list[list[int]], sp: SamplingParams, capture: bool = True,
                 on_samples_done: Callable[[list[tuple[int, list[Generation]]]], None] | None = None,
                 seeds: list[int] | None = None) -> list[list[Generation]]:
        """Sample `sp.n` continuations of every prompt; grouped per prompt. capture=False (benchmarks only)
        skips logprobs, kept sets and the route conversion. `on_samples_done`: called during generation with
        [(prompt index, [one generation: tokens and finish reason only])] for each sample as it ends
        (`_report_finished_samples`); vLLM then gets one request per sample (`_one_request_per_sample`).
        `seeds`: one per prompt (with rollout.per_request_seed; sp.seed must be set too), instead of sp.seed's
        offsets."""
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
        if self._asleep:
            raise RuntimeError(f"vLLM engine is asleep ({sorted(self._asleep)}); sync weights / wake it first")
        want_mask = capture and sp.records_kept_sets
        hook = capture and self.capture == "sampler"
        vsp = self._sampling_params(sp, capture and not hook)
        n = int(vsp.n)
        if on_samples_done is not None and n > 1:
            # prompt i's samples are requests i*n..i*n+n-1, of one sample each
            inputs = self._prompts([p for p in prompts for _ in range(n)])
            params = _one_request_per_sample(_per_prompt(vsp, len(prompts), seeds), len(prompts), n)
            per_request = 1
        else:
            inputs, params, per_request = self._prompts(prompts), _per_prompt(vsp, len(prompts), seeds), n
        if hook:
            from rollout.vllm_capture import collect_rpc, start_rpc

            self.llm.collective_rpc(start_rpc, args=(self.kept_buffer_ids if want_mask else 0, self.capture_profile))
            t_gen = time.perf_counter()
            try:
                with self._report_finished_samples(prompts, per_request, on_samples_done):
                    outputs = self.llm.generate(inputs, params, use_tqdm=False)
            finally:  # always stop recording (the driver rank's result is the one that is not None)
                self.last_generate_seconds = time.perf_counter() - t_gen
                t_collect = time.perf_counter()
                rows = next((r for r in self.llm.collective_rpc(collect_rpc) if r is not None),
                            {"error": "no vLLM worker returned the recorded rows"})
                self.last_collect_seconds = time.perf_counter() - t_collect
                self.last_flush_seconds = float(rows.get("flush_seconds", 0.0))
                timed = ("record_seconds", "steps", "reduce_gpu_seconds", "launch_seconds", "sampler_seconds")
                self.last_capture_timing = {k: rows[k] for k in timed if k in rows}
            if "error" in rows:
                raise RuntimeError(f"rollout.capture=sampler failed inside vLLM ({rows['error']}); set "
                                   "rollout.capture=logprobs to take vLLM's logprobs output instead")
        else:
            t_gen = time.perf_counter()
            with self._report_finished_samples(prompts, per_request, on_samples_done):
                outputs = self.llm.generate(inputs, params, use_tqdm=False)
            self.last_generate_seconds = time.perf_counter() - t_gen
        t0 = time.perf_counter()
        # (request id, completion) of prompt i's samples, in sample order
        reqs = n // per_request
        comps = [[(req.request_id, c) for req in outputs[i * reqs : (i + 1) * reqs]
                  for c in sorted(req.outputs, key=lambda c: c.index)] for i in range(len(prompts))]
        if hook:
            from rollout.vllm_capture import assemble, completion_key

            keys = [(completion_key(rid, c.index, per_request), len(p), c.token_ids)
                    for p, cs in zip(prompts, comps) for rid, c in cs]
            captured = iter(assemble(rows, keys))
        groups: list[list[Generation]] = []
        for prompt, cs in zip(prompts, comps):
            P = len(prompt)
            gens = []
            for _, comp in cs:
                g = self._generation(comp, P, routes=capture)
                if capture:
                    self._apply_capture(g, sampler_capture(next(captured)) if hook else
                                        flat_to_capture(comp.logprobs, len(g.response_ids), want_mask))
                gens.append(g)
            groups.append(gens)
        self.last_convert_seconds = time.perf_counter() - t0  # our conversion cost (benchmarks/rollout_capture.py)
        cut = sum(g.kept_set_cut for gens in groups for g in gens)
        if cut:
            tokens = sum(len(g.response_ids) for gens in groups for g in gens)
            fix = ("raise rollout.kept_set_buffer_mb" if hook else
                   "use rollout.capture=sampler (complete sets) or raise rollout.logprobs")
            log.warning("Keep Sampling Mask: the kept sets of %d of %d sampled positions could not be recorded whole; "
                        "they are left out of the loss (rollout/kept_set_cut_frac): %s", cut, tokens, fix)
        return groups

    def _generation(self, comp, P: int, routes: bool = True) -> Generation:
        """One vLLM completion of a P-token prompt: its tokens, finish reason and (`routes`) routes; logprobs 0 until
        `_apply_capture`."""
        ids = np.asarray(comp.token_ids, dtype=np.int32)
        R = len(ids)
        g = Generation(response_ids=ids, inference_logprobs=np.zeros(R, dtype=np.float32),
                       finish_reason=_finish_reason(comp))
        if comp.finish_reason not in ("length", "stop"):
            log.warning("vLLM finished a request with %r; reported as 'stop'", comp.finish_reason)
        if routes and self.record_routes and comp.routed_experts is not None:
            g.routed_experts = align_routes(comp.routed_experts, P + R - 1, self.dense_layers, self.route_dtype)
        return g

    @staticmethod
    def _apply_capture(g: Generation, cap: Capture) -> None:
        g.inference_logprobs = cap.inference_logprobs
        g.kept_ids, g.kept_offsets, g.kept_set_cut = cap.kept_ids, cap.kept_offsets, cap.truncated
        if cap.truncated:
            # The trainer cannot rebuild pi_old's normaliser from a cut set (it would renormalise over too few ids
            # and overestimate log pi_theta), so those positions stay out of the loss.
            g.loss_mask = (~cap.cut).astype(np.float32)

    def _apply_logprobs_output(self, g: Generation, comp, want_mask: bool) -> None:
        """rollout.capture=logprobs: `g`'s logprobs and kept sets from vLLM's logprobs output of its completion."""
        self._apply_capture(g, flat_to_capture(comp.logprobs, len(g.response_ids), want_mask))

    def _apply_sampler_rows(self, g: Generation, rows: dict) -> None:
        """rollout.capture=sampler: `g`'s logprobs and kept sets from its rows as `vllm_capture.assemble` gives them."""
        self._apply_capture(g, sampler_capture(rows))

    def stream(self, sp: SamplingParams):
        """A `rollout.engine_stream.VLLMStream` on this engine (requests submitted and finished one by one)."""
        from rollout.engine_stream import VLLMStream

        if self._asleep:
            raise RuntimeError(f"vLLM engine is asleep ({sorted(self._asleep)}); sync weights / wake it first")
        return VLLMStream(self, sp)

    @contextmanager
    def _report_finished_samples(self, prompts: list[list[int]], per_request: int, on_samples_done):
        """While `LLM.generate` runs, hand each request's samples to `on_samples_done` as soon as vLLM returns the
        request finished (LLM.generate asks for final outputs only, so a request's output appears once, when all
        its `per_request` samples have ended): by watching what `LLMEngine.step`, which LLM.generate's loop calls,
        returns. Outputs are matched to prompts by their token ids; a prompt whose ids occur at two prompt indices
        is not reported early (its outputs could not be told apart), nor are the outputs of the last step (they are
        returned at once). An error in the callback stops the reports, never the generation."""
        engine = getattr(self.llm, "llm_engine", None)
        if on_samples_done is None or not callable(getattr(engine, "step", None)):
            yield
        else:
            yield from _watch_steps(engine, prompts, per_request, on_samples_done)

    # -- scoring -------------------------------------------------------------------------------------------
    def _prompt_logprobs(self, sequences: list[list[int]]) -> list[np.ndarray]:
        """log p(token_t | tokens_<t) for t >= 1 of each sequence (plain softmax; temperature 1)."""
        from vllm import SamplingParams as VSP

        vsp = VSP(max_tokens=1, temperature=1.0, prompt_logprobs=0, flat_logprobs=True, detokenize=False)
        out = []
        for req, seq in zip(self.llm.generate(self._prompts(sequences), vsp, use_tqdm=False), sequences):
            plp = req.prompt_logprobs  # position 0 has none
            if hasattr(plp, "start_indices"):
                starts = np.asarray(plp.start_indices[1:], dtype=np.int64)
                vals = np.asarray(plp.logprobs, dtype=np.float32)
                out.append(vals[starts])  # entry 0 of each position is the prompt token itself
            else:
                out.append(np.array([d[int(t)].logprob for d, t in zip(plp[1:], seq[1:])], dtype=np.float32))
        return out

    def continuation_logprobs(self, prompts: list[list[int]], continuations: list[list[int]]) -> list[np.ndarray]:
        """Logprob of each continuation token given the prompt and the preceding continuation tokens."""
        seqs = [list(p) + list(c) for p, c in zip(prompts, continuations)]
        return [lp[len(p) - 1 :] for lp, p in zip(self._prompt_logprobs(seqs), prompts)]

    def next_token_logprobs(self, prompts: list[list[int]], token_ids: list[int]) -> np.ndarray:
        """log p(token | prompt) at the position after each prompt, for the given candidate tokens: [B, C]."""
        seqs = [list(p) + [int(t)] for p in prompts for t in token_ids]
        last = np.array([lp[-1] for lp in self._prompt_logprobs(seqs)], dtype=np.float32)
        return last.reshape(len(prompts), len(token_ids))

    # -- sleep mode ----------------------------------------------------------------------------------------
    def sleep(self, level: int = 2) -> None:
        if not self._asleep:
            self._head_changed()  # frees the float32 copy while the trainer has the GPU
            self.llm.sleep(level=int(level))
            self._asleep = {"weights", "kv_cache"}

    def wake_up(self, tags: list[str] | None = None) -> None:
        tags = [t for t in (tags or ["weights", "kv_cache"]) if t in self._asleep]
        if tags:
            self.llm.wake_up(tags=tags)
            self._asleep -= set(tags)

    # -- weights (vLLM's native weight-transfer API) ------------------------------------------------------------
    def init_weight_transfer_engine(self, request: dict) -> None:
        self.llm.init_weight_transfer_engine(request)

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def update_weights(self, request: dict) -> None:
        self.llm.update_weights(request)

    def finish_weight_update(self) -> None:
        self.llm.finish_weight_update()
        self._head_changed()

    def _head_changed(self) -> None:
        if self.fp32_lm_head:
            self.llm.collective_rpc(_fp32_head_stale_rpc)

    def reset_prefix_cache(self) -> None:
        """Drop vLLM's prefix cache after a weight change: its KV blocks (and, with Keep Routing, the routes vLLM keeps
        with them) were computed with the old weights. vLLM answers False and resets nothing while running requests
        hold blocks; carrying on would let the next requests reuse the old weights' KV, so that raises
        `PrefixCacheNotReset`. Not retried: the engine core runs in this process (`engine_core_in_process`, and
        always with tensor parallelism), so nothing a retry could wait for moves between calls. (Nothing runs at a
        sync today: a rollout worker runs one call at a time, generate() returns with every request done, a stream
        aborts its requests on close and sleep aborts them; the error guards the callers that change that, e.g.
        partial rollouts, which must finish or abort their requests before a sync.)"""
        if self.llm.reset_prefix_cache() is not False:  # vLLM 0.26 returns a bool (True: reset)
            return
        try:
            running = f"{int(self.llm.llm_engine.get_num_unfinished_requests())} requests still running"
        except Exception:  # noqa: BLE001 - the count only makes the message more precise
            running = "requests still running"
        raise PrefixCacheNotReset(
            f"vLLM did not reset its prefix cache after the weight update (reset_prefix_cache() answered False: "
            f"{running} hold KV blocks); requests sent now would reuse prefix KV and routes computed with the old "
            "weights. Let every request finish or abort it before a weight sync")

    def load_state_dict(self, state_dict: dict) -> None:
        """CPU fallback (a restarted worker): load HF-named CPU tensors into every vLLM worker."""
        model_type = getattr(self.llm.llm_engine.model_config.hf_config, "model_type", "")
        items = [kv for name, t in state_dict.items() for kv in to_checkpoint_format(name, t, model_type)]
        self.wake_up()
        self.llm.collective_rpc(_load_weights_rpc, args=(items,))
        self._head_changed()
        self.reset_prefix_cache()


def _load_weights_rpc(worker, items):  # runs inside each vLLM worker process
    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    model.load_weights(weights=iter(items))
    return None


def _v2_runner_rpc(worker) -> bool:  # runs inside each vLLM worker
    from rollout.vllm_capture import is_v2_runner

    return bool(is_v2_runner(getattr(worker, "model_runner", None)))


def _fp32_head_rpc(worker) -> str | None:  # runs inside each vLLM worker process
    """`model.fp32_lm_head`: the LM head's matmul in float32 (vLLM computes the logits outside its CUDA graphs, in
    the model dtype), from a float32 copy of the head's weight made at first use after every weight change
    (`_fp32_head_stale_rpc`). Returns None, or why it cannot be done."""
    import torch
    import torch.nn.functional as F

    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    head = getattr(model, "lm_head", None)
    method = getattr(head, "quant_method", None)
    if head is None or not hasattr(method, "apply") or not isinstance(getattr(head, "weight", None), torch.Tensor):
        return f"{type(model).__name__} has no unquantised lm_head"
    cache = worker._mixrl_fp32_head = {"w": None}

    def apply(layer, x, bias=None):
        if cache["w"] is None:
            cache["w"] = layer.weight.float()
        return F.linear(x.float(), cache["w"], None if bias is None else bias.float())

    method.apply = apply
    return None


def _fp32_head_stale_rpc(worker) -> None:
    """The head's weight changed (a weight sync) or was dropped (sleep): the float32 copy is made again at next use."""
    cache = getattr(worker, "_mixrl_fp32_head", None)
    if cache is not None:
        cache["w"] = None


def _watch_steps(engine, prompts: list[list[int]], per_request: int, on_samples_done):
    """`VLLMEngine._report_finished_samples` with an engine that has `step`: wrap it while the caller's block runs."""
    index: dict[tuple, int] = {}
    for i, p in enumerate(prompts):
        key = tuple(p)
        index[key] = i if index.get(key, i) == i else -1
    step, own = engine.step, "step" in vars(engine)
    more = getattr(engine, "has_unfinished_requests", lambda: True)
    state = {"on": True}

    def watched_step(*args, **kwargs):
        outputs = step(*args, **kwargs)
        # the last step's samples go out with generate's result at once: reporting them too would score them twice
        if state["on"] and more():
            try:
                done = []
                for out in outputs or ():
                    i = index.get(tuple(out.prompt_token_ids or ()), -1)
                    if not getattr(out, "finished", False) or i < 0 or len(out.outputs) != per_request:
                        continue
                    done.append((i, [Generation(response_ids=np.asarray(c.token_ids, dtype=np.int32),
                                                inference_logprobs=np.zeros(len(c.token_ids), np.float32),
                                                finish_reason=_finish_reason(c))
                                     for c in sorted(out.outputs, key=lambda c: c.index)]))
                if done:
                    on_samples_done(done)
            except Exception as e:  # noqa: BLE001 - early scoring is an optimisation; generation goes on
                state["on"] = False
                log.warning("reporting finished samples during generation failed (%s); the rest are scored "
                            "after generation", log_safe(e, 1000))
        return outputs

    engine.step = watched_step
    try:
        yield
    finally:
        if own:
            engine.step = step
        else:
            del engine.step


def build(rcfg: dict, model_cfg: dict, model_path: str, record_routes: bool, seed: int = 0,
          start: EngineStart | None = None, bitwise: bool = False) -> VLLMEngine:
    """`rollout.engine=vllm` (rl/engine_specs.py): the rollout keys of the config, CUDA IPC weight transfer when
    colocated with the trainer, NCCL when split. `start`: its turn among the instances of its GPU (StartTurn)."""
    k = rcfg.get("logprobs")
    D = ROLLOUT_DEFAULTS  # a key the config lacks gets the YAML's value (conf/rollout/vllm.yaml)
    return VLLMEngine(
        model_path,
        dtype=model_cfg["dtype"],
        tensor_parallel_size=int(rcfg.get("tensor_parallel_size", D["tensor_parallel_size"])),
        gpu_memory_utilization=float(rcfg.get("gpu_memory_utilization", D["gpu_memory_utilization"])),
        enable_sleep_mode=bool(rcfg.get("enable_sleep_mode", D["enable_sleep_mode"])),
        max_logprobs=int(k) if k else default_num_logprobs(int(rcfg["top_k"])),
        record_routes=record_routes,
        weight_transfer_backend="ipc" if rollout_placement(rcfg) == "colocated" else "nccl",
        max_model_len=rcfg.get("max_model_len"),
        max_num_seqs=rcfg.get("max_num_seqs"),
        enforce_eager=bool(rcfg.get("enforce_eager", D["enforce_eager"])),
        torch_compile=bool(rcfg.get("compile", D["compile"])),
        seed=seed,
        per_request_seed=bool(rcfg.get("per_request_seed", D["per_request_seed"])),
        capture=str(rcfg.get("capture", D["capture"])),
        extra_args=dict(rcfg.get("engine_args") or {}),
        kept_set_buffer_mb=float(rcfg.get("kept_set_buffer_mb") or D["kept_set_buffer_mb"]),
        fp32_lm_head=bool(model_cfg.get("fp32_lm_head", False)),
        engine_core_in_process=str(rcfg.get("engine_core", D["engine_core"])) == "in_process",
        start=start,
        bitwise=bitwise,
        kv_cache_dtype=str(rcfg.get("kv_cache_dtype", D["kv_cache_dtype"])),
    )
