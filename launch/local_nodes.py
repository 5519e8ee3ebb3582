"""Several Ray nodes on one host, each with its own GPUs and CPUs, as if they were separate machines; a command runs
against that cluster and the nodes stop when it ends. What `launch.train` does across nodes (trainer ranks and rollout
engines on every node, NCCL or gloo between the ranks, each sample's arrays fetched from the node that generated it)
can so be run where only one multi-GPU host is at hand:

    python -m launch.local_nodes --nodes 2 --gpus-per-node 1 -- \\
        python -m launch.train +experiment=smol_math ray.address=auto trainer.num_processes=2 rollout.num_workers=2

Node i is a `ray start --block` (the head first, then `--address=<head>`) whose processes see GPUs
[i * g, (i + 1) * g) only (CUDA_VISIBLE_DEVICES), and so do the actors Ray starts there. Each node gets ports of its
own where Ray's defaults are fixed (the dashboard agent's), a custom resource `node:<i>` of 1, and the project on
its PYTHONPATH (the actors of a joined cluster import it from their node's environment, not the driver's directory).
The command gets the head's address as RAY_ADDRESS, which `ray.address=auto` joins. Only these nodes are stopped
afterwards (not `ray stop`, which would stop every Ray instance of the host).

On real machines the same cluster is `ray start --head` on one and `ray start --address=<head ip>:6379` on each
other (README, "Running on a GPU cluster")."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_ip() -> str:
    """The address Ray advertises for this host (a UDP 'connect' sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


class LocalNodes:
    """`with LocalNodes(2, gpus_per_node=1) as address:` a cluster of that many nodes on this host."""

    def __init__(self, nodes: int, gpus_per_node: int = 0, cpus_per_node: int = 1, start_timeout_s: float = 120):
        if nodes < 1:
            raise ValueError(f"nodes={nodes}: at least 1")
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        self.gpus = visible.split(",") if visible else [str(i) for i in range(nodes * gpus_per_node)]
        if len(self.gpus) < nodes * gpus_per_node:
            raise ValueError(f"{nodes} nodes x {gpus_per_node} GPUs, but CUDA_VISIBLE_DEVICES={visible} has "
                             f"{len(self.gpus)}")
        self.nodes, self.gpus_per_node, self.cpus_per_node = nodes, gpus_per_node, cpus_per_node
        self.timeout_s = start_timeout_s
        self.address = f"{node_ip()}:{free_port()}"
        self.procs: list[subprocess.Popen] = []
        # Ray's files (and its "current cluster" note) under a directory of our own: a plain `ray.init()` elsewhere
        # on the host would otherwise join this cluster while it runs, and fail on the note it leaves behind
        self.temp_dir = tempfile.mkdtemp(prefix="mixrl-ray-")

    def __enter__(self) -> str:
        try:
            for i in range(self.nodes):
                self._start(i)
                self._wait_for(i + 1)
        except BaseException:
            self.stop()
            raise
        return self.address

    def __exit__(self, *exc) -> None:
        self.stop()

    def _start(self, i: int) -> None:
        g = self.gpus_per_node
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(self.gpus[i * g:(i + 1) * g])}
        env.setdefault("RAY_AUTH_MODE", "disabled")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", f"--num-cpus={self.cpus_per_node}",
               f"--num-gpus={g}", f"--resources={json.dumps({f'node:{i}': 1})}", "--disable-usage-stats",
               f"--dashboard-agent-listen-port={free_port()}", f"--metrics-export-port={free_port()}"]
        cmd += [f"--temp-dir={self.temp_dir}"]
        cmd += (["--head", f"--port={self.address.rsplit(':', 1)[1]}", "--include-dashboard=false"] if i == 0
                else [f"--address={self.address}"])
        # its own process group: stopping it reaches the raylet and everything it started
        self.procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                           text=True, start_new_session=True))

    def _wait_for(self, alive: int) -> None:
        """Until the cluster has `alive` nodes (asked of the head's GCS by a `ray status` subprocess)."""
        deadline = time.monotonic() + self.timeout_s
        env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
        while time.monotonic() < deadline:
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"ray start of node {self.procs.index(dead[0])} exited ({dead[0].returncode}):\n"
                                   f"{(dead[0].stdout.read() if dead[0].stdout else '')[-3000:]}")
            status = subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "status",
                                     f"--address={self.address}"], env=env, capture_output=True, text=True)
            if status.returncode == 0 and status.stdout.count("node_") >= alive:
                return
            time.sleep(1)
        raise RuntimeError(f"the local Ray cluster at {self.address} did not reach {alive} nodes in {self.timeout_s} s")

    def stop(self) -> None:
        for p in reversed(self.procs):  # the worker nodes first, the head last
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        self.procs.clear()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def actors_by_node(address: str) -> dict[str, list[str]]:
    """The class names of the actors a cluster ran (alive or dead), by node id: where a run put its trainer ranks and
    engines. Read from the GCS's actor table (Ray's state API would need the dashboard, which these nodes do not
    start); connects a driver of its own, so call it when this process is not one already."""
    import ray
    from ray._private import state

    ray.init(address=address, log_to_driver=False)
    try:
        out: dict[str, list[str]] = {}
        for a in state.actors().values():
            out.setdefault(a["Address"]["NodeID"], []).append(a["ActorClassName"])
        return out
    finally:
        ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--gpus-per-node", type=int, default=0)
    ap.add_argument("--cpus-per-node", type=int, default=max((os.cpu_count() or 2) // 2, 1))
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run against the cluster")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command to run after --")
    with LocalNodes(args.nodes, args.gpus_per_node, args.cpus_per_node) as address:
        print(f"local Ray cluster: {args.nodes} nodes at {address}", flush=True)
        sys.exit(subprocess.run(command, env={**os.environ, "RAY_ADDRESS": address}).returncode)


if __name__ == "__main__":
    main()
