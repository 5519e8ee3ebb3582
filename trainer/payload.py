"""The trainer's end of payload by reference: a rank (or a frozen model) fetches the per-token arrays of its own
samples straight from the object store, where the rollout worker had its node's payload holder put them
(rollout/worker.py `put_heavy`, launch/cluster.py `PayloadHolders`). The driver and the reward workers only ever held
the references (`Trajectory.payload`, rl/trajectory.py)."""

from __future__ import annotations

import time

from rl.trajectory import Trajectory


def fetch_heavy(trajs: list[Trajectory]) -> dict[str, float]:
    """Attach the heavy arrays of every sample that still has a payload reference, in one `ray.get`. Returns the
    seconds it waited and the bytes it received (for the trainer's metrics). A sample's arrays are owned by the
    payload holder of the node that sampled it, so they outlive the rollout worker (replaced after a hang or death);
    they are gone only with that node, or with the worker itself where it had no holder (one started outside a
    `launch.cluster.Cluster`), and the error says so."""
    pending = [t for t in trajs if t.payload is not None]
    if not pending:
        return {"seconds": 0.0, "bytes": 0.0}
    import ray
    from ray.exceptions import ObjectLostError, OwnerDiedError

    start = time.perf_counter()
    try:
        heavy = ray.get([t.payload for t in pending])
    except (ObjectLostError, OwnerDiedError) as e:
        raise RuntimeError(
            f"the per-token arrays (logprobs, kept sets, routes) of {len(pending)} samples could not be fetched: their "
            f"owner died after generating ({type(e).__name__}): the node that sampled them, or the rollout worker "
            "that sampled them where it had no payload holder. Restart with "
            "trainer.resume=auto to redo the step from the last checkpoint, or set rollout.payload_by_reference=false "
            "to ship the arrays with the samples"
        ) from e
    received = 0
    for t, arrays in zip(pending, heavy):
        t.attach_heavy(arrays)
        received += sum(a.nbytes for a in arrays.values() if a is not None)
    return {"seconds": time.perf_counter() - start, "bytes": float(received)}
