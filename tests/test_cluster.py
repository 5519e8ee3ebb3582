"""The Ray side: a rollout worker that dies is replaced, re-synced with the latest weights, and its share
retried; the step loses nothing."""

from pathlib import Path

import pytest
import ray
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rl.cluster import ActorPool
from rl.config import resolve_auto
from rl.data import PromptMixture
from rl.models import load_tokenizer
from rollout.worker import RolloutWorker

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_dead_rollout_worker_is_replaced_and_resynced(ray_local, tiny_dense_path):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose(config_name="train", overrides=["+experiment=smoke_learn"]), resolve=True)
    resolve_auto(cfg, is_moe=False)
    cls = ray.remote(num_cpus=0.5)(RolloutWorker)
    weights = {"state": None}
    pool = ActorPool(
        "rollout", lambda i: cls.remote(cfg, tiny_dense_path, i), 2,
        on_restart=lambda a: ray.get(a.load_state_dict.remote(weights["state"])),
    )
    pool.wait_ready()
    tok = load_tokenizer(tiny_dense_path)
    reqs = PromptMixture(cfg["domains"], tok, seed=1, max_prompt_tokens=512).next_batch(4)
    for i, r in enumerate(reqs):
        r["group_id"] = f"g{i}"
    # New weights everywhere (zeroed LM head: every token equally likely -> logprob = -log(vocab)).
    from rl.models import load_causal_lm

    sd = load_causal_lm(tiny_dense_path).state_dict()
    sd["lm_head.weight"] = torch.zeros_like(sd["lm_head.weight"])
    weights["state"] = ray.put(sd)
    ray.get([a.load_state_dict.remote(weights["state"]) for a in pool.actors])
    before = pool.map("generate", reqs, 1)
    ray.kill(pool.actors[1])
    after = pool.map("generate", reqs, 1)
    assert len(after) == len(before) == 4 * cfg["rollout"]["n_samples"]
    # The replacement worker got the synced weights: same samples and uniform logprobs as before it died.
    assert [t.response_ids.tolist() for t in after] == [t.response_ids.tolist() for t in before]
    uniform = -torch.log(torch.tensor(float(len(tok)))).item()
    assert all(abs(float(lp) - uniform) < 1e-4 for t in after for lp in t.sampling_logprobs)


def test_a_worker_that_keeps_timing_out_ends_with_a_clear_error(ray_local, tiny_dense_path):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose(config_name="train", overrides=["+experiment=smoke_learn"]), resolve=True)
    resolve_auto(cfg, is_moe=False)
    cls = ray.remote(num_cpus=0.5)(RolloutWorker)
    pool = ActorPool("rollout", lambda i: cls.remote(cfg, tiny_dense_path, i), 1, timeout_s=0.01)
    pool.wait_ready()
    first = pool.actors[0]
    reqs = [{"group_id": "g", "domain": "digits", "prompt_ids": [1, 2, 3], "prompt_text": "", "sample": {}}]
    with pytest.raises(RuntimeError, match=r"rollout worker 0: generate exceeded 0.01s twice"):
        pool.map("generate", reqs, 1)
    assert pool.actors[0] is not first  # the hung worker was replaced (and killed), not waited on
