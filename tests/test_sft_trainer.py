"""PolicyTrainer on SFT rows in this process (one DeepSpeed rank over gloo): the host work around its step. The
allocator's cache stays between SFT steps (no rollout engine shares the GPU); the coalesced reduction updates as the
per-micro-batch one; a fused AdamW reaches torch."""

import copy

import pytest
import torch

from launch.config import compose
from rl.batching import minibatch_norm
from rl.config import resolve_auto
from rl.sft_data import ConversationDataset, load_conversations
from rl.models import load_tokenizer
from test_trainer import _port
from trainer.policy import PolicyTrainer


@pytest.fixture(scope="module")
def sft(tiny_dense_path):
    cfg = compose(["+experiment=sft", f"model.path={tiny_dense_path}", "trainer.device=cpu", "trainer.lr=1e-3",
                   "trainer.micro_batch_tokens=512"])
    resolve_auto(cfg, is_moe=False)
    rows = load_conversations(cfg["algorithm"]["dataset"])[:8]
    ds = ConversationDataset(rows, load_tokenizer(tiny_dense_path), seed=0, max_tokens=1024)
    trajs = [t for t in (ds.sample(i, 0) for i in range(len(rows))) if t is not None]
    return cfg, trajs, tiny_dense_path


def test_an_sft_step_keeps_the_allocators_cache(sft, monkeypatch):
    """Only rollout engines share the trainer's GPU: an SFT step leaves torch's cached memory alone (handing it back
    after every step made the next one cudaMalloc its activations again, 260 calls a step of SmolLM2 on an H100),
    while a GRPO trainer with the same default rollout placement hands it back."""
    import trainer.policy as policy

    cfg, trajs, path = sft
    released = []
    monkeypatch.setattr(policy, "release_cached_memory", lambda *a, **k: released.append(a) or False)
    tr = PolicyTrainer(copy.deepcopy(cfg), path, 0, 1, "127.0.0.1", _port())
    assert not tr.colocated
    tr.train_step([trajs], [minibatch_norm(trajs)])
    assert released == []
    grpo = compose([f"model.path={path}", "trainer.device=cpu"])
    resolve_auto(grpo, is_moe=False)
    assert PolicyTrainer(grpo, path, 0, 1, "127.0.0.1", _port()).colocated


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_coalesced_zero2_steps_update_as_per_micro_batch_reduction(sft, dtype):
    """ZeRO-2 with the reduction coalesced per mini-batch: its two updates of packed micro-batches (cut by the
    longest conversation's length) equal those of the per-micro-batch reduction."""
    cfg, trajs, path = sft
    half = len(trajs) // 2
    minibatches = [trajs[:half], trajs[half:]]
    norms = [minibatch_norm(mb) for mb in minibatches]
    cfg = copy.deepcopy(cfg)
    cfg["model"]["dtype"] = dtype
    cfg["trainer"].update(mini_batches=2, micro_batch_tokens=max(t.num_tokens for t in trajs))
    states, sums = [], []
    for coalesce in (True, False):
        cfg["trainer"]["coalesce_grad_reduction"] = coalesce
        tr = PolicyTrainer(copy.deepcopy(cfg), path, 0, 1, "127.0.0.1", _port())
        assert tr.coalesce is coalesce
        sums.append(tr.train_step(minibatches, norms))
        states.append(tr.full_state_dict())
    # a mini-batch of several micro-batches: their gradients add up on the parameters before the one reduction
    assert sums[0]["optimizer_steps"] == 2 and sums[0]["micro_batches"] == sums[1]["micro_batches"] > 2
    assert sums[0]["loss/sft"] == pytest.approx(sums[1]["loss/sft"], rel=1e-5)
    # the same gradients added up in the same order (bit-identical on DeepSpeed 0.19.8, bf16 too)
    assert sums[0]["grad_norm"] == pytest.approx(sums[1]["grad_norm"], rel=1e-5)
    for k in states[1]:
        torch.testing.assert_close(states[0][k].float(), states[1][k].float(), rtol=0, atol=1e-6)


def test_fused_adam_goes_through_deepspeed_to_torch_with_the_same_update(sft):
    """trainer.fused_adam: DeepSpeed builds torch's AdamW with fused=True (one kernel per step over ZeRO's flat
    float32 partition); its update equals the foreach one up to float rounding. Off by default."""
    from trainer.policy import deepspeed_config

    cfg, trajs, path = sft
    assert "fused" not in deepspeed_config(cfg["trainer"], "float32", 1, 1, 8)["optimizer"]["params"]
    states = []
    for fused in (False, True):
        c = copy.deepcopy(cfg)
        c["trainer"]["fused_adam"] = fused
        tr = PolicyTrainer(c, path, 0, 1, "127.0.0.1", _port())
        assert bool(tr.engine.optimizer.optimizer.defaults["fused"]) is fused
        tr.train_step([trajs], [minibatch_norm(trajs)])
        states.append(tr.full_state_dict())
    for k in states[0]:
        torch.testing.assert_close(states[1][k], states[0][k], rtol=0, atol=1e-6)


def test_an_sft_step_issues_the_plain_steps_ops_plus_little(tiny_dense_path):
    """benchmarks/sft_op_count.py on the embedded model: ours' forward and backward issue the ops of a plain PyTorch
    step on the same micro-batches (the same model code), and what ours adds per micro-batch stays small: its metric
    sums ~3 ops (they are summed once, at the step's end) and its loss head (logprob head + SFT loss, forward and
    backward) within ~25 ops of the LM head + cross-entropy."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import sft_op_count as bench

    trajs = bench.conversations(6, 2048)
    cfg = bench.build_cfg(tiny_dense_path, 6, 512, "float32", [])
    try:
        ours, tr = bench.ours_step(cfg, tiny_dense_path, trajs, _port())
        plan = tr._auto_micro_batches([trajs], "packed")
        ref, _ = bench.reference_step(tiny_dense_path, plan, int(sum(t.loss_mask_or_ones().sum() for t in trajs)),
                                      cfg, "float32")
        ours(), ref()
        a, b = bench.profile_step(ours)["phases"], bench.profile_step(ref)["phases"]
    finally:
        bench.unpatch()  # the trainer's code as it was, for the other tests
    n = len(plan[0])
    assert n >= 2
    assert 0 <= a["forward"] - b["forward"] <= n  # the gather of the scored positions
    assert 0 <= a["backward"] - b["backward"] <= 15 * n
    assert a["metrics"] <= 4 * n and a["loss head"] - b["loss head"] <= 25 * n
