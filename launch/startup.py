"""The start-up timeline: seconds from the command to each milestone of a run's start (the model found or built, Ray
up, each actor ready, the weight sync set up) and to the end of its first step. Logged as one line after step 1,
written to run_dir/summary.json under `start_up` and to the W&B summary (`summary/start_up/<milestone>`), so a slow
start shows where its time went.

An actor's milestone is when its `ready` call returned (its constructor had finished), marked from a Ray thread as
it happens (`Cluster._watch`) rather than when the driver got round to waiting for it: actors start side by side,
so the order of the driver's waits says nothing about which one was slow. Marks may come from several threads.
"""

from __future__ import annotations

import threading
import time


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
