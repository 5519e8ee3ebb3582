"""A run directory belongs to one run at a time: the run holds an exclusive lock on `run_dir/.lock` for as long as
it lives (the kernel drops it when the process dies, even by kill -9), and a second run on the same run_dir is
refused before it writes anything there.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

import yaml

from rl.config import ConfigError


def run_dir_problem(run_dir: Path) -> str | None:
    """Why `run_dir` cannot be a run's directory (it, or a folder above it, exists and is not a directory), or None."""
    for p in (run_dir, *run_dir.parents):
        try:
            if p.is_dir():
                return None
            if p.exists():
                return f"{p} is a file, not a directory; choose another run_dir"
        except OSError as e:  # e.g. no permission to look: the run's own mkdir says so
            return f"{p} cannot be used ({e.strerror or e})"
    return None


class RunDirLock:
    def __init__(self, run_dir: Path):
        problem = run_dir_problem(Path(run_dir))
        if problem:
            raise ConfigError(f"run_dir={run_dir}: {problem}")
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / ".lock"
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(self._fd, 4096, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(self._fd)
            raise ConfigError(f"run_dir={run_dir} is in use by another run ({holder}); wait for it to end, or choose "
                              "another run_dir") from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                        "started": time.strftime("%Y-%m-%d %H:%M:%S")}).encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the lock
            self._fd = None


def write_config(run_dir: Path, cfg: dict) -> None:
    """The resolved config of this run, next to its outputs (Hydra's own copy is off: it would be written before
    the lock is taken, over the config of a run that holds it)."""
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
