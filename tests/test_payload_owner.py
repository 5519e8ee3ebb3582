"""Issue 68, item 1 (design review R1): the per-token arrays a rollout worker made outlive it. The worker-replacement
recovery (launch/cluster.py PendingMap) kills a hung or dead worker and retries its share; the samples that worker
made earlier (dynamic sampling's earlier rounds, or under rollout.max_staleness=1 the step that trains next) must
still be fetchable by the trainer and train."""

import copy
import time
from pathlib import Path

import numpy as np
import pytest
import ray
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from launch.cluster import Cluster
from rl.config import resolve_auto
from rl.data import PromptMixture
from rl.models import load_tokenizer
from rl.trajectory import HEAVY_FIELDS
from trainer.payload import fetch_heavy

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _cfg() -> dict:
    """smoke_learn on the tiny MoE with top-p sampling: engine logprobs, kept sets and routes are all recorded."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose(config_name="train", overrides=[
            "+experiment=smoke_learn", "rollout.top_p=0.9", "rollout.max_new_tokens=8", "rollout.n_samples=4",
            "rollout.num_workers=2", "rollout.num_cpus=0.25", "rewards.num_actors=1", "rewards.actor_num_cpus=0.25",
            "data.prompts_per_step=2", "trainer.micro_batch_size=4"]), resolve=True)
    resolve_auto(cfg, is_moe=True)
    return cfg


def _requests(cfg: dict, model_path: str, tag: str) -> list[dict]:
    reqs = PromptMixture(cfg["domains"], load_tokenizer(model_path), seed=1, max_prompt_tokens=512).next_batch(2)
    for i, r in enumerate(reqs):
        r["group_id"] = f"{tag}-p{i}"
    return reqs


def _dead(actor) -> None:
    """Wait until Ray reports `actor` dead (a call sent right after a kill may still run on a busy machine)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ready.remote(), timeout=60)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.2)
    raise AssertionError("the killed worker still answers")


def _owner_death_noticed(canary) -> None:
    """Wait until an object the killed worker owned itself is lost: from then on, arrays the worker owned are gone
    (the store may serve them for a moment after the death)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            ray.get(canary, timeout=30)
        except (ray.exceptions.ObjectLostError, ray.exceptions.OwnerDiedError):
            return
        time.sleep(0.3)
    raise AssertionError("Ray never noticed that the worker died")


def test_payloads_survive_the_replacement_of_the_worker_that_made_them_and_train(ray_local, tiny_moe_path):
    cfg = _cfg()
    cluster = Cluster(cfg, tiny_moe_path, trainers=False)
    try:
        # step n: generated and scored; its arrays stay in the object store until a trainer rank fetches them
        # (rollout.max_staleness=1: only once the next rollout has been generated; dynamic sampling: after later rounds)
        step_n = cluster.collect_rollout(cluster.submit_rollout(_requests(cfg, tiny_moe_path, "s1"), 1)).collect()
        assert step_n and all(t.payload is not None for t in step_n)
        victim = cluster.rollout.actors[0]
        made_by_victim = [t for t in step_n if t.group_id == "s1-p0"]  # share 0: worker 0's
        assert made_by_victim
        # an object the worker owns itself, to know when Ray has noticed its death
        canary = ray.get(victim.__ray_call__.remote(lambda self: [ray.put(np.arange(300_000))]))[0]
        # the worker dies (an OOM while generating step n+1); the pool replaces it and retries its share
        ray.kill(victim)
        _dead(victim)
        step_next = cluster.collect_rollout(cluster.submit_rollout(_requests(cfg, tiny_moe_path, "s2"), 2)).collect()
        assert cluster.rollout.actors[0] is not victim and len(step_next) == len(step_n)
        _owner_death_noticed(canary)
        # step n trains: its samples' arrays are fetched (trainer/payload.py) from wherever they are held now
        fetched = [copy.copy(t) for t in step_n]
        fetch_heavy(fetched)
        for t in fetched:
            assert t.payload is None and len(t.inference_logprobs) == t.num_response_tokens
            assert t.kept_ids is not None and t.routed_experts is not None
        # ... and it trains: one policy update on them (one DeepSpeed rank over gloo in this process; it fetches them)
        from trainer.dist import open_store
        from trainer.policy import PolicyTrainer

        rng = np.random.default_rng(0)
        for t in step_n:
            t.advantage = float(rng.normal())
        store = open_store()  # the rendezvous, held while the rank joins
        trainer = PolicyTrainer(cfg, tiny_moe_path, 0, 1, "127.0.0.1", store.port)
        sums = trainer.train_step([step_n], [(len(step_n), int(sum(t.num_response_tokens for t in step_n)))])
        assert sums["optimizer_steps"] == 1 and np.isfinite(sums["grad_norm"]) and sums["grad_norm"] > 0
        assert sums["payload_bytes"] == sum(getattr(t, f).nbytes for t in fetched for f in HEAVY_FIELDS
                                            if getattr(t, f) is not None)
        # the replacement got its node's holder too: what it made survives its own death
        replacement = cluster.rollout.actors[0]
        canary = ray.get(replacement.__ray_call__.remote(lambda self: [ray.put(np.arange(300_000))]))[0]
        ray.kill(replacement)
        _dead(replacement)
        _owner_death_noticed(canary)
        assert fetch_heavy([copy.copy(t) for t in step_next if t.group_id == "s2-p0"])["bytes"] > 0
    finally:
        cluster.shutdown()
