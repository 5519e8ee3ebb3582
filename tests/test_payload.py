"""Payload by reference (rollout.payload_by_reference): rollout workers put each sample's per-token arrays (engine
logprobs, kept sets, routes) in Ray's object store; the reward workers and the driver get the light view and the
trainer side fetches exactly the arrays the worker recorded."""

import copy
import time
from pathlib import Path

import numpy as np
import pytest
import ray
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from launch.cluster import ActorPool, RolloutInFlight
from rewards.worker import RewardWorker
from rl.config import resolve_auto
from rl.data import PromptMixture
from rl.models import load_tokenizer
from rl.trajectory import HEAVY_FIELDS, Trajectory, collate
from rollout.worker import RolloutWorker
from trainer.payload import fetch_heavy

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _cfg(by_reference: bool) -> dict:
    """smoke_learn on the tiny MoE with top-p sampling: kept sets and routes recorded (Keep Sampling Mask, Keep
    Routing), so every heavy field is there."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = OmegaConf.to_container(compose(config_name="train", overrides=[
            "+experiment=smoke_learn", "rollout.top_p=0.9", "rollout.max_new_tokens=16",
            f"rollout.payload_by_reference={str(by_reference).lower()}"]), resolve=True)
    resolve_auto(cfg, is_moe=True)
    return cfg


def _requests(cfg: dict, model_path: str) -> list[dict]:
    reqs = PromptMixture(cfg["domains"], load_tokenizer(model_path), seed=1, max_prompt_tokens=512).next_batch(4)
    for i, r in enumerate(reqs):
        r["group_id"] = f"g{i}"
    return reqs


def _rollout(cfg: dict, model_path: str):
    rollout_cls, reward_cls = ray.remote(num_cpus=0.25)(RolloutWorker), ray.remote(num_cpus=0.25)(RewardWorker)
    rollout = ActorPool("rollout", lambda i, after: rollout_cls.remote(cfg, model_path, i), 2)
    rewards = ActorPool("reward", lambda i, after: reward_cls.remote(cfg), 1)
    rollout.wait_ready()
    rewards.wait_ready()
    return rollout, rewards


def _serialized_bytes(value) -> int:
    """What Ray ships for `value` (pickle with out-of-band buffers; a nested object reference is its id)."""
    return ray._private.worker.global_worker.get_serialization_context().serialize(value).total_bytes


@ray.remote(num_cpus=0)
def _fetch_and_collate(trajs: list[Trajectory], pad_id: int) -> tuple[list[dict], int]:
    """A trainer rank's side, in another process: fetch its samples' arrays, then collate them."""
    fetch_heavy(trajs)
    batch = collate(trajs, pad_id)
    return [{name: getattr(t, name) for name in HEAVY_FIELDS} for t in trajs], int(batch.kept_ids.numel())


def test_rewards_and_the_driver_get_the_light_view_and_the_trainer_the_same_arrays(ray_local, tiny_moe_path):
    inline_cfg, ref_cfg = _cfg(False), _cfg(True)
    reqs = _requests(ref_cfg, tiny_moe_path)
    inline = RolloutInFlight(*_rollout(inline_cfg, tiny_moe_path), reqs, 1, None).scoring().collect()
    pools = _rollout(ref_cfg, tiny_moe_path)  # kept: a rollout worker's objects live as long as it does
    light = RolloutInFlight(*pools, reqs, 1, None).scoring().collect()
    n = len(reqs) * ref_cfg["rollout"]["n_samples"]
    assert len(light) == len(inline) == n
    # the driver's (and the reward workers') view: scored, with references instead of arrays
    assert all(t.payload is not None and all(getattr(t, f) is None for f in HEAVY_FIELDS) for t in light)
    assert all(t.kept_ids is not None and t.routed_experts is not None for t in inline)
    assert [(t.uid, t.reward) for t in light] == [(t.uid, t.reward) for t in inline]
    assert [t.response_ids.tolist() for t in light] == [t.response_ids.tolist() for t in inline]
    # what Ray ships to the driver shrinks by the heavy arrays (kept sets of a random model: most of the vocabulary)
    heavy = sum(getattr(t, f).nbytes for t in inline for f in HEAVY_FIELDS)
    assert _serialized_bytes(light) < _serialized_bytes(inline) - 0.9 * heavy
    with pytest.raises(ValueError, match="still in the object store"):
        collate(light[:2], 0)
    # a trainer rank in another process fetches its own samples' arrays: exactly the worker's
    mine = light[1::3]
    fetched, kept = ray.get(_fetch_and_collate.remote(mine, 0))
    for got, want in zip(fetched, inline[1::3]):
        for name in HEAVY_FIELDS:
            np.testing.assert_array_equal(got[name], getattr(want, name))
    assert kept == sum(len(t.kept_ids) for t in inline[1::3])
    assert all(t.payload is not None for t in light)  # the driver's copies are untouched


def test_a_sample_whose_worker_died_fails_with_a_clear_error(ray_local, tiny_moe_path):
    cfg = _cfg(True)
    rollout, _ = _rollout(cfg, tiny_moe_path)
    light = rollout.map("generate", _requests(cfg, tiny_moe_path)[:1], 1)
    assert light and all(t.payload is not None for t in light)
    for actor in rollout.actors:  # the owners of the arrays
        ray.kill(actor)
        # dead, not dying: a call sent right after the kill may still run (a busy machine: CI's 2 cores)
        deadline = time.monotonic() + 60
        with pytest.raises(ray.exceptions.RayActorError):
            while time.monotonic() < deadline:
                ray.get(actor.ready.remote(), timeout=60)
                time.sleep(0.2)
    # the store may serve the objects for a moment after their owner's death; once Ray has noticed, they are lost
    deadline = time.monotonic() + 60
    # (a worker started outside a Cluster has no payload holder: it owns its arrays; tests/test_payload_owner.py)
    with pytest.raises(RuntimeError, match="could not be fetched: their owner died"):
        while time.monotonic() < deadline:
            fetch_heavy([copy.copy(t) for t in light])
            time.sleep(0.5)


def test_take_and_attach_heavy_round_trip():
    t = Trajectory(uid="u", group_id="g", domain="d", prompt_ids=np.arange(3), response_ids=np.arange(2),
                   inference_logprobs=np.array([-0.5, -1.0]), kept_ids=np.array([0, 1, 1]),
                   kept_offsets=np.array([0, 2, 3]), routed_experts=np.zeros((4, 2, 1), np.uint8))
    heavy = t.take_heavy()
    assert all(getattr(t, f) is None for f in HEAVY_FIELDS) and set(heavy) == set(HEAVY_FIELDS)
    t.payload = "a reference"
    t.attach_heavy(heavy)
    assert t.payload is None and t.kept_ids.tolist() == [0, 1, 1] and t.routed_experts.shape == (4, 2, 1)
    heavy["kept_offsets"] = np.array([0, 1, 5])  # checked as at construction
    with pytest.raises(ValueError, match="kept_offsets"):
        t.attach_heavy(heavy)
