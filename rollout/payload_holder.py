"""`PayloadHolder`: the owner of the samples' per-token arrays (engine logprobs, kept sets, routes) that the rollout
workers of one node make (rollout/worker.py `put_heavy`). In Ray an object lives as long as its owner (the process
that put it; Ray 2.56 removed `ray.put(_owner=...)`), so arrays a rollout worker puts itself die with it, and the pool
replaces a hung or dead worker (launch/cluster.py PendingMap): what it made before (dynamic sampling's earlier rounds,
under rollout.max_staleness=1 the step that trains next) would be lost. A holder, one per node of rollout workers and
started by the driver (launch/cluster.py PayloadHolders), puts them instead, so they live as long as the run.

A module of its own that imports nothing but Ray: the holder's process never loads torch or an engine."""

from __future__ import annotations

import ray


class PayloadHolder:
    """A Ray actor of 0 CPUs (the driver wraps it with `ray.remote`). It keeps no references: an array is freed once
    no sample refers to it (the driver's and the trainer ranks' copies of the trajectories)."""

    def hold(self, heavy: list[dict]) -> list:
        """`heavy`: one dict of arrays per sample (`Trajectory.take_heavy`); their references, owned by this actor."""
        return [ray.put(h) for h in heavy]
