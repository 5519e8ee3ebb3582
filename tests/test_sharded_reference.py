"""trainer.ref_placement=sharded: the KL reference partitioned over the trainer ranks (ZeRO-3 inference inside each
PolicyTrainer) scores every sample as the whole-copy reference does, whatever the split of samples over the ranks
(uneven shares, fewer samples than ranks), and holds only a partition of the weights on each rank."""

import copy
from pathlib import Path

import numpy as np
import pytest
import ray
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from launch.cluster import Cluster
from launch.placement import check_gpu_layout, colocated_shares, cpu_reservations
from rl.config import ConfigError, resolve_auto
from rl.data import PromptMixture
from rollout.worker import RolloutWorker
from trainer.frozen import FrozenModel

ROOT = Path(__file__).resolve().parents[1]


def _cfg(*overrides):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose(config_name="train", overrides=[
            "+experiment=smoke_learn", "domains.digits.kl_coef=0.1", "trainer.micro_batch_size=2",
            "rollout.top_p=0.9", *overrides]), resolve=True)
    resolve_auto(cfg, is_moe=True)
    return cfg


@pytest.fixture(scope="module")
def samples(tiny_moe_path):
    cfg = _cfg()
    worker = RolloutWorker(cfg, tiny_moe_path, 0)  # in-process: whole samples (kept sets and routes inline)
    reqs = PromptMixture(cfg["domains"], worker.tokenizer, seed=3, max_prompt_tokens=512).next_batch(2)
    for i, r in enumerate(reqs):
        r["group_id"] = f"g{i}"
    trajs = worker.generate(reqs, step=1)
    assert trajs[0].kept_ids is not None and trajs[0].routed_experts is not None
    return trajs


@pytest.mark.parametrize("zero_stage", [2, 3])  # the policy's own stage: its engine and the reference's side by side
def test_sharded_reference_scores_like_the_whole_copy(tmp_path, tiny_moe_path, samples, zero_stage):
    cfg = _cfg("trainer.num_processes=2", "trainer.ref_placement=sharded", f"trainer.zero_stage={zero_stage}",
               "algorithm.ref_keep_routing=true", f"run_dir={tmp_path}")
    # the reference has no actor of its own: no CPUs reserved for it, no GPU share
    assert not any("reference" in k for k in cpu_reservations(cfg))
    whole = FrozenModel(cfg, tiny_moe_path)  # the whole-copy reference (trainer.ref_placement=actor), in-process
    want = whole.logprobs(copy.deepcopy(samples))
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    cluster = None
    try:
        cluster = Cluster(cfg, tiny_moe_path)
        assert cluster.reference is None and cluster.frozen_sharded
        # 5 samples: shares of 3 and 2 (the ranks agree on one count of forwards); 1 sample: the second rank scores a
        # copy of it and its result is dropped; all of them
        for part in (samples[:5], samples[:1], samples):
            got = cluster.ref_logprobs(part)
            assert len(got) == len(part)
            for g, w, t in zip(got, want, part):
                assert g.shape == (t.num_response_tokens,)
                np.testing.assert_allclose(g, w, atol=2e-5)
        # each rank holds half of every parameter of the reference (ZeRO-3 partitions), none of it whole
        held = ray.get([a.__ray_call__.remote(lambda self: [
            (int(p.ds_numel), int(p.ds_tensor.numel()), int(p.numel()))
            for p in self.frozen["reference"].model.parameters()]) for a in cluster.trainers])
        for rank in held:
            assert all(whole_n == 0 and part <= -(-n // 2) for n, part, whole_n in rank)
        assert sum(part for rank in held for _, part, _ in rank) >= sum(p.numel() for p in whole.model.parameters())
    finally:
        if cluster is not None:
            cluster.shutdown()
        ray.shutdown()


def test_sharded_reference_takes_no_gpu_share():
    cfg = _cfg("rollout=vllm", "trainer.device=cuda", "rollout.placement=colocated", "rollout.num_gpus=0.5",
               "trainer.num_gpus=0.5", "trainer.ref_num_gpus=0.2", "trainer.num_processes=1")
    with pytest.raises(ConfigError, match="trainer.ref_num_gpus 0.2"):  # an actor of its own: a share of GPU 0
        check_gpu_layout(cfg)
    cfg["trainer"]["ref_placement"] = "sharded"
    check_gpu_layout(cfg)
    assert "trainer.ref_num_gpus" not in colocated_shares(cfg)
