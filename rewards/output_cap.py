"""What a reward pool worker prints, capped per sample and per worker.

A reward of the user's own runs in the killable pool (rewards/process_pool.py), whose workers inherit the reward
worker's stdout and stderr: `run_dir/train.log` in a run. Uncapped, one reward that prints in a loop filled 3.36 GB
of log in two steps. So each pool worker points its file descriptors 1 and 2 (prints, `logging`, C-level writes
alike) at a pipe that a thread of its own drains: of each sample's output the first `per_sample_bytes` are written
on to where the output went before, the rest is counted and replaced by one line saying how much was dropped; once
the worker has passed on `per_worker_bytes` in all, it drops everything else and says so once.
"""

from __future__ import annotations

import fcntl
import os
import sys
import termios
import threading
import time

READ_CHUNK = 1 << 16


class CappedOutput:
    """The cap itself, fed bytes by the worker's reader thread; `begin`/`end` bracket one sample (a task)."""

    def __init__(self, write, per_sample_bytes: int, per_worker_bytes: int, who: str = "reward pool worker"):
        self._write = write  # callable(bytes): where kept output goes
        self.per_sample, self.per_worker = int(per_sample_bytes), int(per_worker_bytes)
        self.who = who
        self.kept_total = 0
        self._label, self._seen, self._dropped = "outside a sample", 0, 0
        self._worker_full_said = False
        self.lock = threading.Lock()

    def feed(self, data: bytes) -> None:
        with self.lock:
            self._seen += len(data)
            room = max(0, min(self.per_sample - (self._seen - len(data)), self.per_worker - self.kept_total))
            keep = data[:room]
            if keep:
                self.kept_total += len(keep)
                self._write(keep)
            self._dropped += len(data) - len(keep)

    def begin(self, label: str) -> None:
        with self.lock:
            self._close_sample()
            self._label, self._seen, self._dropped = label, 0, 0

    def end(self) -> None:
        with self.lock:
            self._close_sample()
            self._label, self._seen, self._dropped = "outside a sample", 0, 0

    def _close_sample(self) -> None:
        if not self._dropped:
            return
        if self.kept_total >= self.per_worker:
            if not self._worker_full_said:
                self._worker_full_said = True
                self._write(f"\n[{self.who} {os.getpid()}: its {self.per_worker} bytes of output are used up; "
                            "everything it prints from now on is dropped (rewards.output.max_mb_per_worker)]\n"
                            .encode())
            return
        self._write(f"\n[{self.who} {os.getpid()}: {self._dropped} more bytes of output of {self._label} dropped "
                    f"(rewards.output.max_kb_per_sample)]\n".encode())


class _Capture:
    """File descriptors 1 and 2 of this process redirected through a pipe into a `CappedOutput`."""

    def __init__(self, cap: CappedOutput, read_fd: int):
        self.cap, self._read_fd = cap, read_fd
        self._busy = threading.Event()  # the reader holds bytes it has read but not yet fed
        threading.Thread(target=self._drain, name="reward-output-cap", daemon=True).start()

    def _drain(self) -> None:
        while True:
            data = os.read(self._read_fd, READ_CHUNK)
            if not data:
                return
            self._busy.set()
            try:
                self.cap.feed(data)
            finally:
                self._busy.clear()

    def settle(self, timeout_s: float = 1.0) -> None:
        """Wait until everything written so far has been fed, so the next sample is not charged for it."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a reward may have closed or replaced them
                pass
        deadline = time.monotonic() + timeout_s
        buf = bytearray(4)
        while time.monotonic() < deadline:
            fcntl.ioctl(self._read_fd, termios.FIONREAD, buf)
            if int.from_bytes(buf, sys.byteorder) == 0 and not self._busy.is_set():
                return
            time.sleep(0.001)


_capture: _Capture | None = None


def capture_output(per_sample_bytes: int, per_worker_bytes: int) -> None:
    """In a pool worker, at start: route fds 1 and 2 through the cap (a no-op when both caps are 0 = off)."""
    global _capture
    if per_sample_bytes <= 0 and per_worker_bytes <= 0:
        return
    dest = os.dup(2)

    def write(data: bytes) -> None:
        try:
            os.write(dest, data)
        except OSError:  # the log is gone or full: the worker's output is not worth failing a reward for
            pass

    read_fd, write_fd = os.pipe()
    for fd in (1, 2):
        os.dup2(write_fd, fd)
    os.close(write_fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, errors="backslashreplace", closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, errors="backslashreplace", closefd=False)
    big = 1 << 62
    _capture = _Capture(CappedOutput(write, per_sample_bytes or big, per_worker_bytes or big), read_fd)


def begin_sample(label: str) -> None:
    if _capture is not None:
        _capture.settle()
        _capture.cap.begin(label)


def end_sample() -> None:
    if _capture is not None:
        _capture.settle()
        _capture.cap.end()
