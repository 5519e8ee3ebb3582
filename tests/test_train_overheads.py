"""What keeps the train phase from waiting on the CPU: metric sums stay on the device until the step ends, host ->
GPU copies do not block, and the allocator's cache is handed back only when a colocated vLLM needs the room."""

import importlib.util

import numpy as np
import pytest
import torch

from rl.config import engine_memory_share, engines_per_gpu
from rl.losses import grpo_loss
from rl.metrics import TrainStatSums, forward_sums, trainer_metrics
from rl.trajectory import Trajectory, collate
from trainer import dist
from trainer.forward import ForwardOut
from trainer.objectives import GRPO


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    trajs = []
    for i, (domain, kl) in enumerate([("math", 0.0), ("code", 0.1), ("math", 0.0), ("code", 0.1), ("general", 0.2)]):
        R = int(rng.integers(2, 6))
        t = Trajectory(uid=f"u{i}", group_id=f"g{i}", domain=domain, prompt_ids=[1, 2, 3],
                       response_ids=rng.integers(4, 50, R), inference_logprobs=rng.normal(-1.0, 0.3, R).astype(np.float32),
                       advantage=float(rng.normal()))
        t.kl_coef, t.opsm_delta = kl, 0.05
        t.ref_logprobs = rng.normal(-1.0, 0.3, R).astype(np.float32)
        trajs.append(t)
    batch = collate(trajs, pad_id=0)
    batch.ref_logprobs = torch.tensor(np.concatenate([t.ref_logprobs for t in trajs]))
    logprobs = batch.inference_logprobs + torch.tensor(rng.normal(0, 0.3, len(batch.targets)), dtype=torch.float32)
    _, stats = grpo_loss(logprobs, batch.inference_logprobs, batch.ref_logprobs, batch.seq_index, batch.loss_mask,
                         batch.advantages, batch.kl_coef, batch.opsm_delta, eps_low=0.2, eps_high=0.28,
                         norm_seqs=5, norm_tokens=int(batch.loss_mask.sum()))
    entropy = torch.rand(len(batch.targets))
    full = entropy.clone()
    full[::3] = float("nan")  # the support head computes the full-vocabulary entropy at a subsample only
    # rows without a reference: their KL estimate is not defined (NaN) and must stay out of every sum
    stats["kl_seq"] = torch.where(batch.kl_coef > 0, stats["kl_seq"], torch.full_like(stats["kl_seq"], float("nan")))
    return batch, ForwardOut(logprobs, entropy, full), stats


def _reference_sums(batch, out, stats) -> dict:
    """The sums read one value at a time (what the trainer did before TrainStatSums)."""
    mask, s = batch.loss_mask, {}
    s["tokens"] = float(mask.sum())
    s["loss/pg"], s["loss/kl"], s["clip_tokens"] = map(float, (stats["pg_loss"], stats["kl_loss"], stats["clip_tok_sum"]))
    s["entropy_sum"] = float((out.entropy * mask).sum())
    seen = ~torch.isnan(out.full_entropy)
    s["full_entropy_sum"] = float((out.full_entropy.nan_to_num(0.0) * mask).sum())
    s["full_entropy_tokens"] = float((mask * seen).sum())
    s["mismatch_abs_sum"] = float(((batch.inference_logprobs - out.logprobs).abs() * mask).sum())
    for i, d in enumerate(batch.domains):
        s[f"seqs/{d}"] = s.get(f"seqs/{d}", 0) + 1
        s[f"opsm_masked/{d}"] = s.get(f"opsm_masked/{d}", 0) + float(not bool(stats["opsm_keep"][i]))
        if float(batch.kl_coef[i]) > 0:
            s[f"kl_sum/{d}"] = s.get(f"kl_sum/{d}", 0) + float(stats["kl_seq"][i])
    return s


def test_train_stat_sums_read_nothing_back_until_the_step_ends(monkeypatch):
    """Neither the sums of a micro-batch (the trainer's `forward_sums`, GRPO's) nor add() turn a tensor into a Python
    value (each would wait for the GPU); totals() equals the sums read one value at a time, per domain too, over two
    micro-batches."""
    parts = [_batch(0), _batch(1)]
    sums = TrainStatSums()

    def refuse(*_a, **_k):
        raise AssertionError("a tensor was read back to the host during add()")

    with monkeypatch.context() as m:
        for name in ("item", "tolist", "__float__", "__bool__", "__int__", "cpu", "numpy"):
            m.setattr(torch.Tensor, name, refuse)
        for i, (batch, out, stats) in enumerate(parts):  # Keep Routing's counts: device tensors, then ints
            routing = (torch.tensor(3), torch.tensor(10)) if i == 0 else (2, 5)
            sums.add(forward_sums(batch, out, routing, first_minibatch=i < 2))
            sums.add(GRPO.sums(batch, stats))
    got = sums.totals()
    want: dict = {}
    for i, (batch, out, stats) in enumerate(parts):
        for k, v in _reference_sums(batch, out, stats).items():
            want[k] = want.get(k, 0.0) + v
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
    assert got["routing_mismatch"] == 5 and got["routing_total"] == 15
    assert all(np.isfinite(v) for v in got.values()) and got["full_entropy_tokens"] < got["tokens"]
    assert got["kl_seqs/code"] == 4 and got["kl_seqs/math"] == 0 and got["kl_sum/math"] == 0.0
    m = trainer_metrics([got], ["math", "code", "general"], 1, GRPO.metrics)
    assert m["opsm/masked_frac"] == pytest.approx(sum(want.get(f"opsm_masked/{d}", 0) for d in ("math", "code", "general")) / 10)
    assert m["kl/math"] is None and m["kl/code"] == pytest.approx(want["kl_sum/code"] / 4, rel=1e-5)


class _FakeCuda:
    def __init__(self, free, total):
        self.free, self.total, self.emptied, self.handed = free, total, 0, []

    def mem_get_info(self, device):
        return self.free, self.total

    def empty_cache(self):
        self.emptied += 1

    def hand_back(self, device, missing):
        self.handed.append(missing)


@pytest.mark.parametrize("free_gib, share, missing_gib", [
    (40, 0.3, None),  # 24 GiB + the margin fit already: the cache stays
    (25, 0.3, 1),     # 24 GiB fit but not the 2 GiB margin: 1 GiB goes back
    (10, 0.3, 16),
    (79, None, "all"),  # no known share (the transformers engine): the whole cache, always
])
def test_the_cache_is_handed_back_only_as_far_as_vllm_needs_the_room(monkeypatch, free_gib, share, missing_gib):
    fake = _FakeCuda(free_gib << 30, 80 << 30)
    monkeypatch.setattr(torch.cuda, "mem_get_info", fake.mem_get_info)
    monkeypatch.setattr(torch.cuda, "empty_cache", fake.empty_cache)
    monkeypatch.setattr(dist, "hand_back", fake.hand_back)
    assert dist.release_cached_memory("cuda:0", share) is (missing_gib is not None)
    assert fake.emptied == (missing_gib == "all")
    want = [] if missing_gib in (None, "all") else [int((share * 80 + 2 - free_gib) * 2**30)]
    assert [pytest.approx(x, abs=1) for x in want] == fake.handed
    assert dist.release_cached_memory("cpu", share) is False and fake.emptied == (missing_gib == "all")


def test_the_largest_free_segments_go_back_first():
    assert dist.segments_to_keep([2, 20, 8, 4], 0) == [20, 8, 4, 2]
    assert dist.segments_to_keep([2, 20, 8, 4], 1) == [8, 4, 2]
    assert dist.segments_to_keep([2, 20, 8, 4], 21) == [4, 2]
    assert dist.segments_to_keep([2, 20, 8, 4], 100) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_hand_back_frees_what_is_missing_and_keeps_the_rest_cached():
    torch.cuda.empty_cache()
    mib = 2**20
    blocks = [torch.empty(n * mib, dtype=torch.uint8, device="cuda") for n in (512, 256, 128, 64)]
    del blocks  # four free segments in the cache now
    reserved = torch.cuda.memory_reserved()
    free = torch.cuda.mem_get_info()[0]
    dist.hand_back("cuda", 300 * mib)  # the 512 MiB segment covers it
    assert torch.cuda.mem_get_info()[0] - free >= 300 * mib
    assert reserved - torch.cuda.memory_reserved() == 512 * mib  # the other three stay cached
    torch.cuda.empty_cache()
    # a free segment of another stream cannot be held from this one: it goes back and counts towards what is missing
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        on_side = torch.empty(256 * mib, dtype=torch.uint8, device="cuda")
    blocks = [torch.empty(n * mib, dtype=torch.uint8, device="cuda") for n in (512, 128)]
    del on_side, blocks
    reserved = torch.cuda.memory_reserved()
    dist.hand_back("cuda", 200 * mib)  # the side stream's 256 MiB cover it: the other two stay
    assert reserved - torch.cuda.memory_reserved() == 256 * mib
    torch.cuda.empty_cache()


def test_engine_memory_share_is_vllms_gpu_memory_utilization():
    sleeps = {"enable_sleep_mode": True}
    assert engine_memory_share({"engine": "vllm", "gpu_memory_utilization": 0.3, **sleeps}) == 0.3
    # auto is vLLM only where vLLM is installed (else the transformers engine, whose use is not bounded)
    auto = engine_memory_share({"engine": "auto", "gpu_memory_utilization": 0.4, **sleeps})
    assert auto == (0.4 if importlib.util.find_spec("vllm") else None)
    assert engine_memory_share({"engine": "hf", "gpu_memory_utilization": 0.4, **sleeps}) is None
    # a key the config lacks reads the YAML's default (rl.config.ROLLOUT_DEFAULTS: 0.4, sleep mode on)
    assert engine_memory_share({"engine": "vllm", **sleeps}) == 0.4
    assert engine_memory_share({"engine": "vllm", "gpu_memory_utilization": None, **sleeps}) is None
    # an engine that never sleeps keeps its memory: it needs no room to wake up into, so nothing is handed back
    assert engine_memory_share({"engine": "vllm", "gpu_memory_utilization": 0.3, "enable_sleep_mode": False}) == 0.0
    assert engine_memory_share({"engine": "vllm", "gpu_memory_utilization": 0.3}) == 0.3
    # two instances on the GPU wake up into twice the share of one
    assert engine_memory_share({"engine": "vllm", "gpu_memory_utilization": 0.15, **sleeps}, engines=2) == 0.3


def test_engines_per_gpu_is_workers_per_trainer_rank_when_colocated_and_one_over_the_share_when_split():
    def cfg(workers, ranks, **rollout):
        return {"rollout": {"engine": "vllm", "num_workers": workers, "num_gpus": 0.25, **rollout},
                "trainer": {"num_processes": ranks}}

    assert engines_per_gpu(cfg(2, 1)) == 2
    assert engines_per_gpu(cfg(4, 2)) == 2
    assert engines_per_gpu(cfg(2, 2)) == 1
    # split: 1 / rollout.num_gpus instances on each rollout GPU (what fits whole), at most the workers there are
    assert engines_per_gpu(cfg(4, 1, placement="split", num_gpus=0.5)) == 2
    assert engines_per_gpu(cfg(4, 1, placement="split", num_gpus=0.4)) == 2
    assert engines_per_gpu(cfg(4, 1, placement="split", num_gpus=1 / 3)) == 3
    assert engines_per_gpu(cfg(2, 1, placement="split")) == 2
    assert engines_per_gpu(cfg(2, 1, placement="split", num_gpus=1)) == 1
    assert engines_per_gpu(cfg(2, 1, engine="hf")) == 1
    assert engines_per_gpu(cfg(2, 1, engine="hf", placement="split", num_gpus=0.5)) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_batch_reaches_the_gpu_whole_through_pinned_memory():
    batch, out, stats = _batch()
    want = {k: v.clone() for k, v in vars(batch).items() if isinstance(v, torch.Tensor)}
    gpu = batch.to("cuda")
    torch.cuda.synchronize()
    for k, v in want.items():
        assert getattr(gpu, k).is_cuda and torch.equal(getattr(gpu, k).cpu(), v), k


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    """The aten ops run inside the block, by name."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_a_micro_batch_adds_its_sums_without_arithmetic_and_the_totals_are_the_float64_sums_in_order():
    """TrainStatSums.add keeps the tensors (no cast, no add: ~10 kernel launches a micro-batch fewer on a GPU);
    totals() equals adding them on the device in float64 in the order they came, bit for bit, across dtypes, with a
    key that also has host numbers."""
    g = torch.Generator().manual_seed(0)
    parts = [{"loss": torch.randn((), generator=g) * 1e3, "tokens": torch.tensor(float(7 + i)),
              "count": torch.tensor(3 + i), "exact": torch.randn((), generator=g, dtype=torch.float64),
              "mixed": torch.tensor(0.1 * i) if i % 2 else 2} for i in range(9)]
    sums = TrainStatSums()
    with _Ops() as ops:
        for p in parts:
            sums.add(p)
    assert set(ops.names) <= {"detach", "view", "alias", "_reshape_alias", "reshape"}, ops.names
    got = sums.totals()
    for key in parts[0]:
        device = [p[key].double() for p in parts if isinstance(p[key], torch.Tensor)]
        want = device[0]
        for v in device[1:]:
            want = want + v
        host = sum(p[key] for p in parts if not isinstance(p[key], torch.Tensor))
        assert got[key] == host + float(want), key


def test_without_kept_sets_the_full_vocabulary_sums_are_the_entropy_sums():
    """No kept sets: the head returns one entropy for both (`token_logprobs`), and forward_sums reuses its sums for
    the full-vocabulary ones, the values a separate pass gives, with fewer ops."""
    batch, out, _ = _batch(0)
    entropy = out.entropy
    shared, separate = ForwardOut(out.logprobs, entropy, entropy), ForwardOut(out.logprobs, entropy, entropy.clone())
    with _Ops() as fewer:
        a = forward_sums(batch, shared, (0, 0), first_minibatch=False)
    with _Ops() as more:
        b = forward_sums(batch, separate, (0, 0), first_minibatch=False)
    assert a.keys() == b.keys() and all(float(a[k]) == float(b[k]) for k in a)
    assert a["full_entropy_tokens"] is a["tokens"] and len(fewer.names) < len(more.names)
