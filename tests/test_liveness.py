"""Issue 68, item 3 (design review R3): liveness. A pool call's share is overdue `timeout_s` after it started on
its worker (not after the last share of the call finished), and the overdue share's worker is the one replaced, not
the lowest-index worker still running; the weight sync's waits end with an error naming the worker and the phase."""

import time

import pytest
import ray

from launch.cluster import ActorPool
from launch import weight_sync
from launch.weight_sync import VLLMWeightSync


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@ray.remote(num_cpus=0)
class Sleeper:
    """A pool worker whose `work(share)` sleeps each item's seconds; one started with `hang` never answers."""

    def __init__(self, hang: bool):
        self.hang = hang

    def ready(self) -> bool:
        return True

    def work(self, share: list[float], tag: str) -> list[str]:
        if self.hang:
            time.sleep(10_000)
        for seconds in share:
            time.sleep(seconds)
        return [f"{tag}:{s}" for s in share]


def _pool(timeout_s: float, hung: set[int], size: int = 2) -> tuple[ActorPool, list]:
    """A pool whose first workers in `hung` hang; their replacements (and every other worker) are healthy."""
    started = []

    def factory(i, after):
        actor = Sleeper.remote(i in hung and all(j != i for j, _ in started))
        started.append((i, actor))
        return actor

    pool = ActorPool("sleeper", factory, size, timeout_s=timeout_s)
    pool.wait_ready()
    return pool, started


def test_the_overdue_share_is_replaced_not_a_healthy_one_queued_behind_an_earlier_call(ray_local):
    """max_staleness=1: worker 0 still runs the earlier call's share when the next call is submitted, so its share of
    the next call starts late and runs past `timeout_s` from the submission, within it from its start. Worker 1 hangs.
    Only worker 1 is replaced; worker 0's long tail is waited for."""
    pool, started = _pool(timeout_s=4.0, hung={1})
    healthy, hung = pool.actors
    earlier = pool.submit("work", [2.5, 0.0], "earlier")  # worker 0 busy for 2.5 s; worker 1 hangs on its share
    later = pool.submit("work", [2.5, 0.0], "later")  # worker 0: starts at ~2.5 s, ends at ~5 s (> 4 s, submission)
    t0 = time.monotonic()
    got = dict(later.as_completed())
    assert got == {0: ["later:2.5"], 1: ["later:0.0"]}
    assert pool.actors[0] is healthy, "a healthy worker whose share was within its time was killed"
    assert pool.actors[1] is not hung and later.retried == {1}
    assert time.monotonic() - t0 < 12
    # the earlier call: worker 0's share finished; worker 1's died with the hung worker and is retried on the
    # replacement (not replaced again)
    replacement = pool.actors[1]
    assert dict(earlier.as_completed()) == {0: ["earlier:2.5"], 1: ["earlier:0.0"]}
    assert pool.actors[1] is replacement


def test_a_hung_share_is_found_its_timeout_after_it_started_not_after_the_last_share_finished(ray_local):
    """Worker 1 hangs from the start; worker 0 finishes just before the timeout. The hang is declared `timeout_s`
    after worker 1's share started, not `timeout_s` after worker 0 finished (which doubles the wait)."""
    pool, _ = _pool(timeout_s=3.0, hung={1})
    t0 = time.monotonic()
    got = dict(pool.submit("work", [2.5, 0.0], "x").as_completed())
    took = time.monotonic() - t0
    assert got == {0: ["x:2.5"], 1: ["x:0.0"]}
    assert took < 5.0, f"the hung worker was replaced {took:.1f} s after the call (its timeout: 3 s)"


@ray.remote(num_cpus=0)
class SyncWorker:
    """Stands in for a RolloutWorker / PolicyTrainer in the weight sync; `hang_in` names the method that hangs."""

    def __init__(self, hang_in: str = ""):
        self.hang_in = hang_in

    def ready(self) -> bool:
        return True

    def _maybe_hang(self, name: str) -> None:
        if name == self.hang_in:
            time.sleep(10_000)

    def begin_weight_update(self):
        self._maybe_hang("begin_weight_update")

    def end_weight_update(self):
        self._maybe_hang("end_weight_update")

    def send_weights(self, targets):
        self._maybe_hang("send_weights")
        return {"seconds": 0.0, "bytes": 0, "tensors": 0}

    def init_weight_transfer_engine(self, request):
        self._maybe_hang("init_weight_transfer_engine")

    def init_weight_sync(self, *args):
        self._maybe_hang("init_weight_sync")

    def sleep(self, level):
        self._maybe_hang("sleep")


def _sync_cfg(timeout_s: float | None) -> dict:
    rollout = {"placement": "colocated", "num_workers": 2, "num_gpus": 0.5, "engine": "vllm",
               "enable_sleep_mode": True, "sleep_level": 1}
    if timeout_s is not None:
        rollout["weight_sync_timeout_s"] = timeout_s
    return {"rollout": rollout, "trainer": {"num_processes": 1, "num_gpus": 0.5}}


@pytest.mark.parametrize("phase,who,call", [
    ("begin_weight_update", "rollout worker 1", "sync"),
    ("send_weights", "trainer rank 0", "sync"),
    ("end_weight_update", "rollout worker 1", "sync"),
    ("sleep", "rollout worker 1", "after_generate"),
    ("init_weight_transfer_engine", "rollout worker 1", "init"),
])
def test_a_worker_hung_in_the_weight_sync_ends_the_wait_with_its_name_and_phase(ray_local, phase, who, call):
    workers = [SyncWorker.remote(), SyncWorker.remote(phase if who.startswith("rollout") else "")]
    trainers = [SyncWorker.remote(phase if who.startswith("trainer") else "")]
    ray.get([a.ready.remote() for a in workers + trainers])  # started: only the hung one is late
    sync = VLLMWeightSync(_sync_cfg(1.0), workers, trainers)
    t0 = time.monotonic()
    with pytest.raises(weight_sync.WeightSyncTimeout, match=rf"{who} did not return from {phase} within 1 s") as e:
        getattr(sync, call)()
    assert time.monotonic() - t0 < 30
    others = {"rollout worker 0", "rollout worker 1", "trainer rank 0"} - {who}
    assert not any(name in str(e.value) for name in others), str(e.value)  # the healthy ones are not named
    for a in workers + trainers:
        ray.kill(a)


def test_the_weight_sync_wait_has_a_default_from_the_config():
    """A config without the key (a tool that builds a partial one) gets the YAML's default, not an endless wait."""
    from rl.config import ROLLOUT_DEFAULTS

    sync = VLLMWeightSync(_sync_cfg(None), [], [])
    assert sync.timeout_s == ROLLOUT_DEFAULTS["weight_sync_timeout_s"] > 0

