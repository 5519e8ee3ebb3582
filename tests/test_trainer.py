"""PolicyTrainer in-process (one DeepSpeed rank over gloo): updates, ZeRO-2 == ZeRO-3, KL, checkpoints."""

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rl.config import resolve_auto
from rl.data import PromptMixture
from rollout.worker import RolloutWorker
from trainer.dist import open_store
from trainer.frozen import FrozenModel
from trainer.policy import PolicyTrainer

ROOT = Path(__file__).resolve().parents[1]


_STORE = []


def _port() -> int:
    """The port of a rendezvous store that lives as long as this process (its first trainer joins through it)."""
    if not _STORE:
        _STORE.append(open_store())
    return _STORE[0].port


@pytest.fixture(scope="module")
def setup(tiny_moe_path):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(
            compose(config_name="train", overrides=["+experiment=smoke_learn", "rollout.top_p=0.9", "trainer.lr=1e-2"]),
            resolve=True,
        )
    resolve_auto(cfg, is_moe=True)
    worker = RolloutWorker(cfg, tiny_moe_path, 0)
    mix = PromptMixture(cfg["domains"], worker.tokenizer, seed=1, max_prompt_tokens=512)
    reqs = mix.next_batch(4)
    for i, r in enumerate(reqs):
        r["group_id"] = f"g{i}"
    trajs = worker.generate(reqs, step=1)
    rng = np.random.default_rng(0)
    for t in trajs:
        t.advantage = float(rng.normal())
    return cfg, trajs, tiny_moe_path


def _train_once(cfg, trajs, path, zero_stage, port, checkpointing=False, packed=False):
    cfg = copy.deepcopy(cfg)
    cfg["trainer"]["zero_stage"] = zero_stage
    cfg["trainer"]["gradient_checkpointing"] = checkpointing
    cfg["trainer"]["pack_sequences"] = packed
    tr = PolicyTrainer(cfg, path, 0, 1, "127.0.0.1", port)
    before = tr.full_state_dict()
    sums = tr.train_step([trajs], [(len(trajs), int(sum(t.num_response_tokens for t in trajs)))])
    return tr, before, tr.full_state_dict(), sums


def test_zero3_with_checkpointing_and_replay_equals_zero2(setup):
    cfg, trajs, path = setup
    port = _port()
    tr2, before, after2, sums = _train_once(cfg, trajs, path, 2, port)
    _, _, after3, sums3 = _train_once(cfg, trajs, path, 3, port, checkpointing=True)
    changed = [k for k in before if not torch.equal(before[k], after2[k])]
    assert "lm_head.weight" in changed and any("mlp.gate" in k for k in changed)  # router learns under replay
    # Same gradients under ZeRO-3 + gradient checkpointing (routes replayed in the backward re-run too; ZeRO-3
    # once lost all but the last micro-batch's gradient): equal norms, and equal Adam updates
    # (a first Adam step moves each weight by ~lr * sign(grad), so a real difference shows as a ~2*lr jump).
    assert abs(sums["grad_norm"] - sums3["grad_norm"]) < 1e-5 * sums["grad_norm"]
    for k in after2:
        assert float((after2[k] - after3[k]).abs().max()) < 1e-3, k
    # same weights on both sides before the update: the engine/trainer mismatch is float noise
    assert sums["mismatch_abs_sum"] / sums["mismatch_tokens"] < 1e-4
    assert sums["routing_total"] > 0 and sums["routing_mismatch"] == 0
    assert sums["optimizer_steps"] == 1 and sums["tokens"] == sum(t.num_response_tokens for t in trajs)


def test_auto_checkpointing_follows_the_free_memory(setup, monkeypatch):
    """trainer.gradient_checkpointing=auto: off when the largest micro-batch's activations fit in the free GPU memory,
    on when they do not (the free memory is stood in for here), off on CPU; the choice is logged per step."""
    import trainer.policy as policy

    cfg, trajs, path = setup
    cfg = copy.deepcopy(cfg)
    cfg["trainer"]["gradient_checkpointing"] = "auto"
    tr = PolicyTrainer(cfg, path, 0, 1, "127.0.0.1", _port())
    norms = [(len(trajs), int(sum(t.num_response_tokens for t in trajs)))]
    assert tr.train_step([trajs], norms)["gradient_checkpointing"] == 0.0  # CPU: no GPU memory to fit
    monkeypatch.setattr(policy, "free_memory_bytes", lambda device: 10_000)
    on = lambda m: m.is_activation_checkpointing if hasattr(m, "is_activation_checkpointing") else m.is_gradient_checkpointing  # noqa: E731
    assert tr.train_step([trajs], norms)["gradient_checkpointing"] == 1.0 and on(tr.model)
    monkeypatch.setattr(policy, "free_memory_bytes", lambda device: 10**12)
    assert tr.train_step([trajs], norms)["gradient_checkpointing"] == 0.0 and not on(tr.model)


def test_auto_micro_batches_follow_the_free_memory_and_give_the_same_update(setup, monkeypatch):
    """trainer.micro_batch_size=auto: the step is cut into the fewest micro-batches whose activations fit
    trainer.micro_batch_memory of the free GPU memory (stood in for here), and however many that is, DeepSpeed steps
    once with the same update as fixed micro-batches; the reference cuts its forwards the same way and gives the same
    logprobs."""
    import trainer.dist as dist
    from rl.config import head_options
    from rl.memory import activation_bytes, forward_bytes, head_logit_bytes, max_tokens_within, micro_batch_tokens

    cfg, trajs, path = setup
    norms = [(len(trajs), int(sum(t.num_response_tokens for t in trajs)))]
    fixed = copy.deepcopy(cfg)
    fixed["trainer"]["micro_batch_size"] = 4
    _, before, after_fixed, sums_fixed = _train_once(fixed, trajs, path, 2, _port())
    auto = copy.deepcopy(cfg)
    auto["trainer"]["micro_batch_size"] = "auto"
    longest = max(t.num_tokens for t in trajs)
    config = PolicyTrainer(auto, path, 0, 1, "127.0.0.1", _port()).model.config
    share, head = auto["trainer"]["micro_batch_memory"], head_options(auto)
    chunk, per_logit = head["chunk_size"], head_logit_bytes(head, 4)
    for free, want in [(10**12, 1), (activation_bytes(config, 3 * longest, 4, False, chunk, per_logit) / share, None)]:
        monkeypatch.setattr(dist, "free_memory_bytes", lambda device, free=free: free)
        tr = PolicyTrainer(auto, path, 0, 1, "127.0.0.1", _port())
        plan = tr._auto_micro_batches([trajs], "padded")
        budget = max_tokens_within(config, share * free, 4, chunk, per_logit)
        assert all(micro_batch_tokens(p, False) <= budget for p in plan[0])
        assert len(plan[0]) == (want or len(plan[0])) and (want or len(plan[0]) > 1)
        sums = tr.train_step([trajs], norms)
        after = tr.full_state_dict()
        assert sums["optimizer_steps"] == 1 and sums["micro_batches"] == len(plan[0])
        assert abs(sums["grad_norm"] - sums_fixed["grad_norm"]) < 1e-5 * sums_fixed["grad_norm"]
        assert all(float((after[k] - after_fixed[k]).abs().max()) < 1e-3 for k in after)
        assert any(not torch.equal(before[k], after[k]) for k in after)
    # the reference sizes its forwards by what a forward without autograd holds: where training needs several
    # micro-batches it runs in one, and it cuts its forwards when even that does not fit
    everything = len(trajs) * longest
    monkeypatch.setattr(dist, "free_memory_bytes",
                        lambda device: forward_bytes(config, everything, 4, chunk, per_logit) / share)
    assert len(FrozenModel(auto, path)._chunks(trajs)) == 1
    assert len(PolicyTrainer(auto, path, 0, 1, "127.0.0.1", _port())._auto_micro_batches([trajs], "padded")[0]) > 1
    # packed rows without flash-attention carry a mask over their whole length: sized like training's micro-batches
    packed = copy.deepcopy(auto)
    packed["trainer"]["pack_sequences"] = True
    assert not FrozenModel(packed, path).forward_only_estimate and len(FrozenModel(packed, path)._chunks(trajs)) > 1
    monkeypatch.setattr(dist, "free_memory_bytes",
                        lambda device: forward_bytes(config, 2 * longest, 4, chunk, per_logit) / share)
    ref = FrozenModel(auto, path)
    assert len(ref._chunks(trajs)) > 1
    for lp_auto, lp in zip(ref.logprobs(trajs), FrozenModel(fixed, path).logprobs(trajs)):
        assert np.allclose(lp_auto, lp, atol=1e-5)


def test_packed_micro_batches_and_the_support_head_give_the_same_update(setup):
    """trainer.pack_sequences=true (unpadded rows, token-balanced micro-batches) and trainer.logprob_head=support
    give the same update as the default; the reference gives the same logprobs packed, in the caller's order."""
    cfg, trajs, path = setup
    cfg = copy.deepcopy(cfg)
    cfg["trainer"]["micro_batch_size"] = 4  # several micro-batches, so the grouping differs from the padded one
    assert len({len(t.prompt_ids) + t.num_response_tokens for t in trajs}) > 1
    _, _, padded, sums = _train_once(cfg, trajs, path, 2, _port())
    _, _, packed, sums_p = _train_once(cfg, trajs, path, 2, _port(), packed=True)
    assert abs(sums["grad_norm"] - sums_p["grad_norm"]) < 1e-5 * sums["grad_norm"]
    assert abs(sums["loss/pg"] - sums_p["loss/pg"]) < 1e-6 and sums["tokens"] == sums_p["tokens"]
    assert sums["full_entropy_tokens"] == sums["tokens"]  # the dense head: every token's full-vocabulary entropy
    # the support head (trainer.logprob_head=support): the same update; the full-vocabulary entropy at a subsample
    cfg["trainer"]["logprob_head"] = "support"
    _, _, support, sums_s = _train_once(cfg, trajs, path, 2, _port())
    assert abs(sums["grad_norm"] - sums_s["grad_norm"]) < 1e-5 * sums["grad_norm"]
    assert all(float((padded[k] - support[k]).abs().max()) < 1e-3 for k in padded)
    assert 0 < sums_s["full_entropy_tokens"] < sums_s["tokens"]
    from rl.metrics import trainer_metrics

    m = trainer_metrics([sums_s], ["digits"], 1)
    assert m["entropy/full_vocab"] > m["entropy/kept_set"] > 0  # top_p 0.9 cuts the tail
    for k in padded:
        assert float((padded[k] - packed[k]).abs().max()) < 1e-3, k
    cfg["trainer"]["pack_sequences"] = True
    for lp_packed, lp in zip(FrozenModel(cfg, path).logprobs(trajs), [t.inference_logprobs for t in trajs]):
        assert np.allclose(lp_packed, lp, atol=1e-4)


def test_reference_kl_and_checkpoint_roundtrip(setup, tmp_path):
    cfg, trajs, path = setup
    cfg = copy.deepcopy(cfg)
    ref = FrozenModel(cfg, path)
    ref_lp = ref.logprobs(trajs)
    for t, lp in zip(trajs, ref_lp):
        assert lp.shape == (t.num_response_tokens,)
        # reference == initial policy and the mask is replayed: ref logprobs equal the engine's
        assert np.allclose(lp, t.inference_logprobs, atol=1e-4)
    tr = PolicyTrainer(cfg, path, 0, 1, "127.0.0.1", _port())
    kl_trajs = copy.deepcopy(trajs)
    for t, lp in zip(kl_trajs, ref_lp):
        t.ref_logprobs, t.kl_coef = lp, 0.1
    norms = [(len(kl_trajs), int(sum(t.num_response_tokens for t in kl_trajs)))]
    tr.train_step([kl_trajs], norms)
    sums = tr.train_step([kl_trajs], norms)  # second step: the policy has moved, KL > 0
    assert sums["loss/kl"] > 0 and sums["kl_seqs/digits"] == len(kl_trajs)
    tr.save(str(tmp_path / "ck"), {"step": 2})
    weights = tr.full_state_dict()
    tr.train_step([kl_trajs], norms)
    assert tr.load(str(tmp_path / "ck")) == {"step": 2}
    restored = tr.full_state_dict()
    assert all(torch.equal(weights[k], restored[k]) for k in weights)
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "ck" / "hf")
    assert torch.equal(hf.state_dict()["lm_head.weight"], weights["lm_head.weight"])


def test_pi_old_recomputed_by_the_trainer(setup):
    """algorithm.old_logprobs=trainer: pi_old is the trainer's own logprob before the update. At equal weights in
    float32 it equals the engine's, so the update equals the engine-pi_old one and every importance weight is 1;
    with the engine's logprobs off by 0.5 the importance weights move (and are capped), the ratio does not."""
    cfg, trajs, path = setup
    norms = [(len(trajs), int(sum(t.num_response_tokens for t in trajs)))]
    base = PolicyTrainer(copy.deepcopy(cfg), path, 0, 1, "127.0.0.1", _port()).train_step([trajs], norms)
    recfg = copy.deepcopy(cfg)
    recfg["algorithm"].update(old_logprobs="trainer", tis_cap=1.2)
    same = PolicyTrainer(recfg, path, 0, 1, "127.0.0.1", _port()).train_step([trajs], norms)
    assert abs(same["grad_norm"] - base["grad_norm"]) < 1e-4 * base["grad_norm"]
    assert abs(same["is_weight_sum"] / same["tokens"] - 1.0) < 1e-4 and same["is_clip_sum"] == 0
    shifted = copy.deepcopy(trajs)
    for t in shifted:
        t.inference_logprobs = t.inference_logprobs - 0.5  # the engine thought these tokens less likely
    moved = PolicyTrainer(recfg, path, 0, 1, "127.0.0.1", _port()).train_step([shifted], norms)
    assert moved["is_clip_sum"] == moved["tokens"]  # e^0.5 > 1.2: every weight at the cap
    assert moved["clip_tokens"] == same["clip_tokens"]  # the ratio is against the recomputed pi_old, unchanged
    # OPSM reads the engine's logprobs, not the recomputed pi_old (issue 68): stale or FP8 samples whose engine found
    # their tokens far likelier (+2 per token) than the trainer does now are dropped where their advantage is < 0
    stale = copy.deepcopy(trajs)
    for t in stale:
        t.inference_logprobs, t.opsm_delta = t.inference_logprobs + 2.0, 1.0
    masked = PolicyTrainer(recfg, path, 0, 1, "127.0.0.1", _port()).train_step([stale], norms)
    negative = sum(t.advantage < 0 for t in trajs)
    assert 0 < negative < len(trajs)
    assert sum(v for k, v in masked.items() if k.startswith("opsm_masked/")) == negative


def test_rendezvous_port_is_held_from_the_moment_it_is_chosen():
    """The trainer ranks' store binds its port as the OS picks it: no other process can take it before the ranks
    connect (before, a port was found free, released, and bound again seconds later by the rank-0 trainer)."""
    import socket

    store = open_store()
    with socket.socket() as s, pytest.raises(OSError):
        s.bind(("", store.port))
    client = torch.distributed.TCPStore("127.0.0.1", store.port, None, False)
    client.set("k", "v")
    assert store.get("k") == b"v"


def test_compiled_layers_train_like_eager_ones(setup, tiny_dense_path):
    """trainer.compile=true: every decoder layer of the policy and the reference runs through torch.compile (one
    dynamic-shape graph for all micro-batch lengths) and gives eager's update and logprobs; MoE models are refused."""
    from trainer.forward import compile_layers

    cfg, _, moe_path = setup
    cfg = copy.deepcopy(cfg)
    cfg["algorithm"]["keep_routing"] = False
    worker = RolloutWorker(cfg, tiny_dense_path, 0)
    reqs = PromptMixture(cfg["domains"], worker.tokenizer, seed=2, max_prompt_tokens=512).next_batch(4)
    for i, r in enumerate(reqs):
        r["group_id"] = f"g{i}"
    trajs = worker.generate(reqs, step=1)
    assert len({t.num_tokens for t in trajs}) > 1  # several lengths through one graph
    for i, t in enumerate(trajs):
        t.advantage = (-1.0) ** i
    _, before, eager, sums = _train_once(cfg, trajs, tiny_dense_path, 2, _port())
    cfg["trainer"]["compile"] = True
    tr, _, compiled, sums_c = _train_once(cfg, trajs, tiny_dense_path, 2, _port())
    assert all(hasattr(layer.forward, "_torchdynamo_orig_callable") for layer in tr.model.model.layers)
    assert abs(sums["grad_norm"] - sums_c["grad_norm"]) < 1e-4 * sums["grad_norm"]
    assert any(not torch.equal(before[k], eager[k]) for k in eager)
    assert all(float((eager[k] - compiled[k]).abs().max()) < 1e-3 for k in eager)
    # with gradient checkpointing the compiled layers run again in backward: same update
    _, _, recomputed, sums_r = _train_once(cfg, trajs, tiny_dense_path, 2, _port(), checkpointing=True)
    assert sums_r["gradient_checkpointing"] == 1.0
    assert abs(sums["grad_norm"] - sums_r["grad_norm"]) < 1e-4 * sums["grad_norm"]
    assert all(float((eager[k] - recomputed[k]).abs().max()) < 1e-3 for k in eager)
    ref = FrozenModel(cfg, tiny_dense_path)
    assert all(hasattr(layer.forward, "_torchdynamo_orig_callable") for layer in ref.model.model.layers)
    cfg["trainer"]["compile"] = False
    for a, b in zip(ref.logprobs(trajs), FrozenModel(cfg, tiny_dense_path).logprobs(trajs)):
        np.testing.assert_allclose(a, b, atol=1e-4)
    with pytest.raises(ValueError, match="dense models"):
        compile_layers(FrozenModel(cfg, moe_path).model)


def test_profile_step_writes_one_report_at_that_step(setup, tmp_path):
    """trainer.profile_step=2: the second train step (and only it) runs under torch.profiler and writes its tables
    and trace to run_dir/profile/."""
    cfg, trajs, path = setup
    cfg = copy.deepcopy(cfg)
    cfg["trainer"]["profile_step"] = 2
    cfg["run_dir"] = str(tmp_path)
    tr = PolicyTrainer(cfg, path, 0, 1, "127.0.0.1", _port())
    norms = [(len(trajs), int(sum(t.num_response_tokens for t in trajs)))]
    tr.train_step([trajs], norms)
    assert not (tmp_path / "profile").exists()
    tr.train_step([trajs], norms)
    report = (tmp_path / "profile" / "train_step2_rank0.txt").read_text()
    assert "wall time:" in report and "top 25 by CPU time" in report and "aten::mm" in report
    assert (tmp_path / "profile" / "train_step2_rank0.json.gz").stat().st_size > 0
    tr.train_step([trajs], norms)
    assert sorted(p.name for p in (tmp_path / "profile").iterdir()) == ["train_step2_rank0.json.gz",
                                                                       "train_step2_rank0.txt"]


@pytest.mark.parametrize("zero_stage", [1, 2])
def test_one_reduction_per_mini_batch_gives_the_per_micro_batch_update(setup, zero_stage):
    """ZeRO-1/2 with the reduction coalesced per mini-batch (gradients add up on the parameters, ZeRO reduces them
    once) gives the same two updates as reducing after every micro-batch: 2 mini-batches of 2 micro-batches each."""
    cfg, trajs, path = setup
    cfg = copy.deepcopy(cfg)
    half = len(trajs) // 2
    cfg["trainer"].update(zero_stage=zero_stage, micro_batch_size=half // 2, mini_batches=2)
    minibatches = [trajs[:half], trajs[half:]]
    norms = [(len(mb), int(sum(t.num_response_tokens for t in mb))) for mb in minibatches]
    states, sums = [], []
    for coalesce in (True, False):
        cfg["trainer"]["coalesce_grad_reduction"] = coalesce
        tr = PolicyTrainer(cfg, path, 0, 1, "127.0.0.1", _port())
        assert tr.coalesce is coalesce  # DeepSpeed 0.19.8 has coalesce_grad_reduction for ZeRO-1/2
        before = tr.full_state_dict()
        sums.append(tr.train_step(minibatches, norms))
        states.append(tr.full_state_dict())
    assert sums[0]["optimizer_steps"] == sums[1]["optimizer_steps"] == 2
    assert sums[0]["micro_batches"] == sums[1]["micro_batches"] == 4
    assert abs(sums[0]["grad_norm"] - sums[1]["grad_norm"]) < 1e-5 * sums[1]["grad_norm"]
    assert all(torch.allclose(states[0][k].float(), states[1][k].float(), atol=1e-6) for k in states[1])
    assert any(not torch.equal(before[k], states[1][k]) for k in before)  # the updates did move the weights


def test_bf16_steps_skip_non_finite_gradients_without_a_per_gradient_check(setup, monkeypatch):
    """bf16 ZeRO-2: DeepSpeed's per-gradient inf/NaN test is dropped (trainer.policy.drop_per_gradient_overflow_check),
    yet a step whose gradients are NaN still leaves the weights as they were, through the global-norm test; a
    finite step updates them."""
    import deepspeed.runtime.zero.stage_1_and_2 as zero12

    calls = []
    real = zero12.has_inf_or_nan
    monkeypatch.setattr(zero12, "has_inf_or_nan", lambda x: calls.append(1) or real(x))
    cfg, trajs, path = setup
    cfg = copy.deepcopy(cfg)
    cfg["model"]["dtype"] = "bfloat16"
    cfg["trainer"]["zero_stage"] = 2
    tr = PolicyTrainer(cfg, path, 0, 1, "127.0.0.1", _port())
    assert tr.engine.optimizer.dtype == torch.bfloat16
    norms = [(len(trajs), int(sum(t.num_response_tokens for t in trajs)))]
    before = tr.full_state_dict()
    sums = tr.train_step([trajs], norms)
    after = tr.full_state_dict()
    assert np.isfinite(sums["grad_norm"]) and sums["grad_norm"] > 0
    assert any(not torch.equal(before[k], after[k]) for k in before)
    poisoned = copy.deepcopy(trajs)
    poisoned[0].advantage = float("nan")
    sums = tr.train_step([poisoned], norms)
    assert not np.isfinite(sums["grad_norm"])  # DeepSpeed reports inf for a skipped step
    final = tr.full_state_dict()
    assert all(torch.equal(after[k], final[k]) for k in after)
    assert calls == []  # no per-gradient test ran (with it, one per parameter per step)


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_optimizer_offloaded_to_the_host_gives_the_same_update(setup, zero_stage):
    """trainer.offload_optimizer=cpu: DeepSpeed keeps the float32 master weights and Adam moments in host memory
    and torch's fused AdamW steps them there; the update equals the one of the optimizer on the device, and the
    optimizer really is the offloaded one."""
    cfg, trajs, path = setup
    port = _port()
    _, before, plain, sums = _train_once(cfg, trajs, path, zero_stage, port)
    offloaded_cfg = copy.deepcopy(cfg)
    offloaded_cfg["trainer"]["offload_optimizer"] = "cpu"
    tr, _, offloaded, sums_off = _train_once(offloaded_cfg, trajs, path, zero_stage, port)
    optimizer = tr.engine.optimizer
    assert (optimizer.offload_optimizer if zero_stage == 3 else optimizer.cpu_offload) is True
    assert tr.engine.optimizer.optimizer.defaults.get("fused") is True  # one pass of torch's AdamW over the host state
    assert abs(sums["grad_norm"] - sums_off["grad_norm"]) < 1e-5 * sums["grad_norm"]
    moved = [k for k in before if not torch.equal(before[k], plain[k])]
    assert "lm_head.weight" in moved
    for k in plain:
        assert torch.allclose(plain[k].float(), offloaded[k].float(), atol=1e-6), k


def test_zero0_logs_the_gradient_norm_deepspeed_does_not_keep(setup):
    """ZeRO-0 in float32 steps torch's optimizer, whose clipping norm DeepSpeed drops (get_global_grad_norm() is
    None): the trainer takes the norm itself, the same as ZeRO-2's."""
    cfg, trajs, path = setup
    port = _port()
    tr0, _, after0, sums0 = _train_once(cfg, trajs, path, 0, port)
    assert tr0.engine.get_global_grad_norm() is None  # DeepSpeed's own reading stays empty
    _, _, after2, sums2 = _train_once(cfg, trajs, path, 2, port)
    assert sums2["grad_norm"] > 0
    assert abs(sums0["grad_norm"] - sums2["grad_norm"]) < 1e-5 * sums2["grad_norm"]
    for k in after2:
        assert torch.allclose(after0[k].float(), after2[k].float(), atol=1e-6), k


def test_zero3_partitioning_moves_the_buffers_with_the_parameters():
    """`zero.Init` moves parameters only, and deepspeed.initialize then skips its own move of the module: every
    buffer (a DeepSeek-V3 router's score-correction bias) must reach the rank's device by `move_buffers`, persistent
    or not, wherever it sits in the module tree."""
    from trainer.dist import move_buffers

    class Router(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(4, 2))
            self.register_buffer("e_score_correction_bias", torch.zeros(4))
            self.register_buffer("scratch", torch.zeros(2), persistent=False)

    model = torch.nn.Sequential(Router(), torch.nn.Sequential(Router()))
    move_buffers(model, "meta")
    assert all(b.device.type == "meta" for b in model.buffers()) and len(list(model.buffers())) == 4
    assert all(p.device.type == "cpu" for p in model.parameters())  # the parameters are zero.Init's
    assert set(model.state_dict()) == {"0.weight", "0.e_score_correction_bias", "1.0.weight",
                                       "1.0.e_score_correction_bias"}  # registration kept: non-persistent stay out
