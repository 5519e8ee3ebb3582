"""The first code that runs inside a sandboxed process; it then runs the untrusted program in the same process.

Started by `rewards.sandbox` as `python -I sandbox_guard.py SPEC_JSON` in a new session (its own process group),
with cwd = the program's own directory (the "box"), stdin/stdout/stderr redirected to files. It is a standalone
script (imports only the stdlib) because it runs before privileges are dropped and must not import anything the
sandbox could touch. Order matters:

  1. read the program (and, in assert mode, the tests + nonce from stdin, whose file is then deleted);
  2. OS-level isolation, each layer best effort and reported (see `rewards.sandbox` for the parent side):
     a. (root) a fresh network namespace: no interfaces but a down loopback, so no network at all;
     b. (root) a fresh mount namespace with a private root ("jail"): a tmpfs holding read-only bind mounts of
        the interpreter's stdlib, the allowed third-party packages (numpy), the library dirs they load from, a
        few /etc and /dev files, a /proc of our own (hidepid) and the box (read-write: a size-limited tmpfs of
        its own, the write quota, holding a copy of the program), each at its usual path; then pivot_root into
        it. Nothing else of the host (home, project data, /tmp) exists for the program. The mount points are
        created on the tmpfs, so a Python installed under a 0700 /root is readable by the sandbox uid without
        opening /root;
     c. Landlock (Linux >= 5.13, via raw syscalls): read-only access to the same list, read-write to the box
        only, no execve at all; ABI >= 4: no TCP bind/connect; ABI >= 6: no signals to, and no abstract unix
        sockets of, processes outside the sandbox. Applies to every way of reaching the file system (dir_fd,
        openat, O_PATH, ...), not only to the paths Python's audit hook sees;
  3. resource limits: CPU, address space, file size, open files, processes, no core dumps;
  4. (root) drop to the run's own sandbox uid/gid (RLIMIT_NPROC then applies; the process becomes
     non-dumpable, so its /proc/self/mem, environ and fd/ are root-only), PR_SET_NO_NEW_PRIVS, Landlock on,
     then (root or not, Landlock or not) the seccomp filter of sandbox_seccomp.py: no execve/execveat, no new
     namespaces, no ptrace, io_uring, bpf, mounts, keyrings... (that module's docstring has the list);
  5. a Python audit hook as a second layer (the only one where no OS layer is available): no sockets but
     AF_UNIX ones, no connect/bind/sendto at all, no process creation, no signals, no ctypes, no
     sub-interpreters / test C-API modules, writes only inside the box, reads only of the allowed list
     (PermissionError otherwise), no directory handles outside the box (so no dir_fd-relative escapes), no
     relative paths with '..' (ambiguous with dir_fd), no tracing/profiling, no reading the test driver's code
     (frame.f_code, see below), no sys._getframe into the guard's own frames;
  6. run the program.

Assert mode and its nonce. The program runs first, then each assert snippet, all in the main thread, by a
"driver" code object generated here. A pass is recorded by the driver right after a snippet returned normally,
by writing `PASS i <nonce>` into a shared memory mapping of the result file (the file descriptor is closed before
any untrusted code runs, so the program has no handle on that file at all). The mapping, the nonce lines and the
snippet code objects are constants (co_consts) of the driver code, never local or global variables: user code can
reach the driver's frame (sys._getframe / f_back / tb_frame are allowed, the stdlib needs them) and read its
f_locals/f_globals (nothing secret there), but the only way from a frame to its constants is frame.f_code, which
the audit hook refuses for the driver's code object. So `sys.exit(0)` / `os._exit(0)` before the asserts, or a
forged PASS line, do not count. What remains possible for hostile code: memory-corruption bugs of CPython itself
(and, without the OS layers, everything the Python-level hook cannot see, e.g. `_posixsubprocess`, which is
therefore refused when no OS file-system isolation is in place); redefining what the tests call (e.g. an object
whose __eq__ is always True) is a test-design matter, not the sandbox's.
"""

import _thread
import importlib.machinery
import json
import mmap
import os
import pathlib
import posix
import resource
import stat
import sys
import time
import types
import warnings

VIOLATION_EXIT = 87
SETUP_ERROR_EXIT = 86
ISOLATION_EXIT = 85  # OS-level isolation was required (require_os_isolation) but could not be set up
MARKER = "__SANDBOX_VIOLATION__"
DENIED = "[sandbox]"  # prefix of the PermissionError message the hook raises for a read outside the sandbox
HEADER_BYTES = 4096  # result file: a JSON isolation report, then one slot per assert snippet
SLOT_BYTES = 64

# Imported before the privilege drop when the sandbox uid cannot read the interpreter (no mount namespace and
# a Python installed under a 0700 directory): then only these are importable, and anything else fails with a
# "sandbox_error" label (see rewards.sandbox).
FALLBACK_PRELOAD = (
    "abc array bisect calendar cmath collections collections.abc copy dataclasses datetime decimal enum fractions "
    "functools hashlib heapq io itertools json math numbers operator random re statistics string struct sys "
    "textwrap time typing unicodedata queue contextlib traceback contextvars socket select fnmatch glob csv "
    "pprint weakref types warnings threading base64 binascii zlib secrets uuid encodings.idna signal graphlib "
    "pickle logging unittest gzip bz2 lzma shutil tempfile copyreg inspect dis ast"
).split()

FORBIDDEN = {
    "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
    "socket.gethostbyaddr", "socket.sendto", "socket.sendmsg",
    "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.startfile",
    "subprocess.Popen", "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill",
    "sys._current_frames", "sys._current_exceptions", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
    "os.setuid", "os.setgid", "os.setreuid", "os.setregid", "os.setresuid", "os.setresgid", "os.setgroups",
    "os.chroot", "os.symlink", "os.link", "os.mknod", "os.mkfifo",
    "sys.addaudithook", "sys.setprofile", "sys.settrace", "cpython.PyInterpreterState_New",
}
# Modules that reach past the hook: sub-interpreters run without our audit hook, the test C-API modules can read
# and write raw memory, _ctypes_test exposes native calls.
FORBIDDEN_IMPORTS = {
    "_xxsubinterpreters", "_xxinterpchannels", "_interpreters", "_interpchannels", "_interpqueues",
    "_testcapi", "_testinternalcapi", "_testbuffer", "_testmultiphase", "_testsinglephase", "_testimportmultiple",
    "_testclinic", "_ctypes_test", "_xxtestfuzz", "xxsubtype",
}
# Events whose first argument is a path that gets modified.
PATH_EVENTS = {
    "os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime", "os.chflags",
    "os.lchflags", "os.lchmod", "os.setxattr", "os.removexattr", "shutil.rmtree", "shutil.chown",
}
# (src, dst) events: dst gets modified (src is read through its own "open" event); moves modify both.
COPY_EVENTS = {"shutil.copyfile", "shutil.copytree", "shutil.copymode", "shutil.copystat"}
MOVE_EVENTS = {"shutil.move", "os.rename", "os.replace"}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
HANDLE_FLAGS = getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_PATH", 0)



# ------------------------------------------------------------------------------------------------- Python layer
def make_hook(cfg):
    """The audit hook. Everything it uses is bound here (closure), never looked up at event time, so user code
    that replaces builtins, os/posixpath functions or this module's globals cannot change its decisions."""
    _type, _isinstance, _id, _len = type, isinstance, id, len
    _str_add, _bytes_add = str.__add__, bytes.__add__
    _startswith = str.startswith
    _normpath = getattr(posix, "_path_normpath", None) or os.path.normpath  # the C one where it exists (3.11+)
    _getcwd, _stat, _isdir_mode = os.getcwd, os.stat, stat.S_ISDIR
    _write_, _exit_ = os.write, os._exit
    _get_ident = _thread.get_ident
    _PermissionError, _OSError, _ValueError = PermissionError, OSError, ValueError
    path_types = (pathlib.PosixPath, pathlib.PurePosixPath)
    orig_fspath, orig_str = pathlib.PurePath.__fspath__, pathlib.PurePath.__str__

    root = cfg["root"]
    root_slash = root + "/"
    pkg_roots = tuple(cfg["pkg"])
    read_roots = tuple(cfg["read"])
    hidden = tuple(cfg["hidden"])
    read_files = frozenset(cfg["read_files"])
    write_files = frozenset(cfg["write_files"])
    list_dirs = frozenset(cfg["list_dirs"])
    pid = os.getpid()
    proc_net = ("/proc/net", "/proc/self/net", f"/proc/{pid}/net", "/proc/thread-self/net")
    guard_globals, driver_globals = cfg["guard_globals"], cfg["driver_globals"]
    secret_ids = cfg["secret_ids"]  # ids of code objects whose constants are secret (the assert driver)
    forbidden, path_events = frozenset(FORBIDDEN), frozenset(PATH_EVENTS)
    copy_events, move_events = frozenset(COPY_EVENTS), frozenset(MOVE_EVENTS)
    forbidden_imports = set(FORBIDDEN_IMPORTS)
    if not cfg["os_fs"]:
        # _posixsubprocess.fork_exec raises no audit event: without an OS layer it would be an unchecked way
        # to start processes.
        forbidden_imports.add("_posixsubprocess")
    forbidden_imports = frozenset(forbidden_imports)
    busy = set()
    af_unix = 1  # AF_UNIX on Linux
    _getframe = sys._getframe
    coroutine_code = types.coroutine.__code__

    def kill(reason):
        try:
            _write_(2, ("\n" + MARKER + " " + reason + "\n").encode("utf-8", "replace"))
        finally:
            _exit_(VIOLATION_EXIT)

    def under(p, roots):
        for r in roots:
            if p == r or _startswith(p, r + "/"):
                return True
        return False

    def as_path(obj):
        """Exact str path (None for a file descriptor) without running user code that could lie twice."""
        t = _type(obj)
        if t is str:
            return obj
        if t is int:
            return None
        if t is bytes:
            return obj.decode("utf-8", "surrogateescape")
        if obj is None:
            return "."
        if _isinstance(obj, str):
            return _str_add("", obj)  # a plain copy, no user methods involved
        if _isinstance(obj, bytes):
            return _bytes_add(b"", obj).decode("utf-8", "surrogateescape")
        if t in path_types and t.__fspath__ is orig_fspath and t.__str__ is orig_str:
            s = orig_str(obj)
            if _type(s) is str:
                return s
        kill("path argument of an unsupported type " + t.__name__[:50])

    def absolute(path):
        if not _startswith(path, "/"):
            if path == ".." or _startswith(path, "../") or "/../" in path or path.endswith("/.."):
                # Relative to what? With dir_fd the base is not the cwd, and the open event does not say.
                kill("relative path with '..': " + path[:200])
            path = _getcwd() + "/" + path
        return _normpath(path)

    def inside(p):
        return p == root or _startswith(p, root_slash) or p in write_files

    def readable(p):
        if p == root or _startswith(p, root_slash) or p in read_files or under(p, pkg_roots):
            return True
        if under(p, hidden):
            return False
        return under(p, read_roots) or under(p, proc_net)

    def deny_read(p):
        raise _PermissionError(13, DENIED + " reading outside the sandbox is not allowed", p)

    def is_dir(p):
        try:
            return _isdir_mode(_stat(p).st_mode)
        except (_OSError, _ValueError):
            return False

    def check_write(event, arg):
        p = as_path(arg)
        if p is not None:
            p = absolute(p)
            if not inside(p):
                kill(event + " outside the sandbox dir: " + p[:200])

    def hook(event, args):
        if event in forbidden or _startswith(event, "ctypes."):
            kill("forbidden operation " + event)
        elif event == "socket.__new__":
            # AF_UNIX only (asyncio's event loop needs a socketpair); connect/bind/sendto stay forbidden for every
            # family, so such a socket reaches nothing outside the process.
            if not (_len(args) > 1 and args[1] == af_unix):
                kill("forbidden operation socket.__new__")
        elif event == "code.__new__":
            # Crafted code objects can corrupt memory. The stdlib's only use: types.coroutine setting a flag.
            if _getframe(1).f_code is not coroutine_code:
                kill("forbidden operation code.__new__")
        elif event == "open":
            p = as_path(args[0])
            if p is None:
                return  # an already-open descriptor; opening it again grants nothing new
            p = absolute(p)
            flags = args[2] if _len(args) >= 3 and _type(args[2]) is int else 0
            mode = args[1] if _len(args) >= 2 and _type(args[1]) is str else ""
            if flags & WRITE_FLAGS or "w" in mode or "a" in mode or "x" in mode or "+" in mode:
                if not inside(p):
                    kill("write outside the sandbox dir: " + p[:200])
            elif not (p == root or _startswith(p, root_slash)):
                if flags & HANDLE_FLAGS or is_dir(p):
                    kill("directory handle outside the sandbox dir: " + p[:200])
                if not readable(p):
                    deny_read(p)
        elif event in path_events:
            if args:
                check_write(event, args[0])
        elif event in copy_events:
            if _len(args) > 1:
                check_write(event, args[1])
        elif event in move_events:
            check_write(event, args[0])
            if _len(args) > 1:
                check_write(event, args[1])
        elif event == "os.listdir" or event == "os.scandir":
            p = as_path(args[0] if args else None)
            if p is not None:
                p = absolute(p)
                if not (readable(p) or p in list_dirs):
                    deny_read(p)
        elif event == "import":
            if args and args[0] in forbidden_imports:
                kill("forbidden import " + args[0])
        elif event == "sys._getframe":
            g = args[0].f_globals
            if g is guard_globals or g is driver_globals:
                kill("forbidden introspection: sys._getframe into the sandbox's own frames")
        elif event == "object.__getattr__" and secret_ids and _len(args) > 1 and args[1] == "f_code":
            tid = _get_ident()
            if tid in busy:
                return  # our own read of f_code below
            busy.add(tid)
            try:
                code = args[0].f_code
            finally:
                busy.discard(tid)
            if _id(code) in secret_ids:
                kill("forbidden introspection: frame.f_code of the sandbox's test driver")

    return hook


# ------------------------------------------------------------------------------------------------ setup helpers
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


def read_payload(spec):
    """Assert mode: the tests and the nonce come on stdin; fd 0 is then /dev/null and the file is deleted."""
    payload = json.loads(sys.stdin.read())
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    try:
        os.unlink(spec["stdin_path"])
    except (OSError, KeyError):
        pass
    spec["stdin_path"] = None
    return payload


def _make_exits():
    write, exit_ = os.write, os._exit

    def program_exit():
        write(2, b"program called exit() before the tests ran\n")
        exit_(1)

    def snippet_exit(i):
        write(2, f"test {i}: exit() called\n".encode())
        exit_(1)

    def report(i, exc):
        try:
            msg = f"test {i}: {type(exc).__name__}: {str(exc)[:200]}\n"
        except BaseException:  # noqa: BLE001 - a hostile __str__
            msg = f"test {i}: failed\n"
        write(2, msg.encode("utf-8", "replace"))

    return program_exit, snippet_exit, report


def build_driver(source, payload, result_fd, ns):
    """The assert-mode driver: one code object whose constants hold everything secret (module docstring)."""
    nonce, snippets = payload.pop("nonce"), payload.pop("snippets")
    program = compile(source, "solution.py", "exec", dont_inherit=True)
    codes = []
    for i, s in enumerate(snippets):
        try:
            codes.append(compile(s, f"test_{i}.py", "exec", dont_inherit=True))
        except (SyntaxError, ValueError) as exc:
            codes.append(compile(f"raise SyntaxError({str(exc)!r})", f"test_{i}.py", "exec"))
    size = HEADER_BYTES + SLOT_BYTES * len(codes)
    mm = mmap.mmap(result_fd, size)
    # CPython's mmap object keeps a dup() of the descriptor (for size()/resize()); a descriptor is reachable by
    # number from user code, so close every descriptor of the result file. The mapping itself needs none.
    target = os.fstat(result_fd)
    for fd in range(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0]):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if fd != result_fd and (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            os.close(fd)
    program_exit, snippet_exit, report = _make_exits()
    consts = {"\0EXEC": exec, "\0PROG": program, "\0NS": ns, "\0SE": SystemExit, "\0BE": BaseException,
              "\0PEXIT": program_exit, "\0SEXIT": snippet_exit, "\0REPORT": report, "\0SET": mm.__setitem__}
    src = ["try:\n    '\\0EXEC'('\\0PROG', '\\0NS')\nexcept '\\0SE':\n    '\\0PEXIT'()\n"]
    for i, code in enumerate(codes):
        line = f"PASS {i} {nonce}\n".encode()
        start = HEADER_BYTES + SLOT_BYTES * i
        consts[f"\0C{i}"], consts[f"\0L{i}"] = code, line
        consts[f"\0S{i}"] = slice(start, start + len(line))
        src.append(f"try:\n    '\\0EXEC'('\\0C{i}', '\\0NS')\nexcept '\\0SE':\n    '\\0SEXIT'({i})\n"
                   f"except '\\0BE' as e:\n    '\\0REPORT'({i}, e)\nelse:\n    '\\0SET'('\\0S{i}', '\\0L{i}')\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "'str' object is not callable": the placeholders are replaced below
        driver = compile("".join(src), "<sandbox-driver>", "exec", dont_inherit=True)
    driver = driver.replace(co_consts=tuple(
        consts[c] if type(c) is str and c in consts else c for c in driver.co_consts))
    return driver


def hook_config(spec, paths, os_fs, driver_globals, secret_ids):
    return {
        "root": spec["root"], "pkg": paths["pkg"], "read": paths["ro"], "hidden": paths["hide"],
        "read_files": set(paths["dev"]) | {"/dev/stdin"}, "write_files": {"/dev/null"},
        "list_dirs": set(paths["list"]), "os_fs": os_fs, "guard_globals": globals(),
        "driver_globals": driver_globals, "secret_ids": secret_ids,
    }


def load_os_layer():
    """rewards/sandbox_os.py, loaded by path: this script runs with `python -I`, so its own directory is not on
    sys.path, and it must not import the project's package (its __init__ and everything it pulls in)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_os.py")
    spec = importlib.util.spec_from_file_location("_mixrl_sandbox_os", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    spec = json.loads(sys.argv[1])
    sys.dont_write_bytecode = True  # no .pyc writes (they would be writes outside the box)
    paths = spec["paths"]
    is_root = os.geteuid() == 0
    disabled = set(spec.get("disable", ()))
    rep = {"root": is_root, "uid_drop": False, "netns": False, "jail": False, "proc": False, "landlock": 0,
           "landlock_abi": 0, "seccomp": 0, "box_tmpfs": False, "interp_ok": None,
           "errors": {}, "ms": {}}
    clock = time.perf_counter
    t0 = clock()

    def lap(name, since):
        rep["ms"][name] = round((clock() - since) * 1000, 2)
        return clock()
    with open(spec["program"], encoding="utf-8", errors="replace") as f:
        source = f.read()
    payload = read_payload(spec) if spec["mode"] == "assert" else None
    result_fd = spec["result_fd"]
    if payload is not None:
        os.ftruncate(result_fd, HEADER_BYTES + SLOT_BYTES * len(payload["snippets"]))

    osl = load_os_layer()
    sc, ll_fd = osl.isolate(spec, paths, rep, disabled, is_root, lap)
    t = clock()
    if is_root and not rep["jail"] and not all(osl.others_can_reach(p) for p in paths["stdlib"]):
        # The sandbox uid will not be able to read the interpreter: import what we can while still root.
        for name in FALLBACK_PRELOAD:
            try:
                __import__(name)
            except Exception:  # noqa: BLE001 - a missing optional module is the program's problem
                pass
    if spec["mode"] == "probe":
        import socket  # noqa: F401 - the probe's own imports, even where the uid cannot read the stdlib

    for name in spec.get("packages", ()):  # fill the import caches while the dirs can still be listed
        try:
            importlib.machinery.PathFinder.find_spec(name)
        except Exception:  # noqa: BLE001
            pass
    try:
        set_limits(spec)
        if is_root:
            os.setgroups([])
            os.setgid(spec["gid"])
            os.setuid(spec["uid"])
            if os.getuid() == 0 or os.geteuid() == 0:
                raise RuntimeError("could not drop root")
            rep["uid_drop"] = True
        osl.restrict(sc, ll_fd, rep, None if "seccomp" in disabled else spec.get("seccomp"))
    except Exception as exc:  # noqa: BLE001
        os.write(2, f"sandbox setup failed: {exc}".encode())
        os._exit(SETUP_ERROR_EXIT)
    lap("limits_drop_restrict", t)
    lap("setup_total", t0)
    try:
        probe = os.path.join(paths["stdlib"][0], "os.py")
        os.close(os.open(probe, os.O_RDONLY))
        rep["interp_ok"] = True
    except (OSError, IndexError):
        rep["interp_ok"] = False
    os_fs = bool(rep["jail"] or rep["landlock"])
    os_net = bool(rep["netns"] or rep["landlock"] >= 4)
    header = json.dumps(rep).encode()[:HEADER_BYTES - 1] + b"\n"
    os.pwrite(result_fd, header, 0)
    if spec.get("require") and not (os_fs and os_net and rep["seccomp"] and (rep["uid_drop"] or not is_root)):
        missing = [k for k, ok in (("file-system isolation (jail or Landlock)", os_fs),
                                   ("network isolation (netns or Landlock ABI >= 4)", os_net),
                                   ("the seccomp syscall filter", rep["seccomp"])) if not ok]
        os.write(2, f"sandbox isolation required but unavailable: {', '.join(missing)}; "
                    f"errors: {json.dumps(rep['errors'])}\n".encode())
        os._exit(ISOLATION_EXIT)

    if spec["mode"] == "probe":  # our own trusted probe program: the OS layers only, no audit hook
        os.close(result_fd)
        exec(compile(source, "probe.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        return
    if payload is None:
        os.close(result_fd)
        sys.addaudithook(make_hook(hook_config(spec, paths, os_fs, None, frozenset())))
        del spec, paths, payload, header, sc
        exec(compile(source, "solution.py", "exec", dont_inherit=True), program_namespace("__main__"))
        return
    exec(*prepare_assert(spec, paths, os_fs, source, payload, result_fd))
    # Back from the driver: every assert ran. Leave now (no atexit handlers, no waiting for the program's threads).
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - replaced by the program with something odd
            pass
    os._exit(0)


def prepare_assert(spec, paths, os_fs, source, payload, result_fd):
    """Build the driver, close the result fd, install the hook. The driver code object and its globals come back
    as a tuple the caller unpacks straight into exec, so no frame's locals ever hold the driver."""
    driver = build_driver(source, payload, result_fd, program_namespace("solution"))
    os.close(result_fd)
    driver_globals = {"__builtins__": __builtins__}
    sys.addaudithook(make_hook(hook_config(spec, paths, os_fs, driver_globals, frozenset({id(driver)}))))
    return driver, driver_globals


def program_namespace(name):
    """The program's globals: those of a real module registered as `name` and as __main__ (so pickle finds its
    classes, and `import __main__` gives the program, not this guard)."""
    module = types.ModuleType(name)
    module.__dict__["__builtins__"] = __builtins__
    sys.modules[name] = module
    sys.modules["__main__"] = module
    return module.__dict__


if __name__ == "__main__":
    main()
