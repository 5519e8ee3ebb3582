"""vLLM engine and GPU weight sync, on a GPU with vLLM 0.26 (CPU CI skips them: `-m gpu` selects them).

Run on the device: `pytest -m gpu tests/test_vllm_gpu.py -s` (the numbers are printed).
Per model (a small random-weight dense Qwen3 and a small Qwen3-MoE, head_dim 64) and placement, one
RolloutWorker (vLLM, sleep mode) and one PolicyTrainer (DeepSpeed ZeRO-2, bf16) as Ray actors:
colocated = both on one GPU (the run's placement group), CUDA-IPC sync; split (needs 2 GPUs) = one GPU each,
NCCL broadcast.
  a. step 0: the trainer's logprob of the sampled tokens (forward_logprobs on collate(trajectories)) matches vLLM's
     processed logprob, with Keep Sampling Mask on/off and Keep Routing on/off (MoE);
  a2. both capture modes (rollout.capture=sampler, the default, and =logprobs) give what the trainer reproduces;
  c. recorded routes replayed in the trainer equal the trainer's own routes on most tokens (RouteReplay.mismatch_frac);
  b. after one optimizer step and a sync (colocated: vLLM asleep during training), vLLM's logprobs of a fixed
     continuation match the trainer's new weights and differ from the old ones.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():  # pragma: no cover - CPU machines with vllm installed
    pytest.skip("needs CUDA", allow_module_level=True)

from launch.testbed import DENSE_SMALL, MOE_SMALL, base_cfg, build_model, chat_prompts  # noqa: E402

from rl.models import load_causal_lm, load_tokenizer  # noqa: E402
from rl.trajectory import collate  # noqa: E402
from trainer.forward import forward_logprobs, route_replay  # noqa: E402

MODELS = {"dense": DENSE_SMALL, "moe": MOE_SMALL}
RESULTS: dict[str, dict] = {}


@pytest.fixture(scope="module")
def ray_session():
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    os.environ["DS_ACCELERATOR"] = "cuda"  # conftest.py pins DeepSpeed to CPU for CI; the actors inherit the env
    ray.init(num_gpus=torch.cuda.device_count(), num_cpus=8, include_dashboard=False, log_to_driver=True,
             runtime_env={"env_vars": {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0",
                                       "DS_ACCELERATOR": "cuda"}})
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module", params=[("dense", "colocated"), ("moe", "colocated"), ("moe", "split")],
                ids=lambda p: "-".join(p))
def setup(request, tmp_path_factory, ray_session):
    ray = ray_session
    from launch.placement import GpuPlacement
    from launch.weight_sync import VLLMWeightSync
    from rollout.worker import RolloutWorker
    from trainer.dist import open_store
    from trainer.policy import PolicyTrainer

    kind, placement = request.param
    if placement == "split" and torch.cuda.device_count() < 2:
        pytest.skip("split placement needs 2 GPUs")
    path = build_model(tmp_path_factory.mktemp(kind), MODELS[kind])
    share = 0.5 if placement == "colocated" else 1.0
    cfg = base_cfg(
        path, keep_mask=True, keep_routing=kind == "moe",
        rollout=dict(n_samples=4, temperature=1.0, top_p=0.9, top_k=32, max_new_tokens=64, placement=placement,
                     num_gpus=share, gpu_memory_utilization=0.25, enforce_eager=True),
        trainer=dict(lr=1e-3, micro_batch_size=16, zero_stage=2, num_gpus=share),
        data=dict(prompts_per_step=4),
    )
    pg = GpuPlacement(cfg)  # colocated: both actors in one GPU bundle, as the driver places them
    worker = ray.remote(num_gpus=share, num_cpus=1)(RolloutWorker).options(**pg.options(0)).remote(cfg, path, 0)
    ray.get(worker.ready.remote())  # vLLM first: it profiles free memory at start
    store = open_store()  # the trainer's rendezvous; serves while this fixture lives
    trainer = ray.remote(num_gpus=share, num_cpus=1)(PolicyTrainer).options(**pg.options(0)).remote(
        cfg, path, 0, 1, "127.0.0.1", store.port)
    ray.get(trainer.ready.remote())
    sync = VLLMWeightSync(cfg, [worker], [trainer])
    sync.init()
    tok = load_tokenizer(path)
    requests = [dict(group_id=f"g{i}", domain="math", prompt_ids=p, prompt_text="", sample={})
                for i, p in enumerate(chat_prompts(tok, 4))]
    trajs = ray.get(worker.generate.remote(requests, 1))
    model = load_causal_lm(path, "bfloat16", "sdpa", "cuda").eval()
    name = f"{kind}-{placement}"
    yield dict(kind=kind, name=name, path=path, cfg=cfg, worker=worker, trainer=trainer, sync=sync,
               requests=requests, trajs=trajs, tok=tok, model=model)
    ray.kill(worker)
    ray.kill(trainer)
    pg.remove()
    del model
    torch.cuda.empty_cache()
    print(f"\nRESULTS {name}: {RESULTS.get(name)}")


def _trainer_logprobs(model, trajs, pad_id, keep_mask: bool, replay: bool):
    if not keep_mask:  # the trainer scores over the kept sets exactly when the batch carries them
        trajs = [dataclasses.replace(t, kept_ids=None, kept_offsets=None) for t in trajs]
    batch = collate(trajs, pad_id).to("cuda")
    with torch.no_grad(), route_replay(model, batch, replay) as rp:
        out = forward_logprobs(model, batch, temperature=1.0)
    diff = (out.logprobs.float() - batch.inference_logprobs.float()).abs()[batch.loss_mask > 0]
    return float(diff.mean()), float(diff.max()), float(getattr(rp, "mismatch_frac", 0.0))


def test_a_step0_logprobs_match(setup):
    kind, trajs, model, tok = setup["kind"], setup["trajs"], setup["model"], setup["tok"]
    assert len(trajs) == 16 and all(t.num_response_tokens > 0 for t in trajs)
    for t in trajs:  # capture contract
        assert t.kept_offsets is not None and len(t.kept_offsets) == t.num_response_tokens + 1
        assert len(t.kept_ids) == t.kept_offsets[-1] and (np.diff(t.kept_offsets) >= 1).all()
        if kind == "moe":
            assert t.routed_experts.shape == (len(t.prompt_ids) + t.num_response_tokens - 1, 4, 2)
            assert t.routed_experts.dtype == np.uint8
            assert (t.routed_experts[:, 0] == 0).all()  # mlp_only_layers=[0] -> dense row zeroed
            assert t.routed_experts[:, 1:].max() > 0
    kept = np.concatenate([np.diff(t.kept_offsets) for t in trajs])
    positions = sum(t.num_response_tokens for t in trajs)
    truncated = sum(t.kept_set_cut for t in trajs) / positions
    res = RESULTS.setdefault(setup["name"], {})
    res["kept_set_mean_size"] = float(kept.mean())
    res["mask_truncated_pos_frac"] = truncated
    for keep_mask in (True, False):
        for replay in ((True, False) if kind == "moe" else (False,)):
            mean, mx, _ = _trainer_logprobs(model, trajs, tok.pad_token_id, keep_mask, replay)
            key = f"mask={'on' if keep_mask else 'off'}" + (f",routing={'on' if replay else 'off'}" if kind == "moe" else "")
            res[key] = {"mean_abs_diff": round(mean, 5), "max_abs_diff": round(mx, 5)}
            print(f"[a] {setup['name']} {key}: mean|trainer - vllm| = {mean:.5f}  max = {mx:.5f}")
    print(f"[a] {setup['name']}: kept set mean size {kept.mean():.1f}, positions with a maybe-cut set {truncated:.4f}")
    best = res["mask=on,routing=on" if kind == "moe" else "mask=on"]["mean_abs_diff"]
    off = res["mask=off,routing=on" if kind == "moe" else "mask=off"]["mean_abs_diff"]
    assert best < 0.05, res
    assert off > best  # without the mask the trainer scores the full vocabulary: a systematic gap


def test_c_route_replay_agrees(setup):
    if setup["kind"] != "moe":
        pytest.skip("dense model: no routes")
    _, _, frac = _trainer_logprobs(setup["model"], setup["trajs"], setup["tok"].pad_token_id, True, True)
    RESULTS.setdefault(setup["name"], {})["route_mismatch_frac_step0"] = frac
    print(f"[c] moe: RouteReplay.mismatch_frac at step 0 = {frac:.4f} (share of token-layer routes that differ)")
    assert frac < 0.1


def _set_capture(worker, mode: str | None) -> str:
    import ray

    def swap(actor, mode):
        if mode is not None:
            actor.engine.capture = mode
        return actor.engine.capture

    return ray.get(worker.__ray_call__.remote(swap, mode))


def test_a2_capture_modes_agree(setup):
    """rollout.capture=sampler (the default: rollout/vllm_capture.py hooks vLLM's sampler) and =logprobs (vLLM's
    logprobs output) both give logprobs and kept sets that the trainer reproduces at step 0."""
    import ray

    kind, worker, model, tok = setup["kind"], setup["worker"], setup["model"], setup["tok"]
    assert _set_capture(worker, None) == "sampler"  # the hook installed on this vLLM: setup's trajs used it
    _set_capture(worker, "logprobs")
    try:
        trajs = ray.get(worker.generate.remote(setup["requests"], 2))
    finally:
        _set_capture(worker, "sampler")
    res = RESULTS.setdefault(setup["name"], {})
    for mode, tr in (("sampler", setup["trajs"]), ("logprobs", trajs)):
        mean, mx, _ = _trainer_logprobs(model, tr, tok.pad_token_id, True, kind == "moe")
        kept = float(np.concatenate([np.diff(t.kept_offsets) for t in tr]).mean())
        res[f"capture={mode}"] = {"mean_abs_diff": round(mean, 5), "max_abs_diff": round(mx, 5), "kept_mean": kept}
        print(f"[a2] {setup['name']} capture={mode}: mean|trainer - vllm| = {mean:.5f} max = {mx:.5f} kept set mean {kept:.1f}")
        assert mean < 0.05, res


def _hf_logprobs(model, prompts, conts) -> list[np.ndarray]:
    out = []
    with torch.no_grad():
        for p, c in zip(prompts, conts):
            ids = torch.tensor([p + c], device="cuda")
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
            pos = torch.arange(len(p) - 1, len(p) + len(c) - 1, device="cuda")
            out.append(logp[pos, ids[0, pos + 1]].cpu().numpy())
    return out


def _mean_abs(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return float(np.mean(np.abs(np.concatenate(a) - np.concatenate(b))))


def test_b_sync_after_step(setup):
    import ray

    worker, trainer, sync, trajs = setup["worker"], setup["trainer"], setup["sync"], setup["trajs"]
    prompts = [t.prompt_ids.tolist() for t in trajs[:4]]
    conts = [t.response_ids[:32].tolist() for t in trajs[:4]]
    old_v = ray.get(worker.continuation_logprobs.remote(prompts, conts))
    hf_old = _hf_logprobs(setup["model"], prompts, conts)

    for i, t in enumerate(trajs):
        t.advantage = 1.0 if i % 2 == 0 else -1.0
    sync.after_generate()  # colocated: vLLM sleeps (level 2) while the trainer steps; split: no-op
    tokens = int(sum(t.loss_mask_or_ones().sum() for t in trajs))
    sums = ray.get(trainer.train_step.remote([trajs], [(len(trajs), tokens)]))
    stats = sync.sync()
    new_v = ray.get(worker.continuation_logprobs.remote(prompts, conts))

    state = ray.get(trainer.full_state_dict.remote("bfloat16"))
    model = load_causal_lm(setup["path"], "bfloat16", "sdpa", "cuda").eval()
    model.load_state_dict({k: v for k, v in state.items()}, strict=False)
    hf_new = _hf_logprobs(model, prompts, conts)
    del model

    res = RESULTS.setdefault(setup["name"], {})
    res["b"] = b = {
        "vllm_old_vs_trainer_old": _mean_abs(old_v, hf_old),
        "vllm_new_vs_trainer_new": _mean_abs(new_v, hf_new),
        "vllm_old_vs_trainer_new": _mean_abs(old_v, hf_new),
        "vllm_new_vs_vllm_old": _mean_abs(new_v, old_v),
        "grad_norm": sums.get("grad_norm"),
        "sync_seconds_with_wake": stats["seconds"],
        "sync_bytes": stats["bytes"],
        "sync_tensors": stats["tensors"],
    }
    # vLLM still generates after the wake-up, and later syncs (awake, no sleep) are quick
    again = ray.get(worker.generate.remote(setup["requests"][:2], 2))
    assert len(again) == 8 and all(t.num_response_tokens > 0 for t in again)
    b["sync_seconds_awake"] = [round(sync.sync()["seconds"], 4) for _ in range(3)]
    print(f"[b] {setup['name']}: " + ", ".join(f"{k}={v:.5f}" if isinstance(v, float) else f"{k}={v}" for k, v in b.items()))
    assert b["vllm_new_vs_trainer_new"] < 0.05, b
    assert b["vllm_old_vs_trainer_new"] > 3 * b["vllm_new_vs_trainer_new"], b


@pytest.mark.parametrize("placement, bucket_mb", [("colocated", 512), ("colocated", 1), ("split", 512)])
def test_two_instances_on_one_gpu_get_every_sync_and_leave_no_memory_behind(tmp_path, ray_session, placement,
                                                                           bucket_mb):
    """Two vLLM instances on one GPU, sent to in waves (launch.weight_sync.gpu_waves): after each step and sync both
    hold the new weights, and the trainer's allocated memory stays flat from step to step. Colocated
    (`rollout.num_workers=2` with one trainer rank): when both opened one CUDA-IPC export, torch kept every sent
    1 GiB buffer (+1.00 GiB a step, out of memory at step 49 of a SmolLM2 run); bucket_mb=1: the ~10 MB model goes in
    many exports (trainer.weight_sync.export_groups; one buffer sent in several chunks was kept the same way).
    Split (2 GPUs; `rollout.num_gpus=0.5`): both instances on the rollout GPU, the trainer on the other, one NCCL
    group per instance (a group cannot hold two processes of one GPU)."""
    ray = ray_session
    from launch.placement import GpuPlacement
    from launch.weight_sync import VLLMWeightSync
    from rollout.worker import RolloutWorker
    from trainer.dist import open_store
    from trainer.policy import PolicyTrainer

    if placement == "split" and torch.cuda.device_count() < 2:
        pytest.skip("split placement needs 2 GPUs")
    path = build_model(tmp_path / "dense", DENSE_SMALL)
    share, trainer_share = (0.25, 0.5) if placement == "colocated" else (0.5, 1.0)
    cfg = base_cfg(path, keep_mask=False, keep_routing=False,
                   rollout=dict(num_workers=2, num_gpus=share, gpu_memory_utilization=0.15, enforce_eager=True,
                                n_samples=2, max_new_tokens=32, enable_sleep_mode=True, weight_sync_bucket_mb=bucket_mb,
                                placement=placement),
                   trainer=dict(lr=1e-3, micro_batch_size=16, zero_stage=2, num_gpus=trainer_share))
    pg = GpuPlacement(cfg)
    workers = []
    for i in range(2):  # one at a time: each vLLM profiles the GPU's free memory as it starts
        workers.append(ray.remote(num_gpus=share, num_cpus=1)(RolloutWorker).options(**pg.worker_options(i)).remote(
            cfg, path, i))
        ray.get(workers[-1].ready.remote())
    gpus = ray.get([w.__ray_call__.remote(lambda self: ray.get_gpu_ids()) for w in workers])
    assert gpus[0] == gpus[1], gpus  # both instances on one GPU
    store = open_store()
    trainer = ray.remote(num_gpus=trainer_share, num_cpus=1)(PolicyTrainer).options(**pg.options(0)).remote(
        cfg, path, 0, 1, "127.0.0.1", store.port)
    ray.get(trainer.ready.remote())
    trainer_gpus = ray.get(trainer.__ray_call__.remote(lambda self: ray.get_gpu_ids()))
    assert (trainer_gpus == gpus[0]) == (placement == "colocated"), (trainer_gpus, gpus)
    sync = VLLMWeightSync(cfg, workers, [trainer])
    sync.init()
    tok = load_tokenizer(path)
    requests = [dict(group_id=f"g{i}", domain="math", prompt_ids=p, prompt_text="", sample={})
                for i, p in enumerate(chat_prompts(tok, 4))]
    trajs = ray.get(workers[0].generate.remote(requests, 1))
    prompts = [t.prompt_ids.tolist() for t in trajs[:4]]
    conts = [t.response_ids[:16].tolist() for t in trajs[:4]]
    allocated, steps = [], []
    try:
        before = ray.get(workers[1].continuation_logprobs.remote(prompts, conts))
        for step in range(4):
            for i, t in enumerate(trajs):
                t.advantage = 1.0 if (i + step) % 2 == 0 else -1.0
            sync.after_generate()
            allocated.append(ray.get(trainer.__ray_call__.remote(lambda self: torch.cuda.memory_allocated())) / 2**30)
            tokens = int(sum(t.loss_mask_or_ones().sum() for t in trajs))
            ray.get(trainer.train_step.remote([trajs], [(len(trajs), tokens)]))
            sync.sync()
            now = [ray.get(w.continuation_logprobs.remote(prompts, conts)) for w in workers]
            steps.append((_mean_abs(now[0], now[1]), _mean_abs(now[1], before)))
            before = now[1]
    finally:
        for a in [*workers, trainer]:
            ray.kill(a)
        pg.remove()
    print(f"\n[two instances, {placement}] trainer allocated GiB before each step {[round(a, 3) for a in allocated]}; "
          f"per step (instance 0 vs 1, instance 1 vs its last weights): {steps}")
    assert all(same < 0.01 and moved > 0.01 for same, moved in steps), steps
    # from step 2 (step 1 adds the optimizer's state): a kept buffer would add the model's bf16 bytes every step
    model_gib = sum(p.numel() for p in load_causal_lm(path, "bfloat16", "sdpa").parameters()) * 2 / 2**30
    assert max(allocated[1:]) - min(allocated[1:]) < 0.5 * model_gib, (allocated, model_gib)
