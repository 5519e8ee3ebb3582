"""The code sandbox's seccomp filter and library list: the BPF program checked as a pure function on each
architecture, exec (an anonymous memory file included), new namespaces, io_uring and keyrings denied from inside
the sandbox, past the Python audit hook and with the OS layers alone; the probe reports the filter and the refuse
switch requires it; the system Python's dist-packages are out of reach."""

import base64
import errno
import os
import struct
import sys
from pathlib import Path

import pytest

from rewards import sandbox
from rewards.sandbox import SandboxIsolationError, SandboxLimits, probe_isolation, run_program

# the limits and probe fixtures of the isolation tests (a fixture imported into a module is that module's too)
from test_sandbox_isolation import LIMITS, fresh_probe, isolation  # noqa: E402,F401


def os_only(program):
    """Run `program` with the OS layers only (the probe mode: no Python audit hook)."""
    return sandbox._execute(program, SandboxLimits(**LIMITS), stdin="", mode="probe")


HAS_SECCOMP = any(line.startswith("Seccomp:") for line in Path("/proc/self/status").read_text().splitlines())
ARCH = {"amd64": "x86_64", "arm64": "aarch64"}.get(os.uname().machine, os.uname().machine)
needs_seccomp = pytest.mark.skipif(not HAS_SECCOMP or ARCH not in ("x86_64", "aarch64"),
                                   reason="no seccomp in this kernel, or no syscall table for this architecture")
# Our own numbers (not the module's table), so a wrong table shows up here.
NR = {
    "x86_64": {"read": 0, "write": 1, "getpid": 39, "clone": 56, "execve": 59, "unshare": 272, "execveat": 322,
               "memfd_create": 319, "io_uring_setup": 425, "clone3": 435, "keyctl": 250, "ptrace": 101},
    "aarch64": {"read": 63, "write": 64, "getpid": 172, "clone": 220, "execve": 221, "unshare": 97, "execveat": 281,
                "memfd_create": 279, "io_uring_setup": 425, "clone3": 435, "keyctl": 219, "ptrace": 117},
}
AUDIT = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
CLONE_NEWUSER, SIGCHLD, THREAD_FLAGS = 0x10000000, 17, 0x003D0F00
ALLOW, EPERM_RET, ENOSYS_RET = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS


def run_bpf(prog: bytes, nr: int, arch: int, args=(0, 0, 0, 0, 0, 0)) -> int:
    """A classic-BPF interpreter for the few instructions a seccomp filter of ours may use."""
    insns = [struct.unpack("=HBBI", prog[i:i + 8]) for i in range(0, len(prog), 8)]
    data = struct.pack("=iIQ6Q", nr, arch, 0, *args)
    pc = acc = 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # ld [k]
            acc, pc = struct.unpack_from("=I", data, k)[0], pc + 1
        elif code in (0x15, 0x35, 0x45):  # jeq, jge, jset
            hit = acc == k if code == 0x15 else acc >= k if code == 0x35 else bool(acc & k)
            pc += 1 + (jt if hit else jf)
        elif code == 0x06:  # ret k
            return k
        else:
            raise AssertionError(f"opcode {code:#x} at {pc}")


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_seccomp_filter_program(arch):
    from rewards import sandbox_seccomp

    table = sandbox_seccomp.SYSCALLS[arch]
    nr = NR[arch]
    assert {k: table[k] for k in nr if k in table} == {k: v for k, v in nr.items() if k in table}
    prog = sandbox_seccomp.build_filter(arch, table)
    me = AUDIT[arch]
    for name in ("execve", "execveat", "unshare", "io_uring_setup", "keyctl", "ptrace"):
        assert run_bpf(prog, nr[name], me) == EPERM_RET, name
    for name in ("read", "write", "getpid", "memfd_create"):
        assert run_bpf(prog, nr[name], me) == ALLOW, name
    assert run_bpf(prog, nr["clone"], me, (CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0, 0)) == EPERM_RET
    assert run_bpf(prog, nr["clone"], me, (THREAD_FLAGS, 0, 0, 0, 0, 0)) == ALLOW
    assert run_bpf(prog, nr["clone"], me, (SIGCHLD, 0, 0, 0, 0, 0)) == ALLOW  # fork
    assert run_bpf(prog, nr["clone3"], me) == ENOSYS_RET  # glibc falls back to clone
    assert run_bpf(prog, nr["read"], 0x40000003) == EPERM_RET  # another arch (i386 through int 0x80)
    if arch == "x86_64":
        assert run_bpf(prog, 0x40000000 | nr["getpid"], me) == EPERM_RET  # the x32 ABI


ELF = base64.b64encode(Path("/bin/true").read_bytes()).decode() if Path("/bin/true").is_file() else ""
# Through _posixsubprocess: no audit event, so only the OS layers stand between it and an exec.
SPAWN = """
import base64, os, _posixsubprocess
def spawn(path):
    r, w = os.pipe()
    common = ([b"x"], [path.encode()], False, (), None, None, -1, -1, -1, -1, -1, -1, r, w, False, False, -1,
              None, None, None, -1, None)
    try:
        try:
            pid = _posixsubprocess.fork_exec(*common, False)
        except TypeError:  # the signature of other Python versions
            pid = _posixsubprocess.fork_exec(*common)
    except OSError as exc:  # no process at all (the second filter: no new processes)
        return f"fork {exc.errno}"
    os.close(w)
    err = b""
    while chunk := os.read(r, 200):
        err += chunk
    os.waitpid(pid, 0)
    return int(err.split(b":")[1], 16) if err.startswith(b"OSError:") else ("ran" if not err else err)
"""
MEMFD = """
fd = os.memfd_create("x", 0)
os.write(fd, base64.b64decode(ELF))
"""


@needs_seccomp
def test_exec_is_denied_past_the_audit_hook(isolation):
    if not ELF:
        pytest.skip("no /bin/true to copy")
    program = (f"ELF = {ELF!r}\n" + SPAWN + MEMFD
               + "print('memfd', spawn(f'/proc/self/fd/{fd}'))\nprint('sh', spawn('/bin/sh'))")
    # The OS layers alone (no audit hook, no filter against new processes): the child exists, its exec is denied.
    res = os_only(program)
    assert res.status == "ok", (res.status, res.detail, res.stderr_tail[-500:])
    assert res.stdout.split() == ["memfd", str(errno.EPERM), "sh", str(errno.EPERM)], res.stdout
    # A program's own run: not even the child (the second filter: no new processes).
    res = run_program(program, SandboxLimits(**LIMITS))
    assert res.status == "ok", (res.status, res.detail, res.stderr_tail[-500:])
    assert res.stdout.split() == ["memfd", "fork", str(errno.EPERM), "sh", "fork", str(errno.EPERM)], res.stdout


RAW_CALLS = """
import ctypes, errno, os, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {nr!r}
def call(name, *args):
    rc = libc.syscall(ctypes.c_long(NR[name]), *[ctypes.c_long(a) for a in args])
    if rc == 0 and name == "clone":
        os._exit(0)  # a child: it must not run the rest
    return errno.errorcode.get(ctypes.get_errno(), "?") if rc < 0 else "allowed"
params = ctypes.create_string_buffer(256)
out = {{"unshare": call("unshare", {newuser}), "clone": call("clone", {newuser} | {sigchld}, 0, 0, 0, 0),
       "io_uring_setup": call("io_uring_setup", 4, ctypes.addressof(params)),
       "keyctl": call("keyctl", 0, -3, 0), "clone3": call("clone3", 0, 0)}}
try:
    os.execv("/bin/sh", ["sh", "-c", "echo escaped"])
except OSError as e:
    out["execv"] = errno.errorcode[e.errno]
t = threading.Thread(target=lambda: out.__setitem__("thread", "ran"))
t.start()
t.join()
pid = os.fork()
if pid == 0:
    os._exit(7)
out["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(sorted(out.items()))
"""


@needs_seccomp
def test_native_routes_are_denied_by_the_os_layer_alone(isolation):
    program = (f"ELF = {ELF!r}\n" + SPAWN + MEMFD
               + "try:\n    os.execv(f'/proc/self/fd/{fd}', ['x'])\nexcept OSError as e:\n    print('memfd', e.errno)\n"
               + RAW_CALLS.format(nr=NR[ARCH], newuser=CLONE_NEWUSER, sigchld=SIGCHLD))
    res = os_only(program)
    assert res.status == "ok", (res.status, res.detail, res.stderr_tail[-500:])
    lines = res.stdout.strip().splitlines()
    assert lines[0] == f"memfd {errno.EPERM}"
    assert eval(lines[1]) == [("clone", "EPERM"), ("clone3", "ENOSYS"), ("execv", "EPERM"), ("fork", 7),
                              ("io_uring_setup", "EPERM"), ("keyctl", "EPERM"), ("thread", "ran"),
                              ("unshare", "EPERM")]


@needs_seccomp
def test_probe_reports_the_filter_and_the_refuse_switch_requires_it(fresh_probe, monkeypatch, isolation):
    assert isolation["seccomp"] and isolation["layers"]["seccomp"] > 0 and isolation["checks"]["execve"] == "EPERM"
    assert "seccomp filter" in isolation["description"]
    monkeypatch.setenv(sandbox.DISABLE_ENV, "seccomp")
    info = probe_isolation(SandboxLimits(**LIMITS))
    assert not info["os_level"] and "syscall filter MISSING" in info["description"]
    with pytest.raises(SandboxIsolationError):
        run_program("print(1)", SandboxLimits(**LIMITS, require_os_isolation=True))
    with pytest.raises(SandboxIsolationError, match="seccomp"):
        sandbox._execute("print(1)", SandboxLimits(**LIMITS, require_os_isolation=True), stdin="",
                         mode="stdio")


def system_dist_package() -> str | None:
    """A module of the system Python's dist-packages that this interpreter could import if it were readable."""
    d = Path("/usr/lib/python3/dist-packages")
    if not d.is_dir():
        return None
    abi = f".cpython-{sys.version_info.major}{sys.version_info.minor}-"
    for p in sorted(d.iterdir()):  # an extension module first: native code is what matters most
        if p.suffix == ".so" and abi in p.name and p.name.split(".")[0].isidentifier():
            return p.name.split(".")[0]
    for p in sorted(d.iterdir()):
        if p.suffix == ".py" and p.stem.isidentifier():
            return p.stem
    return None


def test_system_dist_packages_are_not_importable(isolation):
    name = system_dist_package()
    if name is None:
        pytest.skip("no /usr/lib/python3/dist-packages module here")
    program = f"import sys\nsys.path.append('/usr/lib/python3/dist-packages')\nimport {name}\nprint('imported')"
    for res in (run_program(program, SandboxLimits(**LIMITS)), os_only(program)):
        assert res.status != "ok" and "imported" not in res.stdout, (name, res.status, res.stdout)
