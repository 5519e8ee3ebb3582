"""Sampler-side capture for vLLM 0.26 (`rollout.capture=sampler`, the default): pi_old logprobs and kept sets
recorded on the GPU inside vLLM's worker, next to the sampler, instead of through vLLM's logprobs output.

Why: asking vLLM for `logprobs=K` costs ~40% of rollout throughput at K=65 (benchmarks/README.md): every
sampled position sends K+1 (id, logprob) pairs through the worker's `tolists`, the engine-core -> front-end
IPC and the front-end's per-position Python bookkeeping. Here the sampler's own processed distribution
([rows, vocab], -inf outside the top-k/top-p kept set) is reduced on the GPU, in one fused pass per row
(rl/kept_set.py), to what training needs:
- the sampled token's processed logprob (one float per row),
- the kept set, complete: the ids whose value is finite, written back to back into one GPU buffer
  (rl/kept_set.py, CSR) - a peaked distribution keeps a handful of ids, a flat one thousands, and either
  costs memory in proportion,
and moved to the CPU every few steps (at most `FLUSH_EVERY`; the first step alone, to measure the ids a row; then
before the rows of the window, at that measure, would fill half the buffer): one copy of the used part of the buffer
and of the per-row arrays, no work per id.
Generation requests vLLM no logprobs at all. Only a buffer that fills up between two flushes leaves sets
unrecorded; those positions are flagged (`cut`).

Rows are tied to completions by vLLM's internal request id and the sampled token's sequence index, so
chunked-prefill rows (discarded by vLLM), extra rows sampled past a finished request (async scheduling) and rows
re-sampled after a preemption resolve exactly: for each (request, index) the last real row wins, and the sampled
ids must equal vLLM's output tokens or `assemble` raises.

The hook needs vLLM internals of either model runner (`SamplerCapture` lists them; checked at install); when
they are missing the engine falls back to `rollout.capture=logprobs` with a warning. Speculative decoding
(rejection sampler) and pipeline parallelism are not supported.

Either way of taking them ends as one `Capture` per completion: `sampler_capture` (this hook's rows) or
`flat_to_capture` (`rollout.capture=logprobs`: vLLM's flat top-K logprobs output).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import numpy as np
import torch

from rl.kept_set import LOST, KeptIdBuffer, reduce_rows

FLUSH_EVERY = 64  # most steps between GPU -> CPU moves (each one synchronises once)
_RAND_SUFFIX = re.compile(r"-[0-9a-f]{8}$")  # vLLM appends "-<8 hex>" to every request id it is given


class SamplerCapture:
    """Inside one vLLM worker: wraps `runner.sampler.sample` and records rows while `active`.

    vLLM 0.26 has two model runners with different samplers: V1 (`vllm/v1/worker/gpu_model_runner.py`, used for
    MoE models, and whenever routed experts are returned) and V2 (`vllm/v1/worker/gpu/model_runner.py`, the
    default for dense models). Per sampled row both give: the request id, the sequence index of the new token and
    whether the row is real (a chunked-prefill row is sampled and thrown away):
    - V1: `sample(logits, sampling_metadata)` returns processed LOGPROBS; the batch's `input_batch.req_ids`,
      `optimistic_seq_lens_cpu` (index) and `discard_request_mask` describe the rows;
    - V2: `sample(logits, expanded_idx_mapping, idx_mapping_np, pos, ...)` returns processed LOGITS (-inf outside
      the kept set); rows map to requests through `req_states.index_to_req_id[idx_mapping_np]`, the index is
      `pos + 1`, and a row is real when that index reaches the request's `prefill_len`.
    """

    def __init__(self, runner):
        self.runner = runner
        self.v2 = is_v2_runner(runner)
        self.active = False
        self.error: str | None = None
        self.buffer_ids = 0  # capacity of the kept-id buffer; 0 = logprobs only
        self.buffer: KeptIdBuffer | None = None
        self.ids_per_row: float | None = None  # kept ids per row in the last flushed window (None: not measured)
        self.flush_seconds = 0.0  # time spent in flush() since start (it blocks vLLM's step loop)
        self.record_seconds = 0.0  # CPU time spent recording rows since start (per decode step, flushes excluded)
        self.steps = 0  # sampler calls recorded since start
        # benchmarks/rollout_capture.py --profile: also time the GPU reduction (CUDA events), the CPU time of the
        # reduction's launch, and the CPU time of vLLM's own sampler call (what the capture's CPU cost compares with)
        self.profile = False
        self.launch_seconds = self.sampler_seconds = 0.0
        self._events: list = []
        self._ones = np.ones(0, dtype=bool)
        self._reset()
        sampler = runner.sampler
        original = sampler.sample
        record = self._record_v2 if self.v2 else self._record_v1

        def sample(*args, **kwargs):
            t_sample = time.perf_counter()
            sampled, processed = original(*args, **kwargs)
            if self.active:
                t0, flushed = time.perf_counter(), self.flush_seconds
                if self.profile:
                    self.sampler_seconds += t0 - t_sample
                try:
                    record(sampled, processed, args, kwargs)
                    self.steps += 1
                    self.record_seconds += time.perf_counter() - t0 - (self.flush_seconds - flushed)
                except Exception as e:  # never take vLLM's engine down: stop recording, report it at collect
                    self.error, self.active = f"{type(e).__name__}: {e}", False
            return sampled, processed

        sampler.sample = sample  # instance attribute: the sampler calls self.sample(...)
        if self.v2:
            # FlashInfer's sampler never materialises the top-k/top-p masked logits this capture reads.
            sampler.use_flashinfer = False

    def _reset(self) -> None:
        self._gpu: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]] = []
        self._meta: list[tuple[list, np.ndarray | torch.Tensor, np.ndarray | None, np.ndarray]] = []
        self._cpu: list[dict] = []
        self._window_rows = 0  # rows recorded since the last flush (known on the CPU: no sync)

    def start(self, buffer_ids: int, profile: bool = False) -> None:
        """Record rows from now on: logprobs, and with `buffer_ids` > 0 whole kept sets in a GPU buffer of that many
        ids (allocated once, at the first start that needs it). `profile`: also time the GPU reduction."""
        self._reset()
        self.buffer_ids = max(int(buffer_ids), 0)
        self.ids_per_row = None
        self.flush_seconds = self.record_seconds = self.launch_seconds = self.sampler_seconds = 0.0
        self.steps = 0
        self.profile, self._events = bool(profile), []
        self.error = None
        self.active = True

    def _record_v1(self, sampled, processed, args, kwargs) -> None:
        logits = args[0] if args else kwargs["logits"]
        n = int(sampled.shape[0])
        runner = self.runner
        keep = ~np.asarray(runner.discard_request_mask.np[:n], dtype=bool)
        index = runner.optimistic_seq_lens_cpu[:n].numpy().astype(np.int64)  # sequence index of the new token
        if processed is None:  # all-greedy batch: vLLM computed no processed logprobs
            processed = logits.log_softmax(dim=-1, dtype=torch.float32)
        self._record(sampled, processed, False, list(runner.input_batch.req_ids[:n]), index, None, keep)

    def _record_v2(self, sampled, processed_logits, args, kwargs) -> None:
        names = ("logits", "expanded_idx_mapping", "idx_mapping_np", "pos")
        got = dict(zip(names, args))
        got.update({k: kwargs[k] for k in names if k in kwargs})
        idx = np.asarray(got["idx_mapping_np"]).astype(np.int64)
        n = int(sampled.reshape(-1).shape[0])
        if len(idx) != n:  # several logits per request (speculative decoding): refused at install
            raise RuntimeError(f"sampler capture: {n} sampled rows for {len(idx)} requests")
        # This runs at every decode step, on the CPU path of a loop that is CPU-bound for small models: C-level
        # loops only (a Python loop over the rows cost ~3x as much).
        req_ids = list(map(self.runner.req_states.index_to_req_id.get, idx.tolist()))
        prefill = self.runner.req_states.prefill_len.np[np.maximum(idx, 0)].astype(np.int64)
        floor = np.where(idx >= 0, prefill, np.iinfo(np.int64).max)
        keep = self._all_kept(n) if None not in req_ids else np.array([r is not None for r in req_ids], dtype=bool)
        index = got["pos"].reshape(-1)[:n] + 1  # a new tensor on the GPU (vLLM reuses pos); read back at the flush
        self._record(sampled, processed_logits, True, req_ids, index, floor, keep)

    def _all_kept(self, n: int) -> np.ndarray:
        """A read-only all-True row mask of length n (shared: flush only reads it)."""
        if len(self._ones) < n:
            self._ones = np.ones(max(n, 2 * len(self._ones)), dtype=bool)
            self._ones.flags.writeable = False
        return self._ones[:n]

    def _record(self, sampled, processed, logits: bool, req_ids, index, floor, keep) -> None:
        """processed: logprobs, or logits (any per-row offset); both -inf outside the kept set."""
        if self.buffer_ids and (self.buffer is None or self.buffer.capacity != self.buffer_ids):
            self.buffer = KeptIdBuffer(self.buffer_ids, processed.device, vocab_size=processed.shape[-1])  # once
        if self.profile and processed.is_cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            t_launch = time.perf_counter()
        lp, total, start = reduce_rows(processed, sampled, logits, self.buffer if self.buffer_ids else None)
        if self.profile and processed.is_cuda:
            self.launch_seconds += time.perf_counter() - t_launch
            end.record()
            self._events.append((begin, end))
        self._gpu.append((sampled.reshape(-1), lp, total, start))
        self._meta.append((req_ids, index, floor, keep))
        rows = sampled.numel()
        self._window_rows += rows
        per_row = self.ids_per_row
        if self.buffer_ids and per_row is None:
            # with kept sets, the first step is flushed alone: it measures the ids a row before a long window can
            # overflow the buffer (a flat distribution keeps ~100k ids a row: 64 steps of them would cut most sets)
            full = True
        else:
            # the next step, as large as this one, could take the buffer past half full at the last measure (rows,
            # not steps: the batch may still be growing, requests joining it)
            full = per_row is not None and (self._window_rows + rows) * per_row > self.buffer.capacity / 2
        if len(self._gpu) >= FLUSH_EVERY or full:
            self.flush()

    def flush(self) -> None:
        if not self._gpu:
            return
        t0 = time.perf_counter()
        tok = torch.cat([g[0] for g in self._gpu])
        lp = torch.cat([g[1] for g in self._gpu])
        chunk = dict(tok=tok.cpu().numpy().astype(np.int32), lp=lp.cpu().numpy())
        if self._gpu[0][2] is not None:
            chunk["total"] = torch.cat([g[2] for g in self._gpu]).cpu().numpy()
            chunk["start"] = torch.cat([g[3] for g in self._gpu]).cpu().numpy()
            chunk["flat"], asked = self.buffer.drain()
            self.ids_per_row = asked / max(len(tok), 1)  # `_record` flushes before the buffer is half full
        index = [m[1] for m in self._meta]  # V1: numpy per step; V2: GPU tensors, read back in one copy
        index = torch.cat(index).cpu().numpy() if self.v2 else np.concatenate(index)
        keep = np.concatenate([m[3] for m in self._meta])
        if self.v2:  # a row is real once its new token lies past the request's prefill
            keep &= index >= np.concatenate([m[2] for m in self._meta])
        chunk["req"] = [r for m in self._meta for r in m[0]]
        chunk["keep"] = keep
        chunk["index"] = index.astype(np.int64, copy=False)
        self._cpu.append(chunk)
        self._gpu, self._meta, self._window_rows = [], [], 0
        self.flush_seconds += time.perf_counter() - t0

    def collect(self) -> dict:
        """Stop recording; every row since `start` as flat numpy arrays (see `assemble`)."""
        if self.error is not None:
            self.active, self._cpu = False, []
            return {"error": self.error}
        self.flush()
        self.active = False
        chunks, self._cpu = self._cpu, []
        timing = {"flush_seconds": self.flush_seconds, "record_seconds": self.record_seconds, "steps": self.steps}
        if self._events:
            torch.cuda.synchronize()
            timing["reduce_gpu_seconds"] = sum(b.elapsed_time(e) for b, e in self._events) / 1e3
            timing.update(launch_seconds=self.launch_seconds, sampler_seconds=self.sampler_seconds)
            self._events = []
        return {**merge_chunks(chunks, with_ids=self.buffer_ids > 0), **timing}


def is_v2_runner(runner) -> bool:
    """vLLM's V2 GPU model runner (per-request state in `req_states`, sampler with `sampling_states`)."""
    return hasattr(runner, "req_states") and hasattr(getattr(runner, "sampler", None), "sampling_states")


def merge_chunks(chunks: list[dict], with_ids: bool) -> dict:
    """Concatenate flushed chunks, dropping rows vLLM discards (partial prefill); request ids become codes. Each
    chunk's ids stay as they were copied (CSR); rows' `start` is moved to the joined array (LOST stays LOST)."""
    if not chunks:
        empty = np.zeros(0, np.int32)
        return dict(req_ids=[], req=empty, index=np.zeros(0, np.int64), tok=empty, lp=np.zeros(0, np.float32),
                    flat=empty if with_ids else None, start=np.zeros(0, np.int64) if with_ids else None,
                    total=empty if with_ids else None)
    keep = np.concatenate([c["keep"] for c in chunks])
    names = [r for c in chunks for r in c["req"]]
    table: dict[str, int] = {}
    codes = np.fromiter((table.setdefault(r, len(table)) for r in names), dtype=np.int32, count=len(names))
    out = dict(req_ids=list(table), req=codes[keep], index=np.concatenate([c["index"] for c in chunks])[keep],
               tok=np.concatenate([c["tok"] for c in chunks])[keep], lp=np.concatenate([c["lp"] for c in chunks])[keep],
               flat=None, start=None, total=None)
    if with_ids:
        shift = np.cumsum([0] + [len(c["flat"]) for c in chunks[:-1]])
        start = np.concatenate([np.where(c["start"] >= 0, c["start"] + k, LOST) for c, k in zip(chunks, shift)])
        out["flat"] = np.concatenate([c["flat"] for c in chunks])
        out["start"] = start[keep]
        out["total"] = np.concatenate([c["total"] for c in chunks])[keep]
    return out


def request_key(internal_id: str) -> str:
    """vLLM's internal id -> the id we can rebuild from an output: "<ext>" (n=1) or "<index>_<ext>" (n>1)."""
    return _RAND_SUFFIX.sub("", internal_id)


def completion_key(external_id: str, index: int, n: int) -> str:
    return f"{index}_{external_id}" if n > 1 else str(external_id)


def assemble(data: dict, completions: list[tuple[str, int, np.ndarray]]) -> list[dict]:
    """Rows -> per completion (key, prompt length P, output token ids): sampled logprobs, kept-set CSR and cut flags
    (a position whose kept set could not be stored: the buffer was full; its set is then the sampled id alone,
    and the position stays out of the loss).

    The row for output token t is the last one recorded for (key, index P + t). Raises when a token has no row
    or the recorded sampled id differs from vLLM's output (the capture would be out of step with the sample).
    """
    code_of = {request_key(r): i for i, r in enumerate(data["req_ids"])}
    req, index = data["req"], data["index"]
    with_ids = data.get("flat") is not None
    order = np.lexsort((np.arange(len(req)), index, req))  # by request, then index, then recording order
    bounds = np.searchsorted(req[order], np.arange(len(data["req_ids"]) + 1))
    out = []
    for key, P, tokens in completions:
        R = len(tokens)
        result = dict(inference_logprobs=np.zeros(R, np.float32), kept_ids=None, kept_offsets=None, cut=None)
        if R == 0:
            if with_ids:
                result.update(kept_ids=np.zeros(0, np.int32), kept_offsets=np.zeros(1, np.int64),
                              cut=np.zeros(0, bool))
            out.append(result)
            continue
        code = code_of.get(key)
        if code is None:
            raise RuntimeError(f"sampler capture: no rows for request {key!r} (capture out of step with vLLM)")
        rows = order[bounds[code] : bounds[code + 1]]
        t = index[rows] - int(P)
        rows, t = rows[(t >= 0) & (t < R)], t[(t >= 0) & (t < R)]
        last = np.ones(len(t), bool)
        last[:-1] = t[1:] != t[:-1]  # rows are sorted by t then recording order: keep the last of each t
        rows, t = rows[last], t[last]
        if len(t) != R or not np.array_equal(data["tok"][rows], np.asarray(tokens, dtype=data["tok"].dtype)):
            raise RuntimeError(
                f"sampler capture: rows of request {key!r} do not match its {R} output tokens "
                f"({len(t)} rows found); set rollout.capture=logprobs to use vLLM's logprobs output instead"
            )
        result["inference_logprobs"] = data["lp"][rows].astype(np.float32)
        if with_ids:
            starts = data["start"][rows]
            cut = starts < 0
            counts = np.where(cut, 1, data["total"][rows]).astype(np.int64)  # a cut position: the sampled id
            offsets = np.zeros(R + 1, np.int64)
            np.cumsum(counts, out=offsets[1:])
            ids = gather_kept_ids(data["flat"], starts, counts, offsets)
            ids[offsets[:-1][cut]] = data["tok"][rows][cut]
            result.update(kept_ids=ids, kept_offsets=offsets, cut=cut)
        out.append(result)
    return out


# Mean kept ids per position above which `gather_kept_ids` copies one slice per position (a Python step each)
# rather than indexing every id (an int64 index written and read again): the two cost the same at ~180 on the
# CPU VM (benchmarks/capture_assemble.py)
SLICES_ABOVE = 192


def gather_kept_ids(flat: np.ndarray, starts: np.ndarray, counts: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """One completion's kept ids in `flat`'s dtype (uint16 when the vocabulary fits, else int32: the sample keeps
    them so, which halves what travels to the reward worker, the driver and the trainer; `collate` widens them),
    position after position: `counts[i]` ids from `flat[starts[i]:]`; a cut position (start < 0) gets one
    placeholder id (its sampled id is written over it)."""
    n = int(offsets[-1])
    dtype = flat.dtype if flat.dtype == np.uint16 else np.dtype(np.int32)
    if n > SLICES_ABOVE * len(counts):
        one = np.zeros(1, flat.dtype)
        ids = np.concatenate([one if b < 0 else flat[b : b + c] for b, c in zip(starts.tolist(), counts.tolist())],
                             dtype=dtype)
    else:
        src = np.where(starts < 0, 0, starts)
        index = np.repeat(src - offsets[:-1], counts) + np.arange(n)
        ids = flat[index].astype(dtype, copy=False) if len(flat) else np.zeros(n, dtype)
    if len(ids) != n:  # a row whose ids run past the drained buffer: the capture is out of step
        raise RuntimeError(f"sampler capture: {len(ids)} kept ids gathered where the rows count {n}")
    return ids


# -- RPCs (run inside every vLLM worker through LLM.collective_rpc; only the driver rank records) -------------
def install_rpc(worker) -> str | None:
    """Wrap the sampler; returns None on success or the reason it cannot be done on this vLLM."""
    runner = getattr(worker, "model_runner", None)
    sampler = getattr(runner, "sampler", None)
    if is_v2_runner(runner):
        needs = (
            ("model_runner.sampler.sample", hasattr(sampler, "sample")),
            ("model_runner.req_states.index_to_req_id", hasattr(runner.req_states, "index_to_req_id")),
            ("model_runner.req_states.prefill_len", hasattr(getattr(runner.req_states, "prefill_len", None), "np")),
        )
    else:
        needs = (
            ("model_runner.sampler.sample", hasattr(sampler, "sample")),
            ("model_runner.input_batch.req_ids", hasattr(getattr(runner, "input_batch", None), "req_ids")),
            ("model_runner.discard_request_mask", hasattr(runner, "discard_request_mask")),
            ("model_runner.optimistic_seq_lens_cpu", hasattr(runner, "optimistic_seq_lens_cpu")),
        )
    for what, ok in needs:
        if not ok:
            return f"this vLLM has no {what}"
    if getattr(runner, "speculative_config", None) is not None:
        return "speculative decoding samples with the rejection sampler"
    if getattr(getattr(runner, "parallel_config", None), "pipeline_parallel_size", 1) > 1:
        return "with pipeline parallelism the driver rank does not sample"
    if getattr(worker, "rank", 0) == 0 and getattr(worker, "_mixrl_capture", None) is None:
        worker._mixrl_capture = SamplerCapture(runner)
    return None


def start_rpc(worker, buffer_ids: int, profile: bool = False) -> None:
    cap = getattr(worker, "_mixrl_capture", None)
    if cap is not None:
        cap.start(buffer_ids, profile)


def collect_rpc(worker) -> dict | None:
    cap = getattr(worker, "_mixrl_capture", None)
    return cap.collect() if cap is not None else None


@dataclass
class Capture:
    """One completion's pi_old logprobs and kept sets (CSR), from either way of taking them (`rollout.capture`)."""
    inference_logprobs: np.ndarray  # float32 [R]
    kept_ids: np.ndarray | None
    kept_offsets: np.ndarray | None
    truncated: int
    cut: np.ndarray | None = None  # bool [R]: the kept set at this position may be incomplete


def sampler_capture(c: dict) -> Capture:
    """One completion's rows as `rollout.vllm_capture.assemble` returns them."""
    return Capture(c["inference_logprobs"], c["kept_ids"], c["kept_offsets"],
                    int(c["cut"].sum()) if c["cut"] is not None else 0, c["cut"])


def flat_to_capture(flat, num_tokens: int, want_mask: bool) -> Capture:
    """vLLM FlatLogprobs of one completion -> sampled logprobs + kept sets (CSR) + number of maybe-cut positions.

    Layout per position (vLLM's sampler): entry 0 is the sampled token, entries 1..K the top-K in descending order
    (the sampled token may appear again among them). -inf marks ids outside the kept set.
    """
    R = int(num_tokens)
    vals = np.asarray(flat.logprobs, dtype=np.float32)
    toks = np.asarray(flat.token_ids, dtype=np.int32)
    if R == 0:
        empty = np.zeros(0, dtype=np.float32)
        return Capture(empty, np.zeros(0, np.int32) if want_mask else None,
                        np.zeros(1, np.int64) if want_mask else None, 0)
    starts = np.asarray(flat.start_indices[:R], dtype=np.int64)
    ends = np.asarray(flat.end_indices[:R], dtype=np.int64)
    width = ends - starts
    W = int(width[0])
    if W >= 1 and (width == W).all() and len(vals) >= R * W and starts[0] == 0:
        v2, t2 = vals[: R * W].reshape(R, W), toks[: R * W].reshape(R, W)
    else:  # ragged (should not happen with a fixed K): pad to the widest position with -inf
        W = int(width.max())
        col = np.arange(W)[None, :]
        idx = np.minimum(starts[:, None] + col, len(vals) - 1)
        valid = col < width[:, None]
        v2 = np.where(valid, vals[idx], -np.inf).astype(np.float32)
        t2 = np.where(valid, toks[idx], 0).astype(np.int32)
    sampled = v2[:, 0].copy()
    if not want_mask or W < 2:
        return Capture(sampled, None, None, 0)
    top, top_ids = v2[:, 1:], t2[:, 1:]
    finite = np.isfinite(top)
    counts = finite.sum(axis=1)
    offsets = np.zeros(R + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    cut = finite[:, -1]
    return Capture(sampled, top_ids[finite].astype(np.int32, copy=False), offsets, int(cut.sum()), cut)
