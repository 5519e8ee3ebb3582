"""The first code that runs inside a sandboxed process; it then runs the untrusted program in the same process.

Started by `rewards.sandbox` as `python -I sandbox_guard.py SPEC_JSON` in a new session (its own process group),
with cwd = a private temp dir, stdin/stdout/stderr redirected to files. It is a standalone script (imports only
the stdlib) because it runs before privileges are dropped and must not import anything the sandbox could touch.
Order matters:
  1. (root only) enter a fresh network namespace: no interfaces but a down loopback, so no network at all;
  2. resource limits: CPU, address space, file size, open files, processes, no core dumps;
  3. pre-import common stdlib modules (the interpreter's files may be unreadable for the unprivileged uid);
  4. (root only) drop to the sandbox uid/gid, so RLIMIT_NPROC and filesystem permissions apply;
  5. a Python audit hook that kills the process on socket use, process creation, signals to other processes,
     ctypes, frame/GC introspection, and any write/create/delete of a path outside the temp dir;
  6. run the program; in assert mode, then each assert, reporting passes to a result fd with a nonce the
     program cannot see (so `sys.exit(0)` / `os._exit(0)` before the asserts does not count as a pass).
"""

import json
import os
import resource
import sys

VIOLATION_EXIT = 87
SETUP_ERROR_EXIT = 86
MARKER = "__SANDBOX_VIOLATION__"

PRELOAD = (
    "abc array bisect calendar cmath collections collections.abc copy dataclasses datetime decimal enum fractions "
    "functools hashlib heapq io itertools json math numbers operator random re statistics string struct sys "
    "textwrap time typing unicodedata queue contextlib traceback contextvars socket select pathlib fnmatch glob csv "
    "pprint weakref types warnings threading base64 binascii zlib secrets uuid encodings.idna"
).split()

FORBIDDEN = {
    "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
    "socket.gethostbyaddr", "socket.sendto", "socket.sendmsg",
    "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.startfile",
    "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill",
    "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function",
    "sys._getframe", "sys._current_frames", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
    "os.setuid", "os.setgid", "os.chroot", "os.symlink", "os.link", "os.mknod", "os.mkfifo",
    "sys.addaudithook", "sys.setprofile", "sys.settrace", "code.__new__",
}
# Attribute reads that lead from user code to the guard's frames (and its nonce).
FRAME_ATTRS = {"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back", "f_locals", "f_globals"}
# Events whose first argument is a path that gets modified.
PATH_EVENTS = {
    "os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime", "os.chflags",
    "os.lchflags", "os.lchmod", "os.setxattr", "os.removexattr", "shutil.rmtree", "shutil.copyfile",
    "shutil.copytree", "shutil.move",
}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def die(reason):
    try:
        os.write(2, f"\n{MARKER} {reason}\n".encode("utf-8", "replace"))
    finally:
        os._exit(VIOLATION_EXIT)


def make_hook(root):
    root = os.path.normpath(root)
    allowed_files = {"/dev/null"}
    join, normpath, getcwd, fsdecode = os.path.join, os.path.normpath, os.getcwd, os.fsdecode
    forbidden, path_events, frame_attrs = frozenset(FORBIDDEN), frozenset(PATH_EVENTS), frozenset(FRAME_ATTRS)

    def inside(path):
        if isinstance(path, int):
            return True  # an already-open descriptor; opening it again grants nothing new
        if not isinstance(path, (str, bytes)):
            # Custom __fspath__ objects could answer differently on each call (check vs use): refuse them.
            if type(path).__module__ not in ("pathlib", "posixpath"):
                return False
            path = str(path)
        p = normpath(join(getcwd(), fsdecode(path)))
        return p == root or p.startswith(root + "/") or p in allowed_files

    def hook(event, args):
        if event in forbidden:
            die(f"forbidden operation {event}")
        elif event == "open":
            if len(args) >= 3 and isinstance(args[2], int) and args[2] & WRITE_FLAGS and not inside(args[0]):
                die(f"write outside the sandbox dir: {str(args[0])[:200]}")
        elif event in path_events:
            if args and not inside(args[0]):
                die(f"{event} outside the sandbox dir: {str(args[0])[:200]}")
            if event in ("shutil.copyfile", "shutil.copytree", "shutil.move") and len(args) > 1 and not inside(args[1]):
                die(f"{event} outside the sandbox dir: {str(args[1])[:200]}")
        elif event in ("os.rename", "os.replace"):
            if any(not inside(a) for a in args[:2]):
                die(f"{event} outside the sandbox dir")
        elif event == "object.__getattr__" and len(args) > 1 and args[1] in frame_attrs:
            die(f"forbidden introspection .{args[1]}")

    return hook


def set_limits(spec):
    mb = 1024 * 1024
    limits = [
        (resource.RLIMIT_CPU, (spec["cpu_s"], spec["cpu_s"] + 1)),
        (resource.RLIMIT_AS, (spec["memory_mb"] * mb, spec["memory_mb"] * mb)),
        (resource.RLIMIT_FSIZE, (spec["fsize_bytes"], spec["fsize_bytes"])),
        (resource.RLIMIT_NOFILE, (spec["max_files"], spec["max_files"])),
        (resource.RLIMIT_NPROC, (spec["max_procs"], spec["max_procs"])),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    for which, value in limits:
        resource.setrlimit(which, value)


def enter_network_namespace():
    import ctypes

    CLONE_NEWNET = 0x40000000
    try:
        return ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET) == 0
    except Exception:  # noqa: BLE001 - best effort; the audit hook still blocks sockets
        return False


def main():
    spec = json.loads(sys.argv[1])
    sys.dont_write_bytecode = True  # no .pyc writes (they would be writes outside the temp dir)
    is_root = os.geteuid() == 0
    if is_root and spec.get("netns", True):
        enter_network_namespace()
    for name in PRELOAD + list(spec.get("preload", ())):
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - a missing optional module is the program's problem, not ours
            pass
    nonce, snippets = None, []
    if spec["mode"] == "assert":
        # Asserts and nonce come on stdin; fd 0 is then pointed at /dev/null so the program cannot read them.
        payload = json.loads(sys.stdin.read())
        nonce, snippets = payload["nonce"], payload["snippets"]
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
    program_code = compile(open(spec["program"], encoding="utf-8", errors="replace").read(), "solution.py", "exec")
    snippet_codes = [compile(s, f"test_{i}.py", "exec") for i, s in enumerate(snippets)]
    result_fd = spec.get("result_fd")
    try:
        set_limits(spec)
        if is_root:
            os.setgroups([])
            os.setgid(spec["gid"])
            os.setuid(spec["uid"])
            if os.getuid() == 0 or os.geteuid() == 0:
                raise RuntimeError("could not drop root")
    except Exception as exc:  # noqa: BLE001
        os.write(2, f"sandbox setup failed: {exc}".encode())
        os._exit(SETUP_ERROR_EXIT)
    sys.addaudithook(make_hook(spec["root"]))
    del spec

    namespace = {"__name__": "__main__" if nonce is None else "solution", "__builtins__": __builtins__}
    if nonce is None:
        exec(program_code, namespace)  # stdio mode: exceptions/exit codes propagate as usual
        return
    try:
        exec(program_code, namespace)
    except SystemExit:
        os.write(2, b"program called exit() before the tests ran\n")
        os._exit(1)
    for i, code in enumerate(snippet_codes):
        try:
            exec(code, namespace)
        except SystemExit:
            os.write(2, f"test {i}: exit() called\n".encode())
            os._exit(1)
        except BaseException as exc:  # noqa: BLE001 - a failing assert or an error in the tested function
            os.write(2, f"test {i}: {type(exc).__name__}: {str(exc)[:200]}\n".encode("utf-8", "replace"))
            continue
        os.write(result_fd, f"PASS {i} {nonce}\n".encode())


if __name__ == "__main__":
    main()
