"""Run an untrusted Python program in a sandboxed subprocess (the parent side; see sandbox_guard.py for the child).

Defences, layered because none is complete on its own:
- wall-clock limit (parent), CPU / address-space / file-size / open-file / process-count rlimits (child);
- stdout/stderr go to files capped by RLIMIT_FSIZE (no pipe to drain, no deadlock, bounded disk use);
- a private temp dir as cwd and HOME/TMPDIR, removed afterwards;
- when running as root: a fresh network namespace, then a drop to an unprivileged uid. Each run takes its own
  uid from `uid_base + k`, reserved host-wide with a flock, so RLIMIT_NPROC counts only that run's processes,
  concurrent sandboxes (even of other reward workers) cannot signal each other, and the final sweep can kill
  every process of that uid, including ones that left the process group;
- a Python audit hook (no sockets, no process creation, no writes outside the temp dir, no introspection);
- at the end the whole process group is SIGKILLed (start_new_session + killpg), whatever happened.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import sandbox_guard

GUARD = str(Path(sandbox_guard.__file__).resolve())
SANDBOX_GID = 65534  # nogroup


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 1024
    output_bytes: int = 1 << 20
    max_procs: int = 8  # RLIMIT_NPROC (threads count too); as non-root it counts all the user's processes
    max_files: int = 64
    netns: bool = True
    uid_base: int = 60000


@dataclass
class RunResult:
    # ok | runtime_error | timeout | cpu_limit | memory | output_limit | forbidden | killed | setup_error
    status: str
    stdout: str = ""
    stderr_tail: str = ""
    exit_code: int | None = None
    passed: set[int] = field(default_factory=set)  # assert mode: indices of the asserts that passed
    detail: str = ""


class _UidLease:
    """Host-wide exclusive use of one sandbox uid, via flock on a root-only lock file (freed if we die)."""

    def __init__(self, uid_base: int):
        lock_dir = Path(tempfile.gettempdir()) / "mixrl-sandbox-uids"
        lock_dir.mkdir(mode=0o700, exist_ok=True)
        span = 4096
        start = random.randrange(span)
        for k in range(span):
            uid = uid_base + (start + k) % span
            fd = os.open(lock_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self.uid, self._fd = uid, fd
            return
        raise RuntimeError("no free sandbox uid")

    def release(self) -> None:
        os.close(self._fd)  # closing drops the flock


def kill_uid_processes(uid: int) -> int:
    """SIGKILL every process whose real uid is `uid` (only ever a sandbox uid). Returns how many were found."""
    found = 0
    for _ in range(5):  # a process may fork while we sweep; repeat until nothing is left
        pids = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/status", "rb") as f:
                    for line in f:
                        if line.startswith(b"Uid:"):
                            if int(line.split()[1]) == uid:
                                pids.append(int(entry.name))
                            break
            except (OSError, ValueError):
                continue
        if not pids:
            break
        found += len(pids)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return found


def _classify(res: RunResult, rc: int | None, timed_out: bool, out_size: int, limits: SandboxLimits) -> None:
    err = res.stderr_tail
    if timed_out:
        res.status, res.detail = "timeout", f"wall-clock limit {limits.wall_s:g}s"
    elif rc == sandbox_guard.VIOLATION_EXIT and sandbox_guard.MARKER in err:
        res.status = "forbidden"
        res.detail = err.split(sandbox_guard.MARKER, 1)[1].strip().splitlines()[0][:200]
    elif rc == sandbox_guard.SETUP_ERROR_EXIT:
        res.status, res.detail = "setup_error", err.strip()[-300:]
    elif rc == -signal.SIGXCPU:
        res.status, res.detail = "cpu_limit", f"CPU limit {limits.cpu_s}s"
    elif out_size > limits.output_bytes or rc == -signal.SIGXFSZ or "File too large" in err:
        res.status, res.detail = "output_limit", f"output over {limits.output_bytes} bytes"
    elif "MemoryError" in err:
        res.status, res.detail = "memory", f"memory limit {limits.memory_mb} MB"
    elif rc is not None and rc < 0:
        sig = -rc
        name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
        res.status = "cpu_limit" if sig == signal.SIGKILL else "killed"
        res.detail = f"CPU hard limit {limits.cpu_s + 1}s" if sig == signal.SIGKILL else f"killed by {name}"
    elif rc != 0:
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        res.status, res.detail = "runtime_error", (lines[-1][:200] if lines else f"exit code {rc}")
    else:
        res.status = "ok"


def run_program(program: str, limits: SandboxLimits, stdin: str = "", asserts: list[str] | None = None) -> RunResult:
    """Run `program` once. stdio mode (asserts None): `stdin` is its input. assert mode: the program is executed
    (as module `solution`, so `if __name__ == "__main__"` blocks do not run), then each assert snippet in turn."""
    is_root = os.geteuid() == 0
    lease = _UidLease(limits.uid_base) if is_root else None
    work = Path(tempfile.mkdtemp(prefix="mixrl-sbx-"))  # ours only (0700): stdin/stdout/stderr/result files
    box = Path(tempfile.mkdtemp(prefix="mixrl-box-"))  # the program's own dir
    proc = None
    try:
        if lease is not None:
            kill_uid_processes(lease.uid)  # leftovers of a holder that died mid-run
            os.chown(box, lease.uid, SANDBOX_GID)
        (box / "solution.py").write_text(program, encoding="utf-8", errors="replace")
        nonce = secrets.token_hex(16)
        if asserts is not None:
            stdin = json.dumps({"nonce": nonce, "snippets": asserts})
        (work / "stdin").write_text(stdin, encoding="utf-8", errors="replace")
        spec = {
            "mode": "stdio" if asserts is None else "assert",
            "program": str(box / "solution.py"),
            "root": str(box),
            "uid": lease.uid if lease else os.getuid(),
            "gid": SANDBOX_GID if lease else os.getgid(),
            "cpu_s": int(limits.cpu_s),
            "memory_mb": int(limits.memory_mb),
            # Files the program writes share this cap with its stdout; +1 so "exactly at the cap" is detectable.
            "fsize_bytes": int(limits.output_bytes) + 1,
            "max_files": int(limits.max_files),
            "max_procs": int(limits.max_procs),
            "netns": bool(limits.netns),
        }
        env = {
            "PATH": "/usr/bin:/bin", "HOME": str(box), "TMPDIR": str(box), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        }
        with open(work / "stdin", "rb") as fin, open(work / "stdout", "w+b") as fout, \
                open(work / "stderr", "w+b") as ferr, open(work / "result", "w+b") as fres:
            spec["result_fd"] = fres.fileno()
            timed_out = False
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-I", GUARD, json.dumps(spec)], stdin=fin, stdout=fout, stderr=ferr,
                    cwd=box, env=env, start_new_session=True, pass_fds=(fres.fileno(),), close_fds=True,
                )
                proc.wait(timeout=limits.wall_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                if proc is not None:
                    _kill_group(proc)
                if lease is not None:
                    kill_uid_processes(lease.uid)
            out_size = os.fstat(fout.fileno()).st_size
            fout.seek(0)
            stdout = fout.read(limits.output_bytes).decode("utf-8", errors="replace")
            err_size = os.fstat(ferr.fileno()).st_size
            ferr.seek(max(0, err_size - 4000))
            stderr_tail = ferr.read().decode("utf-8", errors="replace")
            fres.seek(0)
            result_lines = fres.read(1 << 20).decode("ascii", errors="replace").splitlines()
        res = RunResult(status="", stdout=stdout, stderr_tail=stderr_tail,
                        exit_code=None if proc is None else proc.returncode)
        for line in result_lines:
            parts = line.split()
            if len(parts) == 3 and parts[0] == "PASS" and parts[2] == nonce and parts[1].isdigit():
                res.passed.add(int(parts[1]))
        _classify(res, res.exit_code, timed_out, out_size, limits)
        return res
    finally:
        if lease is not None:
            lease.release()
        shutil.rmtree(box, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the sandbox's whole process group (its session leader's pgid == its pid) and reap the leader."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored; only a D-state process
        pass
