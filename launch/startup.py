"""The start-up timeline: seconds from the command to each milestone of a run's start (the model found or built, Ray
up, each actor ready, the weight sync set up) and to the end of its first step. Logged as one line after step 1,
written to run_dir/summary.json under `start_up` and to the W&B summary (`summary/start_up/<milestone>`), so a slow
start shows where its time went.

An actor's milestone is when its `ready` call returned (its constructor had finished), marked from a Ray thread as
it happens (`Cluster._watch`) rather than when the driver got round to waiting for it: actors start side by side,
so the order of the driver's waits says nothing about which one was slow. Marks may come from several threads.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)


class StartupTimeline:
    def __init__(self, launched: float):
        """`launched`: the command's start (time.time())."""
        self.launched = launched
        self.marks: dict[str, float] = {}  # milestone -> seconds since launched (read through `ordered`)
        self._lock = threading.Lock()

    def mark(self, name: str) -> None:
        """`name` reached now (the first time counts: a milestone reached again, e.g. on a restart, keeps it)."""
        with self._lock:
            self.marks.setdefault(name, round(time.time() - self.launched, 2))

    def ordered(self) -> dict[str, float]:
        with self._lock:
            return dict(sorted(self.marks.items(), key=lambda kv: kv[1]))

    def format(self) -> str:
        """One line: `milestone 12.3 s, ...` in time order."""
        return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.ordered().items())


# The packages whose imports dominate a worker's start (vLLM and torch: tens of seconds without bytecode).
HEAVY_PACKAGES = ("torch", "transformers", "vllm", "deepspeed", "ray")


def uncached_bytecode(packages=HEAVY_PACKAGES, dont_write: bool | None = None) -> list[str]:
    """The installed `packages` whose bytecode is neither cached nor going to be: every process that imports them
    (each Ray worker) then compiles them again. That is so under PYTHONDONTWRITEBYTECODE, or a read-only install
    without bytecode (`pip install --no-compile`); it cost ~86 s of a run's start on a GPU machine
    (benchmarks/README.md, cold_start.py). Checked on each package's `__init__` without importing it."""
    dont_write = sys.flags.dont_write_bytecode if dont_write is None else dont_write
    out = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or not (spec.origin or "").endswith(".py"):
            continue
        cached = Path(importlib.util.cache_from_source(spec.origin))  # under PYTHONPYCACHEPREFIX when it is set
        if cached.exists():
            continue
        folder = next(p for p in (cached.parent, *cached.parents) if p.exists())
        if dont_write or not os.access(folder, os.W_OK):
            out.append(name)
    return out


def warn_uncached_bytecode() -> None:
    names = uncached_bytecode()
    if names:
        log.warning(
            "start-up: no bytecode of %s is cached and none will be (PYTHONDONTWRITEBYTECODE=1, or a read-only install "
            "without it): every Ray worker compiles them again as it imports them, tens of seconds each. Run "
            "`python -m compileall -q <site-packages>` once, or set PYTHONPYCACHEPREFIX to a writable folder without "
            "PYTHONDONTWRITEBYTECODE", ", ".join(names))
