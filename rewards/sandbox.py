"""Run an untrusted Python program in a sandboxed subprocess (the parent side; see sandbox_guard.py for the child).

Defences, layered because none is complete on its own:
- wall-clock limit (parent), CPU / address-space / file-size / open-file / process-count rlimits (child);
- stdout/stderr go to files capped by RLIMIT_FSIZE (no pipe to drain, no deadlock, bounded disk use);
- a private temp dir (the "box") as cwd and HOME/TMPDIR: the only place the program may write, and, with the
  interpreter's stdlib, the allowed packages (numpy) and the library dirs they load from, the only place it may
  read. Writes have a quota (`max_write_mb`, `max_write_files`): in the jail the box is a size-limited tmpfs of
  the run's own mount namespace (gone with it); elsewhere the parent measures the box while the program runs
  and kills it past the quota. Afterwards the box is removed whatever it holds (sandbox_fs.remove_tree);
- OS-level isolation where the machine allows it, probed once per process (`probe_isolation`, logged at first
  use): as root a fresh network namespace, a mount-namespace "jail" (a private root holding only the readable
  paths, so even a Python under a 0700 /root works after the uid drop) and a drop to an unprivileged uid; Landlock
  (root or not) restricting every file-system access to the same list, denying TCP and scoping signals / abstract
  unix sockets. Each run takes its own uid from `uid_base + k`, reserved host-wide with a flock, so RLIMIT_NPROC
  counts only that run's processes, concurrent sandboxes cannot signal each other, and the final sweep can kill
  every process of that uid, including ones that left the process group; wherever the kernel has seccomp (root
  or not, Landlock or not) a syscall filter (sandbox_seccomp.py): no execve, no new namespaces, no ptrace,
  io_uring, bpf, mounts, keyrings...;
- a Python audit hook as a second layer (the only one where the OS offers nothing: then a warning is logged, or,
  with `require_os_isolation`, every run raises `SandboxIsolationError` instead);
- at the end the whole process group is SIGKILLed (start_new_session + killpg), whatever happened.
A failure only the sandbox can cause (its set-up failed, or isolation was required and is missing) is read from
the guard's own report ("setup_error", SandboxIsolationError), never from what the program prints or returns.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import marshal
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from . import sandbox_guard, sandbox_seccomp
from .sandbox_fs import host_paths, remove_tree, tree_usage

__all__ = ["RunResult", "SandboxIsolationError", "SandboxLimits", "host_paths", "probe_isolation", "run_program",
           "sandbox_limits_from_config"]

logger = logging.getLogger(__name__)

GUARD = str(Path(sandbox_guard.__file__).resolve())
# The guard and the modules it loads, compiled once per process (`compiled_guard`): compiling them from source in
# every run would cost about 15 ms a run (no bytecode cache is written for a script, nor where
# PYTHONDONTWRITEBYTECODE is set). `python -I -c BOOT GUARD <guard's code> SPEC` runs the compiled guard as
# __main__; the guard's path stays on the command line (it names the sandbox's processes).
GUARD_MODULES = ("sandbox_guard", "sandbox_os", "sandbox_wire", "sandbox_remote", "sandbox_grader")
BOOT = ("import marshal, sys\nguard, code, spec = sys.argv[1:4]\nsys.argv = [guard, spec]\n"
        "with open(code, 'rb') as f:\n    code = marshal.loads(f.read())\n"
        "exec(code, {'__name__': '__main__', '__file__': guard, '__builtins__': __builtins__})\n")
CODE_PARENT = Path(tempfile.gettempdir())  # fixed at import: a test's temporary tempdir must not collect it
SANDBOX_GID = 65534  # nogroup
# Comma-separated layers to leave out (netns, ipcns, jail, landlock, seccomp): for testing the fallbacks; never the uid
# drop.
DISABLE_ENV = "MIXRL_SANDBOX_DISABLE"
LAYERS = ("netns", "ipcns", "jail", "landlock", "seccomp")
# Held host-wide whatever tempfile.tempdir says later: a run must never share its uid with another's.
UID_LOCK_DIR = Path(tempfile.gettempdir()) / "mixrl-sandbox-uids"
QUOTA_POLL_S = 0.2  # how often the parent measures a box that has no tmpfs quota of its own


class SandboxIsolationError(RuntimeError):
    """OS-level isolation was required (`require_os_isolation`) but is not available on this machine."""


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
    # Refuse to run (SandboxIsolationError) unless file-system AND network isolation and the seccomp filter hold.
    require_os_isolation: bool = False
    # Third-party packages the program may import (their dirs, and "<name>.libs" next to them, become readable).
    packages: tuple[str, ...] = ("numpy",)
    # Write quota of one run: bytes on disk and entries (files, dirs...) in its box.
    max_write_mb: int = 32
    max_write_files: int = 4096


# rewards.code key -> SandboxLimits field, where the names differ.
CONFIG_KEYS = {"network_namespace": "netns", "sandbox_uid_base": "uid_base"}


def sandbox_limits_from_config(cfg: Mapping | None, **overrides) -> SandboxLimits:
    """The sandbox limits of a `rewards.code`-style mapping (the code reward's params, or the config section
    itself), then `overrides` (SandboxLimits field names). The one construction for every caller (the code
    reward, the code_interpreter and code_repo environments), so a setting like require_os_isolation reaches all of them.
    Keys that are no sandbox setting (mode, timeout_s, parallel...) are ignored; missing ones keep the default."""
    names = {f.name for f in fields(SandboxLimits)}
    values = {}
    for key, value in dict(cfg or {}).items():
        name = CONFIG_KEYS.get(key, key)
        if name in names and value is not None:
            values[name] = value
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise TypeError(f"not a sandbox limit: {unknown}")
    values.update(overrides)
    if isinstance(values.get("packages"), str):
        values["packages"] = (values["packages"],)
    kinds = {"wall_s": float, "cpu_s": int, "memory_mb": int, "output_bytes": int, "max_procs": int,
             "max_files": int, "uid_base": int, "max_write_mb": int, "max_write_files": int}
    for name, kind in kinds.items():
        if name in values:
            values[name] = kind(values[name])
    for name in ("netns", "require_os_isolation"):
        if name in values:
            values[name] = bool(values[name])
    if "packages" in values:
        values["packages"] = tuple(str(p) for p in values["packages"])
    return SandboxLimits(**values)


@dataclass
class RunResult:
    # ok | runtime_error | timeout | cpu_limit | memory | output_limit | write_limit | forbidden | unavailable
    # | killed | setup_error (the guard's own report: the sandbox, not the program, made it fail)
    status: str
    stdout: str = ""
    stderr_tail: str = ""
    exit_code: int | None = None
    passed: set[int] = field(default_factory=set)  # assert mode: indices of the asserts that passed
    detail: str = ""
    isolation: dict = field(default_factory=dict)  # what the guard set up for this run (its report)
    records: list[dict] = field(default_factory=list)  # graded mode: what the grader wrote, in order
    program: dict | None = None  # graded mode: how the program's process ended ({"exit"|"signal": n}), if it did


class _UidLease:
    """Host-wide exclusive use of one sandbox uid, via flock on a root-only lock file (freed if we die)."""

    def __init__(self, uid_base: int):
        lock_dir = UID_LOCK_DIR
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


def _disabled_layers() -> tuple[str, ...]:
    raw = os.environ.get(DISABLE_ENV, "")
    return tuple(sorted({p.strip() for p in raw.split(",") if p.strip() in LAYERS}))


# ------------------------------------------------------------------------------------------------- the probe
PROBE_PROGRAM = r"""
import errno, json, os, socket, sys
cfg = json.loads(sys.stdin.read())
r = {"uid": os.getuid()}
def attempt(fn):
    try:
        fn()
        return "allowed"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def read_outside():
    with open(cfg["canary"]) as f:
        f.read()
def dirfd_create():
    fd = os.open(cfg["canary_dir"], os.O_RDONLY)
    try:
        os.close(os.open("probe-escape", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
def read_stdlib():
    with open(cfg["stdlib_file"], "rb") as f:
        f.read(1)
def tcp():
    s = socket.socket()
    s.settimeout(1.0)
    try:
        s.connect(("127.0.0.1", 9))
    finally:
        s.close()
def mem():
    open("/proc/self/mem", "rb").close()
def execve():  # a path that does not exist: ENOENT unless the seccomp filter answers first
    os.execv("/nonexistent/mixrl-probe", ["probe"])
def sysv_ipc():  # a System V shared-memory segment would outlive the run: EPERM from the seccomp filter
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    seg = libc.shmget(0, 4096, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
    if seg < 0:
        raise OSError(ctypes.get_errno(), "shmget")
    libc.shmctl(seg, 0, None)  # IPC_RMID: the probe leaves nothing behind
r["read_outside"] = attempt(read_outside)
r["dirfd_create_outside"] = attempt(dirfd_create)
r["read_stdlib"] = attempt(read_stdlib)
r["tcp_connect"] = attempt(tcp)
r["proc_self_mem"] = attempt(mem)
r["execve"] = attempt(execve)
r["sysv_ipc"] = attempt(sysv_ipc)
print(json.dumps(r))
"""

_probe_lock = threading.Lock()
_probe_cache: dict[tuple, dict] = {}
_warned: set[str] = set()


def probe_isolation(limits: SandboxLimits | None = None, refresh: bool = False) -> dict:
    """What isolation the sandbox gets on this machine, found by actually running a probe program in it
    (cached per process). Keys: os_level (file-system AND network isolated at the OS level, and the seccomp
    filter on), fs_isolated, net_isolated, seccomp, layers (the guard's report: uid_drop, netns, jail, proc,
    landlock ABI, seccomp (denied syscalls), box_tmpfs, interp_ok, errors),
    checks (what the probe could do from inside: "allowed" or the errno name), description (one line)."""
    limits = limits or SandboxLimits()
    key = (limits.uid_base, limits.netns, limits.packages, _disabled_layers())
    with _probe_lock:
        if refresh or key not in _probe_cache:
            _probe_cache[key] = _run_probe(limits)
        return _probe_cache[key]


def _run_probe(limits: SandboxLimits) -> dict:
    info = {"os_level": False, "fs_isolated": False, "net_isolated": False, "seccomp": False, "layers": {},
            "checks": {}, "disabled": list(_disabled_layers())}
    canary_dir = Path(tempfile.mkdtemp(prefix="mixrl-probe-"))
    try:
        os.chmod(canary_dir, 0o1777)  # world-writable like /tmp: only OS-level confinement keeps it out
        (canary_dir / "canary").write_text("secret")
        os.chmod(canary_dir / "canary", 0o644)
        paths = host_paths(tuple(limits.packages))
        cfg = {"canary": str(canary_dir / "canary"), "canary_dir": str(canary_dir),
               "stdlib_file": os.path.join(paths["stdlib"][0], "os.py")}
        probe_limits = SandboxLimits(**{**limits.__dict__, "wall_s": max(limits.wall_s, 10.0),
                                        "require_os_isolation": False})
        res = _execute(PROBE_PROGRAM, probe_limits, stdin=json.dumps(cfg), mode="probe")
        info["layers"] = res.isolation
        if res.status == "ok":
            checks = json.loads(res.stdout.strip().splitlines()[-1])
            info["checks"] = checks
            escaped = (canary_dir / "probe-escape").exists()
            info["fs_isolated"] = (checks["read_outside"] != "allowed" and checks["dirfd_create_outside"] != "allowed"
                                   and not escaped and bool(res.isolation.get("jail") or res.isolation.get("landlock")))
            info["net_isolated"] = checks["tcp_connect"] not in ("allowed", "ECONNREFUSED", "ETIMEDOUT")
            info["interp_ok"] = checks["read_stdlib"] == "allowed"
            info["seccomp"] = bool(res.isolation.get("seccomp")) and checks["execve"] == "EPERM"
        else:
            info["error"] = f"probe run failed: {res.status}: {res.detail or res.stderr_tail[-300:]}"
        root_ok = res.isolation.get("uid_drop", False) or not res.isolation.get("root", os.geteuid() == 0)
        info["os_level"] = bool(info["fs_isolated"] and info["net_isolated"] and info["seccomp"] and root_ok)
    except Exception as exc:  # noqa: BLE001 - a probe failure means "no verified isolation", never a crash
        info["error"] = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        remove_tree(str(canary_dir))
    info["description"] = describe_isolation(info)
    return info


def describe_isolation(info: dict) -> str:
    lay, chk = info.get("layers", {}), info.get("checks", {})
    parts = []
    if lay.get("uid_drop"):
        parts.append("per-run unprivileged uid")
    elif lay.get("root"):
        parts.append("NO uid drop")
    if lay.get("netns"):
        parts.append("network namespace")
    if lay.get("ipcns"):
        parts.append("IPC namespace")
    if lay.get("jail"):
        parts.append("mount-namespace jail (private root" + (", own /proc" if lay.get("proc") else "") + ")")
    if lay.get("landlock"):
        abi = lay["landlock"]
        extra = (", TCP denied" if abi >= 4 else "") + (", signals/abstract sockets scoped" if abi >= 6 else "")
        parts.append(f"Landlock ABI {abi} (file-system allowlist{extra})")
    if lay.get("seccomp"):
        parts.append(f"seccomp filter ({lay['seccomp']} syscalls denied: execve, namespaces, ptrace, io_uring, "
                     "bpf, mounts, keyrings, System V IPC...; the program's process: no new processes)")
    if lay.get("box_tmpfs"):
        parts.append("write quota (box on a size-limited tmpfs)")
    errors = lay.get("errors") or {}
    missing = [f"{k}: {v}" for k, v in errors.items()]
    if info.get("disabled"):
        missing.append(f"disabled by {DISABLE_ENV}: {','.join(info['disabled'])}")
    verified = ", ".join(f"{k}={v}" for k, v in chk.items() if k != "uid")
    if info.get("os_level"):
        head = "code sandbox: OS-level isolation"
    else:
        head = ("code sandbox: NO complete OS-level isolation (file system "
                + ("ok" if info.get("fs_isolated") else "NOT isolated") + ", network "
                + ("ok" if info.get("net_isolated") else "NOT isolated") + ", syscall filter "
                + ("ok" if info.get("seccomp") else "MISSING")
                + "); falling back to the Python-level audit hook for the rest")
    text = f"{head} [{'; '.join(parts) or 'no OS layer'}] + rlimits + Python audit hook"
    if info.get("interp_ok") is False or lay.get("interp_ok") is False:
        text += ("; WARNING: the sandbox uid cannot read the Python installation (no mount namespace): only "
                 "modules imported beforehand are available, other imports fail (status 'unavailable', scored 0)")
    if verified:
        text += f"; probe from inside: {verified}"
    if missing:
        text += f"; unavailable: {'; '.join(missing)}"
    if info.get("error"):
        text += f"; {info['error']}"
    return text


def _ensure_isolation(limits: SandboxLimits) -> dict:
    info = probe_isolation(limits)
    tag = info["description"]
    if tag not in _warned:
        _warned.add(tag)
        (logger.info if info["os_level"] else logger.warning)(tag)
    if limits.require_os_isolation and not info["os_level"]:
        raise SandboxIsolationError(
            "require_os_isolation is set but this machine does not give the code sandbox OS-level isolation; "
            f"refusing to run untrusted code. {tag}")
    return info


# ---------------------------------------------------------------------------------------------- classification
NO_SPACE = ("No space left on device", "Disk quota exceeded")  # ENOSPC (the tmpfs quota), EDQUOT


def _classify(res: RunResult, rc: int | None, timed_out: bool, out_size: int, limits: SandboxLimits,
              over_quota: bool = False) -> None:
    """The run's status. What only the sandbox could have caused (a set-up failure, a refusal) is read from the
    guard's header, written before any untrusted code ran; the program's exit code and stderr, which it controls,
    only ever label its own failures (all scored 0)."""
    err = res.stderr_tail
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    quota = f"write quota {limits.max_write_mb} MB / {limits.max_write_files} files"
    head = res.isolation
    if not head.get("ready"):  # no untrusted code ran: this stderr is the guard's own
        res.status, res.detail = "setup_error", str(head.get("setup_error") or err.strip()[-300:]
                                                    or f"the sandbox guard ended (exit code {rc}) before it was set up")
    elif over_quota:  # measured by the parent: it killed the run, or found the box over quota afterwards
        res.status, res.detail = "write_limit", quota
    elif timed_out:
        res.status, res.detail = "timeout", f"wall-clock limit {limits.wall_s:g}s"
    elif rc == sandbox_guard.VIOLATION_EXIT and sandbox_guard.MARKER in err:
        res.status = "forbidden"
        res.detail = err.split(sandbox_guard.MARKER, 1)[1].strip().splitlines()[0][:200]
    elif rc != 0 and lines and any(m in lines[-1] for m in NO_SPACE):
        res.status, res.detail = "write_limit", f"{quota} ({lines[-1][:150]})"
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
        res.status, res.detail = "runtime_error", (lines[-1][:200] if lines else f"exit code {rc}")
        _label_sandbox_failure(res, err, lines, limits)
    else:
        res.status = "ok"


def _label_sandbox_failure(res: RunResult, err: str, lines: list[str], limits: SandboxLimits) -> None:
    """A runtime error the sandbox refused on purpose ("forbidden") or that names a module the sandbox does not
    provide ("unavailable") says so. Both are the program's failures, scored 0: they are read from its stderr, which
    it writes, so they can never make a sample abstain (only the guard's own report can: "setup_error"). Where
    the guard found the Python installation unreadable (no mount namespace, a Python under a 0700 home) the probe
    warns at start that only preloaded modules can be imported."""
    last = lines[-1] if lines else ""
    if sandbox_guard.DENIED in last:
        res.status, res.detail = "forbidden", last[:200]
        return
    unreadable = res.isolation.get("interp_ok") is False
    name = _missing_module(err)
    if name is None:
        if unreadable and (last.startswith("ImportError") or (last.startswith("PermissionError") and any(
                f"'{d}/" in last for d in host_paths(tuple(limits.packages))["stdlib"]))):
            res.status = "unavailable"
            res.detail = f"the sandbox uid cannot read the Python installation ({last[:150]})"
        return
    import importlib.util

    try:
        exists = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        exists = False
    if not exists:
        return  # a module that exists nowhere: the program's mistake
    if name in sys.stdlib_module_names or name in limits.packages:
        why = ("the sandbox uid cannot read the Python installation and no mount namespace was available"
               if unreadable else "it is not reachable inside the sandbox")
        res.status, res.detail = "unavailable", f"module {name!r} exists on the host but {why}"
    else:
        res.status = "forbidden"
        res.detail = (f"module {name!r} is not available in the sandbox (third-party packages allowed: "
                      f"{', '.join(limits.packages) or 'none'})")


def _missing_module(err: str) -> str | None:
    for line in reversed(err.strip().splitlines()):
        if line.startswith("ModuleNotFoundError: No module named "):
            return line.split("named ", 1)[1].strip().strip("'\"").split(".")[0]
    return None


def _classify_graded(res: RunResult, rc: int | None, timed_out: bool, out_size: int, limits: SandboxLimits,
                     over_quota: bool) -> None:
    """A graded run's status: the guard's header, then the grader's records (a set-up failure of the program's
    process, and how that process ended), then what the parent saw. The grader's own process may have been
    killed by the program (same uid): that loses verdicts, never adds one."""
    failed_setup = next((r["setup_error"] for r in res.records if "setup_error" in r), None)
    done = next((r for r in res.records if r.get("done")), None)
    res.program = (done or {}).get("program") or next((r["program"] for r in res.records if r.get("program")), None)
    if failed_setup is not None and res.isolation.get("ready"):
        res.status, res.detail = "setup_error", str(failed_setup)[:300]
        return
    prog = res.program or {}
    sig, code = prog.get("signal"), prog.get("exit")
    # The program's own fate decides what limit it hit; the grader process exiting 0 is the normal end.
    prog_rc = -sig if isinstance(sig, int) else code if isinstance(code, int) else (rc if done is None else 0)
    _classify(res, prog_rc, timed_out, out_size, limits, over_quota)
    if res.status == "ok" and done is None:
        res.status, res.detail = "killed", f"the grader's process ended before the tests finished (exit {rc})"


# ------------------------------------------------------------------------------------------------- running
def run_program(program: str, limits: SandboxLimits, stdin: str = "", asserts: list[str] | None = None) -> RunResult:
    """Run `program` once. stdio mode (asserts None): `stdin` is its input, its stdout is what it did. assert mode:
    the program is executed (as module `solution`, so `if __name__ == "__main__"` blocks do not run) in one
    process and the assert snippets run in order in another (`run_graded`); `passed` holds the snippets that held.
    Raises SandboxIsolationError if `limits.require_os_isolation` is set and OS-level isolation is missing."""
    if asserts is not None:
        return run_graded(program, limits, {"kind": "asserts", "snippets": list(asserts)})
    return _run(program, limits, stdin, "stdio")


def run_graded(program: str, limits: SandboxLimits, grader: dict) -> RunResult:
    """Run `program` in one process and the tests of `grader` in another that the program cannot reach
    (sandbox_guard.py, graded mode). grader: {"kind": "asserts", "snippets": [...]} or {"kind": "suite", "tests":
    {path: source}, "select": [...] | None, "packages": [...], "message_chars": n, "output_chars": n}
    (sandbox_grader.py). The verdicts are in `records` (and `passed` for asserts)."""
    res = _run(program, limits, json.dumps(grader), "graded")
    for r in res.records:
        if r.get("ok") is True and isinstance(r.get("unit"), int):
            res.passed.add(r["unit"])
    return res


def _run(program: str, limits: SandboxLimits, stdin: str, mode: str) -> RunResult:
    probe = _ensure_isolation(limits)
    res = _execute(program, limits, stdin=stdin, mode=mode)
    lay = res.isolation
    if lay and probe.get("os_level") and not (lay.get("jail") or lay.get("landlock")):
        msg = f"code sandbox: this run got less isolation than the probe found: {lay}"
        if msg not in _warned:
            _warned.add(msg)
            logger.warning(msg)
    return res


def _execute(program: str, limits: SandboxLimits, stdin: str, mode: str) -> RunResult:
    is_root = os.geteuid() == 0
    lease = _UidLease(limits.uid_base) if is_root else None
    work = Path(tempfile.mkdtemp(prefix="mixrl-sbx-")).resolve()  # ours only (0700): stdin/out/err/result, jail
    box = Path(tempfile.mkdtemp(prefix="mixrl-box-")).resolve()  # the program's own dir
    proc = None
    try:
        compiled = compiled_guard()
        if lease is not None:
            kill_uid_processes(lease.uid)  # leftovers of a holder that died mid-run
            os.chown(box, lease.uid, SANDBOX_GID)
        (box / "solution.py").write_text(program, encoding="utf-8", errors="replace")
        (work / "jail").mkdir(mode=0o700)
        (work / "stdin").write_text(stdin, encoding="utf-8", errors="replace")
        os.chmod(work / "stdin", 0o644)  # readable as the sandbox's /dev/stdin (stdio mode)
        spec = {
            "mode": mode,
            "program": str(box / "solution.py"),
            "root": str(box),
            "jail_dir": str(work / "jail"),
            "stdin_path": str(work / "stdin"),
            "uid": lease.uid if lease else os.getuid(),
            "gid": SANDBOX_GID if lease else os.getgid(),
            "cpu_s": int(limits.cpu_s),
            "memory_mb": int(limits.memory_mb),
            # Files the program writes share this cap with its stdout; +1 so "exactly at the cap" is detectable.
            "fsize_bytes": int(limits.output_bytes) + 1,
            "max_files": int(limits.max_files),
            "max_procs": int(limits.max_procs),
            "max_write_mb": int(limits.max_write_mb),
            "max_write_files": int(limits.max_write_files),
            "netns": bool(limits.netns),
            "require": bool(limits.require_os_isolation),
            "disable": list(_disabled_layers()),
            "seccomp": _seccomp_spec(),
            "packages": list(limits.packages),
            "paths": host_paths(tuple(limits.packages)),
            "compiled": compiled,
        }
        env = {
            "PATH": "/usr/bin:/bin", "HOME": str(box), "TMPDIR": str(box), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        }
        result_fd = os.open(work / "result", os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with open(work / "stdin", "rb") as fin, open(work / "stdout", "w+b") as fout, \
                open(work / "stderr", "w+b") as ferr, open(result_fd, "r+b", closefd=True) as fres:
            spec["result_fd"] = result_fd
            timed_out = over_quota = False
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-c", BOOT, GUARD, compiled["sandbox_guard"], json.dumps(spec)],
                    stdin=fin, stdout=fout, stderr=ferr,
                    cwd=box, env=env, start_new_session=True, pass_fds=(result_fd,), close_fds=True,
                )
                timed_out, over_quota = _wait(proc, box, limits)
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
            result = fres.read(sandbox_guard.HEADER_BYTES + sandbox_guard.RESULT_LIMIT)
        res = RunResult(status="", stdout=stdout, stderr_tail=stderr_tail,
                        exit_code=None if proc is None else proc.returncode)
        res.isolation = _json_object(result[:sandbox_guard.HEADER_BYTES].split(b"\n", 1)[0])
        res.records = [r for r in map(_json_object, result[sandbox_guard.HEADER_BYTES:].split(b"\n")) if r]
        if res.isolation.get("refused") and not res.isolation.get("ready"):
            raise SandboxIsolationError(f"code sandbox refused to run: {res.isolation['refused']}")
        files, used = remove_tree(str(box))  # no process of the run is left to write: this count is final
        over_quota = over_quota or _over(files, used, limits)
        classify = _classify_graded if mode == "graded" else _classify
        classify(res, res.exit_code, timed_out, out_size, limits, over_quota)
        return res
    finally:
        remove_tree(str(box))
        remove_tree(str(work))
        if lease is not None:
            lease.release()


_compiled: dict[int, dict[str, str]] = {}  # pid -> compiled_guard() of that process
_compiled_lock = threading.Lock()


def compiled_guard() -> dict[str, str]:
    """{module name: file of its marshalled code} for GUARD_MODULES, compiled once per process into a private
    directory (0700, removed at that process's exit; a forked child compiles its own), which the guard runs instead
    of compiling the sources in every run."""
    pid = os.getpid()
    with _compiled_lock:
        found = _compiled.get(pid)
        if found is not None and all(os.path.exists(p) for p in found.values()):
            return found
        root = Path(tempfile.mkdtemp(prefix="mixrl-sandbox-code-", dir=CODE_PARENT))
        atexit.register(_remove_own, root, pid)
        out = {}
        for name in GUARD_MODULES:
            source = Path(__file__).with_name(f"{name}.py")
            code = compile(source.read_text(encoding="utf-8"), str(source), "exec", dont_inherit=True)
            (root / f"{name}.bin").write_bytes(marshal.dumps(code))
            out[name] = str(root / f"{name}.bin")
        _compiled[pid] = out
        return out


def _remove_own(root: Path, pid: int) -> None:
    if os.getpid() == pid:  # not from a forked child that inherited the exit handler
        shutil.rmtree(root, ignore_errors=True)


def _json_object(line: bytes) -> dict:
    try:
        value = json.loads(line.rstrip(b"\0").decode("utf-8", "replace") or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _seccomp_spec() -> dict:
    prog = sandbox_seccomp.host_filter()
    if prog is None:
        return {"error": f"no seccomp syscall table for {os.uname().machine}"}
    return {"filter": prog.hex(), "denied": len(sandbox_seccomp.denied_numbers(sandbox_seccomp.host_arch())),
            "no_process": sandbox_seccomp.host_no_process_filter().hex()}


def _over(files: int, used: int, limits: SandboxLimits) -> bool:
    return files > limits.max_write_files or used > limits.max_write_mb * (1 << 20)


def _wait(proc: subprocess.Popen, box: Path, limits: SandboxLimits) -> tuple[bool, bool]:
    """Wait for the run to end: (timed out, over the write quota). A box on the host disk (no tmpfs of its own:
    no jail, or not root) is measured every QUOTA_POLL_S, so a program cannot fill the disk until its time is up.
    The end is seen through a pidfd the moment it comes (Popen.wait with a timeout polls, up to 50 ms late)."""
    deadline = time.monotonic() + limits.wall_s
    try:
        pidfd = os.pidfd_open(proc.pid)
        ended = select.poll()  # not select(): a worker may hold descriptors past FD_SETSIZE
        ended.register(pidfd, select.POLLIN)
    except (AttributeError, OSError):  # Python < 3.9, Linux < 5.3
        pidfd = None
    try:
        while True:
            wait_s = max(0.0, min(QUOTA_POLL_S, deadline - time.monotonic()))
            if pidfd is not None:
                if ended.poll(wait_s * 1000):
                    proc.wait()
                    return False, False
            else:
                try:
                    proc.wait(timeout=wait_s)
                    return False, False
                except subprocess.TimeoutExpired:
                    pass
            if time.monotonic() >= deadline:
                return True, False
            files, used = tree_usage(str(box), limits.max_write_files, limits.max_write_mb * (1 << 20))
            if _over(files, used, limits):
                return False, True
    finally:
        if pidfd is not None:
            os.close(pidfd)


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
