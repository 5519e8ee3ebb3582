"""The real entry point on a GPU: `python -m launch.train +experiment=mixed_rl rollout=vllm ...` for a few steps,
colocated on one GPU (CUDA-IPC sync, vLLM asleep while training; or awake, generating the next step meanwhile),
colocated on two GPUs with two trainer ranks, and split over two (NCCL sync), with a small random-weight Qwen3-MoE
(head_dim 64) and every domain of mixed_rl: the reference model (KL domains) and a vLLM rubric judge get GPU shares
next to the policy.

Run on the device: `pytest -m gpu tests/test_launch_gpu.py -s` (each run's per-step metrics are printed).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm")
pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():  # pragma: no cover - CPU machines with vllm installed
    pytest.skip("needs CUDA", allow_module_level=True)

from launch.local_nodes import LocalNodes, actors_by_node  # noqa: E402
from launch.testbed import MOE_SMALL, build_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STEPS = 3
COMMON = [
    "+experiment=mixed_rl", "rollout=vllm", "model.dtype=bfloat16", "trainer.device=cuda",
    f"trainer.total_steps={STEPS}", "trainer.save_every=0", "rollout.top_k=32", "rollout.max_new_tokens=64",
    "rollout.enforce_eager=true", "trainer.lr=1e-3",
    "domains.general.weight=0.6",  # so the judge gets prompts
    "rewards.judge.gpu_memory_utilization=0.1", "logger.progress_bar=false",
]
PLACEMENTS = {
    # one GPU: worker + trainer rank (0.4 each), reference and judge (0.1 each) in the run's placement group
    # (eval.every=1: the held-out eval runs after each sync, and the next step must still find vLLM's weights awake)
    "colocated": ["rollout.placement=colocated", "eval.every=1", "rollout.num_gpus=0.4", "trainer.num_gpus=0.4",
                  "trainer.ref_num_gpus=0.1", "rewards.judge.num_gpus=0.1", "rollout.gpu_memory_utilization=0.25"],
    # one GPU with dynamic sampling: backfill rounds on the awake engine, then vLLM sleeps for the update
    "colocated-dynamic": ["rollout.placement=colocated", "rollout.num_gpus=0.4", "trainer.num_gpus=0.4",
                          "trainer.ref_num_gpus=0.1", "rewards.judge.num_gpus=0.1",
                          "rollout.gpu_memory_utilization=0.25", "data.dynamic_sampling.enabled=true",
                          "data.dynamic_sampling.oversample=1.5"],
    # one GPU, vLLM awake throughout: the next step's rollout generates on the GPU while this step trains
    "colocated-overlap": ["rollout.placement=colocated", "rollout.num_gpus=0.4", "trainer.num_gpus=0.4",
                          "trainer.ref_num_gpus=0.1", "rewards.judge.num_gpus=0.1",
                          "rollout.gpu_memory_utilization=0.25", "rollout.enable_sleep_mode=false",
                          "rollout.max_staleness=1"],
    # the same with vLLM's KV cache in FP8 and pi_old recomputed by the trainer (truncated importance sampling)
    "colocated-overlap-fp8": ["rollout.placement=colocated", "rollout.num_gpus=0.4", "trainer.num_gpus=0.4",
                              "trainer.ref_num_gpus=0.1", "rewards.judge.num_gpus=0.1",
                              "rollout.gpu_memory_utilization=0.25", "rollout.enable_sleep_mode=false",
                              "rollout.max_staleness=1", "rollout.kv_cache_dtype=fp8", "algorithm.old_logprobs=trainer"],
    # two GPUs, two trainer ranks, one worker on each rank's GPU (rank 0 sends both workers the IPC handles)
    "colocated-2gpu": ["rollout.placement=colocated", "rollout.num_gpus=0.4", "trainer.num_gpus=0.4",
                       "trainer.num_processes=2", "rollout.num_workers=2", "trainer.ref_num_gpus=0.1",
                       "rewards.judge.num_gpus=0.1", "rollout.gpu_memory_utilization=0.25"],
    # the same over two Ray nodes on this host, one GPU each (launch/local_nodes.py), as on two machines: NCCL between
    # the ranks, each rank's samples' arrays fetched from the node that generated them (rollout.payload_by_reference)
    "colocated-2nodes": ["rollout.placement=colocated", "rollout.num_gpus=0.4", "trainer.num_gpus=0.4",
                         "trainer.num_processes=2", "rollout.num_workers=2", "trainer.ref_num_gpus=0.1",
                         "rewards.judge.num_gpus=0.1", "rollout.gpu_memory_utilization=0.25"],
    # two GPUs, one vLLM instance over both (tensor parallel 2, its Ray workers on the ranks' GPUs), ZeRO-3 ranks
    # (the weight sync gathers each bucket on every rank, each rank's GPU sends its own copy by CUDA IPC) and the
    # reference partitioned over the ranks
    "colocated-tp2": ["rollout.placement=colocated", "rollout.num_gpus=0.4", "trainer.num_gpus=0.4",
                      "trainer.num_processes=2", "rollout.num_workers=1", "rollout.tensor_parallel_size=2",
                      "trainer.zero_stage=3", "trainer.ref_placement=sharded", "rewards.judge.num_gpus=0.1",
                      "rollout.gpu_memory_utilization=0.25"],
    # the same with the judge tensor parallel too: one judge instance over both GPUs, 0.1 of each
    "colocated-tp2-judge-tp2": ["rollout.placement=colocated", "rollout.num_gpus=0.4", "trainer.num_gpus=0.4",
                                "trainer.num_processes=2", "rollout.num_workers=1", "rollout.tensor_parallel_size=2",
                                "trainer.zero_stage=3", "trainer.ref_placement=sharded", "rewards.judge.num_gpus=0.1",
                                "rewards.judge.tensor_parallel_size=2", "rewards.judge.engine=vllm",
                                "rollout.gpu_memory_utilization=0.25"],
    # the same with vLLM's expert parallelism (each TP rank holds 4 of the 8 experts whole instead of a slice of
    # each): routes captured on the driver rank, the weight sync's full expert tensors mapped to each rank's experts
    "colocated-tp2-ep": ["rollout.placement=colocated", "rollout.num_gpus=0.4", "trainer.num_gpus=0.4",
                         "trainer.num_processes=2", "rollout.num_workers=1", "rollout.tensor_parallel_size=2",
                         "+rollout.engine_args.enable_expert_parallel=true", "trainer.zero_stage=3",
                         "trainer.ref_placement=sharded", "rewards.judge.num_gpus=0.1",
                         "rollout.gpu_memory_utilization=0.25"],
    # four GPUs, tensor parallel 4, the optimizer state in host memory (the layout of benchmarks/large_shape.py
    # --gpus 4 --offload)
    "colocated-tp4-offload": ["rollout.placement=colocated", "rollout.num_gpus=0.4", "trainer.num_gpus=0.4",
                              "trainer.num_processes=4", "rollout.num_workers=1", "rollout.tensor_parallel_size=4",
                              "trainer.zero_stage=3", "trainer.offload_optimizer=cpu",
                              "trainer.ref_placement=sharded", "rewards.judge.num_gpus=0.1",
                              "rollout.gpu_memory_utilization=0.25"],
    # two GPUs: vLLM owns one; the trainer, the reference and the judge share the other
    "split": ["rollout.placement=split", "rollout.num_gpus=1", "trainer.num_gpus=0.5", "trainer.ref_num_gpus=0.25",
              "rewards.judge.num_gpus=0.25", "rollout.gpu_memory_utilization=0.5"],
}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    return build_model(tmp_path_factory.mktemp("moe"), MOE_SMALL)


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_launch_train_on_vllm(placement, model_path, tmp_path):
    gpus = 1 if placement in ("colocated", "colocated-dynamic", "colocated-overlap", "colocated-overlap-fp8") else 4 if "tp4" in placement else 2
    if torch.cuda.device_count() < gpus:
        pytest.skip(f"{placement} needs {gpus} GPUs")
    run_dir = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1", "DS_ACCELERATOR": "cuda",
           "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
    cmd = [sys.executable, "-m", "launch.train", f"run_dir={run_dir}", f"model.path={model_path}", *COMMON,
           *PLACEMENTS[placement]]
    nodes = placement.endswith("2nodes")
    with LocalNodes(2, 1, max((os.cpu_count() or 4) // 2, 2)) if nodes else contextlib.nullcontext() as address:
        if nodes:
            cmd.append(f"ray.address={address}")
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
        if nodes:  # every actor of the run, by the node it ran on: trainer ranks and rollout workers on both
            placed = actors_by_node(address)
    worker_log = run_dir / "train.log"  # the actors' own output (logger.worker_logs=file)
    assert proc.returncode == 0, (proc.stdout[-4000:], proc.stderr[-8000:],
                                  worker_log.read_text()[-12000:] if worker_log.exists() else "no train.log")
    if nodes:
        print(f"[{placement}] actors by node: {placed}")
        assert len(placed) == 2 and all({"PolicyTrainer", "RolloutWorker"} <= set(p) for p in placed.values()), placed
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = ["reward/mean", "mismatch/logprob_abs", "mismatch/routing_frac", "response_length/truncated_frac",
            "opsm/masked_frac", "kl/logic", "reward/general/rubric_judge", "time/rollout", "time/train", "time/sync",
            "time/step", "throughput/rollout_tokens_per_s", "perf/train_tflops_per_gpu", "perf/mfu"]
    for r in rows:
        print(f"[{placement}] step {r['step']}: " + ", ".join(f"{k}={r.get(k)}" for k in keys))
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    overlap = "rollout.max_staleness=1" in PLACEMENTS[placement]
    fp8 = "rollout.kv_cache_dtype=fp8" in PLACEMENTS[placement]
    for r in rows:
        # pi_old from vLLM and pi_theta from the trainer agree (Keep Sampling Mask + Keep Routing on); from step 2
        # on only if every sync delivered the trainer's weights (lr 1e-3 moves a random model far in one step).
        # One step off (overlap), step n's samples come from the weights before step n-1's update instead (so
        # both logprobs and the routes the trainer would choose differ from the sampling's)
        if overlap and r["step"] > 1:
            assert r["rollout/staleness"] == 1, r
            # the sync waited for the next step's rollout, which generated meanwhile (the last step has none)
            assert ("time/rollout_wait" in r) == (r["step"] < STEPS), r
        else:
            # an FP8 KV cache moves the engine's logprobs further from the trainer's bf16 attention (TIS weighs them)
            assert 0 <= r["mismatch/logprob_abs"] < (0.15 if fp8 else 0.05), r
            assert r["mismatch/routing_frac"] < 0.1, r
        assert r["time/sync"] > 0 and r["response_length/mean"] > 0
    # the judge scored the general prompts, and the KL domains have a reference
    assert all((r.get("reward/general/rubric_judge") is not None) == (r["samples/general"] > 0) for r in rows)
    assert any(r["samples/general"] > 0 for r in rows)
    assert any(r.get("kl/logic") is not None for r in rows)
    if "eval.every=1" in PLACEMENTS[placement]:
        assert all(any(k.startswith("eval/") for k in r) for r in rows), rows
    assert (run_dir / "checkpoints" / f"step_{STEPS:06d}" / "COMPLETE").exists()
    assert all(r["perf/payload_fetched_mb"] > 0 for r in rows)  # the arrays came by reference
    if "algorithm.old_logprobs=trainer" in PLACEMENTS[placement]:
        # the FP8 engine's samples, weighted by pi_old / pi_inference capped at algorithm.tis_cap (2.0)
        print(f"[{placement}] tis/weight_mean={[r.get('tis/weight_mean') for r in rows]}, "
              f"tis/clip_frac={[r.get('tis/clip_frac') for r in rows]}")
        assert all(0 < r["tis/weight_mean"] <= 2.0 and 0 <= r["tis/clip_frac"] < 1 for r in rows), rows
    if "data.dynamic_sampling.enabled=true" in PLACEMENTS[placement]:
        print(f"[{placement}] " + ", ".join(f"{k}={[r.get(k) for r in rows]}" for k in (
            "dynamic_sampling/rounds", "dynamic_sampling/extra_prompts", "dynamic_sampling/dropped_groups",
            "dynamic_sampling/filled_groups", "time/backfill", "advantage/zero_variance_group_frac")))
        assert all(r["dynamic_sampling/rounds"] >= 1 for r in rows)
