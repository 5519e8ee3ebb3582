"""Ray workers' output into the run's log file (`logger.worker_logs=file`, the default): `to_run_log` runs first
in every worker process (Ray's `worker_process_setup_hook`) and points its stdout and stderr, Python's logging
included, at `run_dir/train.log`, where the driver's own log lines go too. Lines are appended, so the processes
of a run share the file."""

from __future__ import annotations

import logging
import os
import sys


def to_run_log() -> None:
    path = os.environ.get("MIXRL_WORKER_LOG")
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for target in (1, 2):  # C-level writes too (DeepSpeed, NCCL, vLLM's engine core)
        os.dup2(fd, target)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    root = logging.getLogger()
    root.addHandler(run_log_handler(sys.stderr))
    if root.level == logging.NOTSET or root.level > logging.INFO:
        root.setLevel(logging.INFO)


def run_log_handler(stream) -> logging.Handler:
    """The handler of a worker's lines in the run's log: one record, one line where its message is one line (what
    came from a sample is escaped at the call, `rewards.text.log_safe`)."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(f"%(asctime)s [worker pid {os.getpid()}] %(levelname)s %(name)s: %(message)s"))
    return handler
