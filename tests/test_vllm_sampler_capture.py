"""CPU checks of `rollout.vllm_capture` (rollout.capture=sampler) without vLLM: the sampler wrapper records rows
from stand-ins for vLLM 0.26's two GPU model runners (V1: used for MoE / routed experts; V2: the default for dense
models; only the attributes the hook reads), driven through one schedule with chunked prefill, requests joining
and leaving, an extra row past a finished request (async scheduling) and a preemption whose re-prefill samples a
throw-away row and then re-samples a position. `assemble` must give every completion exactly its tokens'
logprobs and kept sets. The real runners are exercised on the GPU (tests/test_vllm_gpu.py,
benchmarks/rollout_capture.py)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import rollout.vllm_capture as vc
from rollout.sampling import process_logits

V, TOP_K, TOP_P = 50, 8, 0.9


class Runner:
    """V1 runner: `sample(logits, sampling_metadata)` -> (sampled, processed logprobs); the batch is described by
    `input_batch.req_ids`, `optimistic_seq_lens_cpu` and `discard_request_mask`. `sample` is a real top-k/top-p
    sampler (rollout.sampling)."""

    def __init__(self, top_k=TOP_K):
        self.top_k = top_k
        self.sampler = SimpleNamespace(sample=self._sample)
        self.input_batch = SimpleNamespace(req_ids=[])
        self.discard_request_mask = SimpleNamespace(np=np.zeros(16, bool))
        self.optimistic_seq_lens_cpu = torch.zeros(16, dtype=torch.int32)
        self.speculative_config = None

    def _sample(self, logits, sampling_metadata, logprobs_mode_override=None):
        processed = process_logits(logits, temperature=1.0, top_k=self.top_k, top_p=TOP_P)
        return torch.multinomial(processed.exp(), 1).squeeze(1), processed

    def step(self, rows, logits):
        n = len(rows)
        self.input_batch.req_ids = [r[0] for r in rows] + [None]  # vLLM's list can be longer than the batch
        self.discard_request_mask.np[:n] = [r[2] for r in rows]
        self.optimistic_seq_lens_cpu[:n] = torch.tensor([r[1] for r in rows])
        sampled, processed = self.sampler.sample(logits, None)
        return sampled, processed


class RunnerV2:
    """V2 runner: `sample(logits, expanded_idx_mapping, idx_mapping_np, pos, ...)` -> (sampled, processed LOGITS,
    -inf outside the kept set; any offset per row); rows map to request slots (`req_states`), the new token's
    index is pos + 1, and rows whose index is below the request's prefill_len are thrown away by vLLM."""

    def __init__(self, top_k=TOP_K):
        self.top_k = top_k
        self.sampler = SimpleNamespace(sample=self._sample, sampling_states=object(), use_flashinfer=True)
        self.req_states = SimpleNamespace(index_to_req_id={}, prefill_len=SimpleNamespace(np=np.zeros(16, np.int32)))
        self.speculative_config = None
        self.slots: dict[str, int] = {}

    def _sample(self, logits, expanded_idx_mapping, idx_mapping_np, pos, input_ids, expanded_local_pos,
                return_logprobs=False):
        processed = process_logits(logits, temperature=1.0, top_k=self.top_k, top_p=TOP_P)
        sampled = torch.multinomial(processed.exp(), 1).squeeze(1)
        return sampled, (processed + 3.7).to(torch.bfloat16).float()  # logits, not logprobs

    def step(self, rows, logits):
        for rid, _, _, prefill in rows:
            slot = self.slots.setdefault(rid, len(self.slots) + 3)
            self.req_states.index_to_req_id[slot] = rid
            self.req_states.prefill_len.np[slot] = prefill
        idx = np.array([self.slots[r[0]] for r in rows])
        pos = torch.tensor([r[1] - 1 for r in rows])
        sampled, logits_out = self.sampler.sample(logits, torch.from_numpy(idx), idx, pos, None, None)
        return sampled, logits_out.log_softmax(-1)


def _run_schedule(runner, gen, steps):
    """steps: list of [(req_id, seq_index, discard, prefill_len)] rows. Returns the truth per (request, index)."""
    truth = {}  # (req, index) -> (token, logprob, kept set), the last real sample wins
    for rows in steps:
        logits = torch.randn(len(rows), V, generator=gen, dtype=torch.float64).float() * 3
        sampled, processed = runner.step(rows, logits)
        for i, (rid, index, discard, _) in enumerate(rows):
            if not discard:
                tok = int(sampled[i])
                kept = set(torch.isfinite(processed[i]).nonzero().squeeze(1).tolist())
                truth[(rid, index)] = (tok, float(processed[i, tok]), kept)
    return truth


def _install(runner):
    worker = SimpleNamespace(model_runner=runner, rank=0)
    assert vc.install_rpc(worker) is None
    return worker


SCHEDULE = [
    # step 0: "0_7-aaaaaaaa" (prompt 5) prefilled in two chunks: the first chunk's row is thrown away
    [("0_7-aaaaaaaa", 3, True, 5), ("1_7-bbbbbbbb", 5, False, 5)],
    [("0_7-aaaaaaaa", 5, False, 5), ("1_7-bbbbbbbb", 6, False, 5), ("8-cccccccc", 2, False, 2)],
    [("0_7-aaaaaaaa", 6, False, 5), ("1_7-bbbbbbbb", 7, False, 5), ("8-cccccccc", 3, False, 2)],
    # "1_7" finished at index 7 (3 tokens); async scheduling still samples index 8 for it
    [("1_7-bbbbbbbb", 8, False, 5), ("8-cccccccc", 4, False, 2), ("0_7-aaaaaaaa", 7, False, 5)],
    # "8" was preempted after index 4 was sampled but before it was kept: re-prefilled (prompt + 2 outputs) in
    # two chunks, whose first row (index 3, which already has its real row) is thrown away; index 4 sampled again
    [("8-cccccccc", 3, True, 4), ("0_7-aaaaaaaa", 8, False, 5)],
    [("8-cccccccc", 4, False, 4)],
    [("8-cccccccc", 5, False, 4)],
]
# what vLLM outputs: key (from the external id), prompt length, number of output tokens
OUTPUTS = [("0_7", 5, 4), ("1_7", 5, 3), ("8", 2, 4)]


def _completions(truth, internal):
    comps = []
    for key, P, R in OUTPUTS:
        comps.append((key, P, np.array([truth[(internal[key], P + t)][0] for t in range(R)], dtype=np.int64)))
    return comps


@pytest.mark.parametrize("runner_cls", [Runner, RunnerV2])
@pytest.mark.parametrize("flush_every", [1, 2, 64])
def test_sampler_capture_gives_each_completion_its_rows(monkeypatch, flush_every, runner_cls):
    monkeypatch.setattr(vc, "FLUSH_EVERY", flush_every)
    runner = runner_cls()
    worker = _install(runner)
    vc.start_rpc(worker, 10_000)
    truth = _run_schedule(runner, torch.Generator().manual_seed(0), SCHEDULE)
    rows = vc.collect_rpc(worker)
    assert not worker._mixrl_capture.active
    # every sampler call was recorded; its CPU time is reported apart from the flushes'
    assert rows["steps"] == len(SCHEDULE) and rows["record_seconds"] > 0 and "reduce_gpu_seconds" not in rows
    internal = {vc.request_key(r): r for r in rows["req_ids"]}
    assert set(internal) == {"0_7", "1_7", "8"}
    comps = _completions(truth, internal)
    out = vc.assemble(rows, comps)
    for (key, P, toks), got in zip(comps, out):
        R = len(toks)
        assert len(got["inference_logprobs"]) == R and len(got["kept_offsets"]) == R + 1
        for t in range(R):
            tok, lp, kept = truth[(internal[key], P + t)]
            assert got["inference_logprobs"][t] == pytest.approx(lp, abs=1e-5)
            ids = got["kept_ids"][got["kept_offsets"][t] : got["kept_offsets"][t + 1]]
            assert ids.tolist() == sorted(kept) and tok in kept  # whole, in id order
        assert not got["cut"].any()


@pytest.mark.parametrize("runner_cls", [Runner, RunnerV2])
def test_logprob_only_mode(runner_cls):
    """A buffer of 0 ids (no truncation to replay): logprobs only."""
    runner = runner_cls(top_k=0)
    worker = _install(runner)
    vc.start_rpc(worker, 0)
    truth = _run_schedule(runner, torch.Generator().manual_seed(2), SCHEDULE)
    rows = vc.collect_rpc(worker)
    assert rows["flat"] is None
    internal = {vc.request_key(r): r for r in rows["req_ids"]}
    comps = _completions(truth, internal)
    for (key, P, toks), got in zip(comps, vc.assemble(rows, comps)):
        assert got["kept_ids"] is None
        want = [truth[(internal[key], P + t)][1] for t in range(len(toks))]
        np.testing.assert_allclose(got["inference_logprobs"], want, atol=1e-5)


@pytest.mark.parametrize("runner_cls", [Runner, RunnerV2])
@pytest.mark.parametrize("flush_every", [1, 64])
def test_large_kept_sets_are_whole_or_flagged(monkeypatch, runner_cls, flush_every):
    """Top-p alone over 50 ids keeps sets of up to dozens of ids: with room every set is whole; a buffer too small
    for them all flags exactly the positions it could not hold (their set is the sampled id alone)."""
    monkeypatch.setattr(vc, "FLUSH_EVERY", flush_every)
    runner = runner_cls(top_k=0)
    worker = _install(runner)
    vc.start_rpc(worker, 10_000)
    truth = _run_schedule(runner, torch.Generator().manual_seed(1), SCHEDULE)
    rows = vc.collect_rpc(worker)
    internal = {vc.request_key(r): r for r in rows["req_ids"]}
    comps = _completions(truth, internal)
    sizes = []
    for (key, P, toks), got in zip(comps, vc.assemble(rows, comps)):
        assert not got["cut"].any()
        for t in range(len(toks)):
            kept = truth[(internal[key], P + t)][2]
            ids = got["kept_ids"][got["kept_offsets"][t] : got["kept_offsets"][t + 1]]
            assert ids.tolist() == sorted(kept)
            sizes.append(len(kept))
    assert max(sizes) > 8 and min(sizes) < max(sizes)
    vc.start_rpc(worker, 12)  # room for 12 ids per flush window: some sets cannot be stored
    truth = _run_schedule(runner, torch.Generator().manual_seed(1), SCHEDULE)
    rows = vc.collect_rpc(worker)
    internal = {vc.request_key(r): r for r in rows["req_ids"]}
    comps = _completions(truth, internal)
    flagged = whole = 0
    for (key, P, toks), got in zip(comps, vc.assemble(rows, comps)):
        for t in range(len(toks)):
            tok, _, kept = truth[(internal[key], P + t)]
            ids = got["kept_ids"][got["kept_offsets"][t] : got["kept_offsets"][t + 1]].tolist()
            if got["cut"][t]:
                assert ids == [tok]  # out of the loss; the sampled id alone keeps its logprob finite
                flagged += 1
            else:
                assert ids == sorted(kept)
                whole += 1
    assert flagged > 0 and whole > 0


def test_flush_interval_shrinks_when_sets_are_large(monkeypatch):
    """Sets large enough to fill half the buffer within FLUSH_EVERY steps make the capture flush sooner, so no
    set is lost that a timely flush would have kept: the first step is flushed alone and measures them (with the
    first window FLUSH_EVERY steps long, its later sets would be cut)."""
    runner = Runner(top_k=0)
    worker = _install(runner)
    vc.start_rpc(worker, 200)  # a few steps' worth of ~25-id sets x 3 rows
    cap = worker._mixrl_capture
    gen = torch.Generator().manual_seed(7)
    steps = [[("0_7-aaaaaaaa", 5 + i, False, 5), ("1_7-bbbbbbbb", 5 + i, False, 5), ("8-cccccccc", 2 + i, False, 2)]
             for i in range(40)]
    monkeypatch.setattr(vc, "FLUSH_EVERY", 64)
    truth = _run_schedule(runner, gen, steps[:1])
    assert not cap._gpu and cap.ids_per_row > 0  # flushed after its first step, which measured the sets
    truth.update(_run_schedule(runner, gen, steps[1:]))
    rows = vc.collect_rpc(worker)
    internal = {vc.request_key(r): r for r in rows["req_ids"]}
    comps = [(k, P, np.array([truth[(internal[k], P + t)][0] for t in range(40)], np.int64))
             for k, P in (("0_7", 5), ("1_7", 5), ("8", 2))]
    assert not any(got["cut"].any() for got in vc.assemble(rows, comps))


def test_assemble_refuses_rows_out_of_step():
    runner = Runner()
    worker = _install(runner)
    vc.start_rpc(worker, 10_000)
    truth = _run_schedule(runner, torch.Generator().manual_seed(3), SCHEDULE)
    rows = vc.collect_rpc(worker)
    internal = {vc.request_key(r): r for r in rows["req_ids"]}
    comps = _completions(truth, internal)
    bad_token = [(k, P, np.where(np.arange(len(t)) == 1, (t + 1) % V, t)) for k, P, t in comps]
    with pytest.raises(RuntimeError, match="do not match"):
        vc.assemble(rows, bad_token)
    too_long = [(k, P, np.concatenate([t, [0]])) for k, P, t in comps]
    with pytest.raises(RuntimeError, match="do not match"):
        vc.assemble(rows, too_long)
    with pytest.raises(RuntimeError, match="no rows"):
        vc.assemble(rows, [("9", 3, np.array([1]))])
    # an empty completion needs no rows
    empty = vc.assemble(rows, [("9", 3, np.zeros(0, np.int64))])[0]
    assert len(empty["inference_logprobs"]) == 0 and list(empty["kept_offsets"]) == [0]


def test_capture_is_idle_until_started_and_ids_parse():
    runner = Runner()
    worker = _install(runner)
    _run_schedule(runner, torch.Generator().manual_seed(4), SCHEDULE[:2])  # e.g. scoring calls: not recorded
    vc.start_rpc(worker, 1000)
    rows = vc.collect_rpc(worker)
    assert rows["req_ids"] == [] and len(rows["tok"]) == 0
    assert vc.request_key("3_12-0f1e2d3c") == "3_12" and vc.request_key("12-0f1e2d3c") == "12"
    assert vc.request_key("12") == "12"  # VLLM_DISABLE_REQUEST_ID_RANDOMIZATION
    assert vc.completion_key("12", 3, n=4) == "3_12" and vc.completion_key("12", 0, n=1) == "12"
    # a vLLM without the attributes the hook reads is refused with the reason (the engine then uses logprobs)
    del runner.optimistic_seq_lens_cpu
    assert "optimistic_seq_lens_cpu" in vc.install_rpc(SimpleNamespace(model_runner=runner, rank=0))
    v2 = RunnerV2()
    assert vc.install_rpc(SimpleNamespace(model_runner=v2, rank=0)) is None
    assert v2.sampler.use_flashinfer is False  # FlashInfer's sampler never materialises the masked logits
    del v2.req_states.prefill_len
    assert "prefill_len" in vc.install_rpc(SimpleNamespace(model_runner=v2, rank=0))
    pp = Runner()
    pp.parallel_config = SimpleNamespace(pipeline_parallel_size=2)
    assert "pipeline" in vc.install_rpc(SimpleNamespace(model_runner=pp, rank=0))
    # tensor-parallel ranks other than the driver do not record
    assert vc.install_rpc(SimpleNamespace(model_runner=Runner(), rank=1)) is None
    assert vc.collect_rpc(SimpleNamespace(model_runner=Runner(), rank=1)) is None


def test_a_failing_record_never_breaks_sampling():
    """A capture that cannot record (here: vLLM's V2 batch is not one logit per request) stops recording and
    reports why at collect; vLLM's own sampling goes on untouched."""
    runner = RunnerV2()
    worker = _install(runner)
    vc.start_rpc(worker, 1000)
    logits = torch.randn(3, V)
    sampled, _ = runner.sampler.sample(logits, None, np.array([3, 4]), torch.tensor([1, 2, 3]), None, None)
    assert sampled.shape == (3,)
    assert "RuntimeError" in vc.collect_rpc(worker)["error"]
    vc.start_rpc(worker, 1000)  # the next generate starts clean
    _run_schedule(runner, torch.Generator().manual_seed(5), SCHEDULE[:1])
    assert "error" not in vc.collect_rpc(worker)


@pytest.mark.parametrize("logits", [False, True])
def test_reduce_rows_matches_a_direct_computation(logits):
    """rl.kept_set.reduce_rows (the torch path; the Triton kernel is compared with it on the GPU)."""
    from rl.kept_set import LOST, KeptIdBuffer, reduce_rows_torch

    gen = torch.Generator().manual_seed(6)
    x = torch.randn(6, 40, generator=gen, dtype=torch.float64)
    keep_counts = [1, 3, 5, 6, 7, 40]
    for r, k in enumerate(keep_counts):
        x[r, torch.randperm(40, generator=gen)[k:]] = float("-inf")
    processed = x + 2.5 if logits else torch.log_softmax(x, dim=-1)
    sampled = torch.tensor([int(torch.isfinite(x[r]).nonzero()[0]) for r in range(6)])
    buf = KeptIdBuffer(100, "cpu")
    buf.counter += 3  # rows reserve after what is already there
    lp, total, start = reduce_rows_torch(processed, sampled, logits, buf)
    want = torch.log_softmax(x, dim=-1)[torch.arange(6), sampled]
    torch.testing.assert_close(lp.double(), want, atol=1e-5, rtol=0)
    assert total.tolist() == keep_counts
    assert start.tolist() == [3, 4, 7, 12, 18, 25]  # back to back, in row order
    for r in range(6):
        kept = torch.isfinite(x[r]).nonzero().squeeze(1).tolist()
        assert buf.ids[start[r] : start[r] + total[r]].tolist() == kept  # the whole set, in id order
    assert buf.drain()[1] == 3 + sum(keep_counts)
    small = KeptIdBuffer(20, "cpu")  # room for the first four rows only
    _, total, start = reduce_rows_torch(processed, sampled, logits, small)
    assert start.tolist() == [0, 1, 4, 9, LOST, LOST] and small.drain()[1] == sum(keep_counts)
    lp_only, none_total, none_start = reduce_rows_torch(processed, sampled, logits)
    assert none_total is None and none_start is None and torch.equal(lp_only, lp)


@pytest.mark.parametrize("vocab, dtype", [(49152, np.uint16), (65536, np.uint16), (151936, np.int32)])
def test_kept_ids_leave_the_gpu_in_16_bits_when_the_vocabulary_fits(vocab, dtype):
    """Ids of a vocabulary of at most 2**16 are drained as uint16 (half the bytes to copy, send and gather), ids at
    and past 2**15 included; the sample keeps them in that dtype and `collate` gives the trainer int32 ids."""
    from rl.trajectory import Trajectory, collate
    from rl.kept_set import KeptIdBuffer, reduce_rows_torch
    from rollout.vllm_capture import assemble, merge_chunks

    x = torch.full((3, vocab), float("-inf"))
    sets = [[0, 1], [32767, 32768, vocab - 1], [vocab - 2]]
    for r, ids in enumerate(sets):
        x[r, ids] = torch.arange(len(ids), dtype=torch.float32)
    sampled = torch.tensor([1, 32768, vocab - 2])
    buf = KeptIdBuffer(100, "cpu", vocab_size=vocab)
    lp, total, start = reduce_rows_torch(x, sampled, True, buf)
    flat, asked = buf.drain()
    assert flat.dtype == dtype and asked == 6
    assert [flat[s : s + n].tolist() for s, n in zip(start.tolist(), total.tolist())] == sets
    chunk = dict(tok=sampled.numpy().astype(np.int32), lp=lp.numpy(), total=total.numpy(), start=start.numpy(),
                 flat=flat, req=["a"] * 3, keep=np.ones(3, bool), index=np.array([5, 6, 7]))
    (out,) = assemble(merge_chunks([chunk], with_ids=True), [("a", 5, sampled.numpy())])
    assert out["kept_ids"].dtype == dtype and out["kept_ids"].tolist() == [i for s in sets for i in s]
    assert out["kept_offsets"].tolist() == [0, 2, 5, 6] and not out["cut"].any()
    mk = lambda uid, ids, offsets: Trajectory(  # noqa: E731
        uid=uid, group_id="g", domain="math", prompt_ids=np.arange(5), response_ids=sampled.numpy(),
        inference_logprobs=np.zeros(3, np.float32), kept_ids=ids, kept_offsets=offsets)
    other = np.array([3, vocab - 1, 7], np.int32)  # an int32 sample (the transformers engine's) in the same batch
    batch = collate([mk("a", out["kept_ids"], out["kept_offsets"]), mk("b", other, np.arange(4))], pad_id=0)
    assert batch.kept_ids.dtype == torch.int32
    assert batch.kept_ids.tolist() == [i for s in sets for i in s] + other.tolist()


@pytest.mark.parametrize("slices_above", [0, 10**9])  # one slice per position | one index over every id
def test_gather_kept_ids_either_way(monkeypatch, slices_above):
    """Both ways of gathering a completion's kept ids give the same ids (in the buffer's uint16, or int32), a cut
    position one placeholder, and rows that run past the drained buffer raise instead of coming back short."""
    monkeypatch.setattr(vc, "SLICES_ABOVE", slices_above)
    flat = np.array([5, 6, 7, 40000, 9, 1], np.uint16)
    starts, counts = np.array([3, vc.LOST, 0, 5]), np.array([2, 1, 3, 1])
    offsets = np.concatenate([[0], np.cumsum(counts)])
    ids = vc.gather_kept_ids(flat, starts, counts, offsets)
    assert ids.dtype == np.uint16 and ids.tolist()[:2] == [40000, 9] and ids.tolist()[3:] == [5, 6, 7, 1]
    wide = vc.gather_kept_ids(flat.astype(np.int32), starts, counts, offsets)
    assert wide.dtype == np.int32 and wide.tolist() == ids.tolist()
    with pytest.raises((RuntimeError, IndexError)):
        vc.gather_kept_ids(flat, np.array([4]), np.array([3]), np.array([0, 3]))


# -- samples reported as they finish (VLLMEngine._report_finished_samples) ------------------------------------
class StandInLLM:
    """What the report needs of vLLM's `LLM`: `generate` runs the loop LLM._run_engine runs (step until nothing is
    unfinished, keep the finished outputs), over `llm_engine.step`, whose outputs here finish on a schedule."""

    class Engine:  # `step` a method of the class, as on vLLM's LLMEngine: the report must leave it that way
        def __init__(self, llm):
            self.llm = llm

        def has_unfinished_requests(self):
            return bool(self.llm._left)

        def step(self):
            return self.llm._step()

    def __init__(self, schedule):
        self.schedule = schedule  # per step: [(prompt ids, [(token ids, finish reason)] of its n samples)]
        self.llm_engine = StandInLLM.Engine(self)
        self._left: list = []

    def _step(self):
        done = self._left.pop(0)
        return [SimpleNamespace(prompt_token_ids=list(p), finished=True,
                                outputs=[SimpleNamespace(index=j, token_ids=ids, finish_reason=f)
                                         for j, (ids, f) in reversed(list(enumerate(comps)))])  # any order
                for p, comps in done]

    def generate(self):
        self._left = list(self.schedule)
        out = []
        while self.llm_engine.has_unfinished_requests():
            out.extend(self.llm_engine.step())
        return out


def _report(llm, prompts, n, callback):
    from rollout.vllm_engine import VLLMEngine

    engine = SimpleNamespace(llm=llm)
    with VLLMEngine._report_finished_samples(engine, prompts, n, callback):
        return llm.generate()


def test_one_request_per_sample_draws_what_n_per_request_draws():
    """vLLM seeds the j-th of a request's n samples seed + j; the requests of one sample each get those seeds (prompt i's
    at i*n..i*n+n-1), and unseeded ones share one n=1 SamplingParams."""
    from rollout.vllm_engine import _one_request_per_sample, _per_prompt

    class SP:  # what the split needs of vllm.SamplingParams
        def __init__(self, n, seed):
            self.n, self.seed = n, seed

        def clone(self):
            return SP(self.n, self.seed)

    seeded = _one_request_per_sample(_per_prompt(SP(3, 100), 2), 2, 3)
    assert [(p.n, p.seed) for p in seeded] == [(1, 100), (1, 101), (1, 102),
                                               (1, 100 + 1_000_003), (1, 101 + 1_000_003), (1, 102 + 1_000_003)]
    one = _one_request_per_sample(SP(3, 100), 1, 3)  # a single prompt keeps the call's seed
    assert [(p.n, p.seed) for p in one] == [(1, 100), (1, 101), (1, 102)]
    base = SP(4, None)
    shared = _one_request_per_sample(_per_prompt(base, 5), 5, 4)
    assert not isinstance(shared, list) and (shared.n, shared.seed) == (1, None) and base.n == 4


def test_samples_of_one_sample_requests_are_reported_as_each_ends():
    """Requests of one sample each (prompt i repeated n times): each sample goes out at the step its request ends,
    under its prompt's index; the last step's go out with the result only."""
    a, b = [7, 8], [9]
    schedule = [[(a, [([1], "stop")])], [(b, [([2, 3], "stop")]), (a, [([4], "length")])], [(b, [([5], "stop")])],
                [(a, [([6], "stop")]), (b, [([7], "stop")])]]
    llm, seen = StandInLLM(schedule), []
    outputs = _report(llm, [a, b], 1, lambda done: seen.append(done))
    assert len(outputs) == 6
    assert [[(i, [g.response_ids.tolist() for g in gens]) for i, gens in done] for done in seen] == [
        [(0, [[1]])], [(1, [[2, 3]]), (0, [[4]])], [(1, [[5]])]]
    assert seen[1][1][1][0].finish_reason == "length"


def test_finished_groups_are_reported_during_generation_once_and_whole():
    a, b, c, d = [1, 2], [3], [4, 5, 6], [1, 2]  # d repeats a: neither can be told apart by its prompt
    def comps(k):
        return [([k, 10 + j], "stop" if j else "length") for j in range(2)]

    schedule = [[(b, comps(1))], [(a, comps(2)), (c, comps(3))], [(d, comps(4))]]
    llm, seen = StandInLLM(schedule), []
    outputs = _report(llm, [a, b, c, d], 2, lambda done: seen.append(done))
    assert len(outputs) == 4 and "step" not in vars(llm.llm_engine)  # the class's method again
    # step 1: b (prompt 1); step 2: c (prompt 2; a is ambiguous); step 3 is the last: returned at once, not reported
    assert [[i for i, _ in done] for done in seen] == [[1], [2]]
    _, gens = seen[1][0]
    assert [g.response_ids.tolist() for g in gens] == [[3, 10], [3, 11]]  # in sample order
    assert [g.finish_reason for g in gens] == ["length", "stop"] and gens[0].response_ids.dtype == np.int32


def test_an_error_in_the_report_stops_the_reports_not_the_generation():
    schedule = [[([k], [([k], "stop")])] for k in range(4)]
    calls = []

    def boom(done):
        calls.append(done)
        raise ValueError("scorer gone")

    llm = StandInLLM(schedule)
    assert len(_report(llm, [[k] for k in range(4)], 1, boom)) == 4
    assert len(calls) == 1 and "step" not in vars(llm.llm_engine)  # reported once, then off; step restored


def test_a_batch_that_grows_after_the_first_step_loses_no_set(monkeypatch):
    """The first step measures one request's set; two more requests join at the next step (a batch filling up).
    The window is bounded by its rows at the measured ids a row, so the sets of the larger steps still fit the
    buffer (a window sized in steps from the first step alone would overflow it and cut sets)."""
    monkeypatch.setattr(vc, "FLUSH_EVERY", 64)
    runner = Runner(top_k=0)
    worker = _install(runner)
    vc.start_rpc(worker, 200)
    gen = torch.Generator().manual_seed(7)
    steps = [[("0_7-aaaaaaaa", 5, False, 5)]]
    steps += [[("0_7-aaaaaaaa", 5 + i, False, 5), ("1_7-bbbbbbbb", 4 + i, False, 5), ("8-cccccccc", 1 + i, False, 2)]
              for i in range(1, 30)]
    _assert_every_set_whole(worker, _run_schedule(runner, gen, steps), (("0_7", 5, 30), ("1_7", 5, 29), ("8", 2, 29)))


def _assert_every_set_whole(worker, truth, completions) -> None:
    """No position cut, and each one's recorded kept set is the sampler's: completions are (key, prompt length,
    tokens)."""
    rows = vc.collect_rpc(worker)
    internal = {vc.request_key(r): r for r in rows["req_ids"]}
    comps = [(k, P, np.array([truth[(internal[k], P + t)][0] for t in range(n)], np.int64))
             for k, P, n in completions]
    got = vc.assemble(rows, comps)
    assert not any(g["cut"].any() for g in got)
    for (key, P, toks), g in zip(comps, got):
        for t in range(len(toks)):
            ids = g["kept_ids"][g["kept_offsets"][t] : g["kept_offsets"][t + 1]]
            assert ids.tolist() == sorted(truth[(internal[key], P + t)][2])


def test_a_batch_that_keeps_growing_loses_no_set(monkeypatch):
    """Requests join a few at a time over many steps (prefill held back by its token budget): the rows of the open
    window, counted as they come, trigger the flush before the buffer fills, however fast the batch grows. (Windows
    that only doubled in steps from one flush to the next overflowed this 160-id buffer.)"""
    monkeypatch.setattr(vc, "FLUSH_EVERY", 64)
    runner = Runner(top_k=0)
    worker = _install(runner)
    vc.start_rpc(worker, 160)
    gen = torch.Generator().manual_seed(3)
    keys = [f"{i}-{i:08x}" for i in range(12)]
    steps = [[(keys[r], 2 + s - r, False, 2) for r in range(min(s + 1, 12))] for s in range(16)]  # +1 request a step
    _assert_every_set_whole(worker, _run_schedule(runner, gen, steps), [(str(i), 2, 16 - i) for i in range(12)])
