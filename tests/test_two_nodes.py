"""`launch.train` across two Ray nodes (launch/local_nodes.py: two raylets on this host, as on two machines): the
trainer ranks run on different nodes and train together over gloo, every rank fetches its samples' arrays from the
object store of the node that generated them (rollout.payload_by_reference), and the run finishes. The GPU version,
NCCL and colocated vLLM on each node, is tests/test_launch_gpu.py's colocated-2nodes case."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch.local_nodes import LocalNodes, actors_by_node

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_train_across_two_ray_nodes(tmp_path):
    run_dir = tmp_path / "run"
    # 3 CPUs a node and 2 a trainer rank: one rank fits a node, so the two ranks are on different nodes (the rest fits
    # next to either)
    cmd = [sys.executable, "-m", "launch.train", "+experiment=smoke_learn", f"run_dir={run_dir}", "ray.address=auto",
           "trainer.total_steps=2", "trainer.num_processes=2", "trainer.num_cpus=2", "rollout.num_workers=2",
           "rollout.num_cpus=0.4", "rewards.actor_num_cpus=0.2", "rollout.top_p=0.9", "logger.progress_bar=false"]
    with LocalNodes(2, gpus_per_node=0, cpus_per_node=3) as address:
        env = {**os.environ, "RAY_ADDRESS": address, "WANDB_MODE": "offline"}
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        placed = actors_by_node(address)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-6000:])
    trainers = [node for node, names in placed.items() if "PolicyTrainer" in names]
    assert len(placed) == 2 and len(trainers) == 2, placed
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    # the ranks fetched the samples' logprobs and kept sets (top_p < 1) by reference, across nodes for some
    assert all(r["perf/payload_fetched_mb"] > 0 and r["mismatch/logprob_abs"] < 1e-3 for r in rows), rows
