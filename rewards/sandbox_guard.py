"""The first code that runs inside a sandboxed process; it then runs the untrusted program in the same process.

Started by `rewards.sandbox` as `python -I sandbox_guard.py SPEC_JSON` in a new session (its own process group),
with cwd = the program's own directory (the "box"), stdin/stdout/stderr redirected to files. It is a standalone
script (imports only the stdlib, and its sibling modules by path) because it runs before privileges are dropped and
must not import anything the sandbox could touch. Order matters:

  1. read the program (in graded mode the tests stay on fd 0, unread, and their file is unlinked);
  2. OS-level isolation, each layer best effort and reported (see `rewards.sandbox` for the parent side):
     a. (root) fresh network and IPC namespaces: no interfaces but a down loopback, and System V IPC objects that
        die with the run;
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
     non-dumpable, so its /proc/self/mem, environ and fd/ are root-only; as non-root it is made non-dumpable
     explicitly), PR_SET_NO_NEW_PRIVS, Landlock on, then (root or not, Landlock or not) the seccomp filter of
     sandbox_seccomp.py: no execve/execveat, no new namespaces, no ptrace, io_uring, bpf, mounts, keyrings, System V
     IPC...; then, in the process that runs the program, a second filter: no new processes (threads only), so its
     memory limit is the sample's and not multiplied by a process count;
  5. the header of the result file: the guard's report, with "ready" once set-up is complete. Written before any
     untrusted code runs, on a descriptor the program never holds, so the parent tells a set-up failure or a
     refusal from a program that merely exits with the same code or prints the same words;
  6. a Python audit hook as a second layer (the only one where no OS layer is available): no sockets but
     AF_UNIX ones, no connect/bind/sendto at all, no process creation, no signals, no ctypes, no
     sub-interpreters / test C-API modules, writes only inside the box, reads only of the allowed list
     (PermissionError otherwise), no directory handles outside the box (so no dir_fd-relative escapes), no
     relative paths with '..' (ambiguous with dir_fd), no tracing/profiling, no sys._getframe into the guard's
     own frames;
  7. run the program.

Graded mode (the code reward's asserts, code_repo's test suites): after step 5 the guard forks. The child runs the
program (steps 6-7) and then serves the tests' requests on a socketpair (sandbox_remote.py); the parent, which
the program never was, reads the tests from fd 0 and runs them against the program through that socket
(sandbox_grader.py), writing each verdict after the header. The expected values never enter the program's process,
and nothing the program does can write a verdict. What the program can still do to the grader: kill or stop it
(same uid), which only loses the verdicts not yet written.
"""

import importlib.machinery
import json
import os
import pathlib
import posix
import resource
import signal
import stat
import sys
import time
import types

VIOLATION_EXIT = 87
SETUP_ERROR_EXIT = 86
ISOLATION_EXIT = 85  # OS-level isolation was required (require_os_isolation) but could not be set up
MARKER = "__SANDBOX_VIOLATION__"
DENIED = "[sandbox]"  # prefix of the PermissionError message the hook raises for a read outside the sandbox
HEADER_BYTES = 4096  # result file: the guard's JSON report, then (graded mode) the grader's JSON lines

# Imported before the privilege drop when the sandbox uid cannot read the interpreter (no mount namespace and
# a Python installed under a 0700 directory): then only these are importable, and anything else fails with an
# "unavailable" label (see rewards.sandbox).
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
PR_SET_DUMPABLE = 4



# ------------------------------------------------------------------------------------------------- Python layer
def make_hook(cfg):
    """The audit hook. Everything it uses is bound here (closure), never looked up at event time, so user code
    that replaces builtins, os/posixpath functions or this module's globals cannot change its decisions."""
    _type, _isinstance, _len = type, isinstance, len
    _str_add, _bytes_add = str.__add__, bytes.__add__
    _startswith = str.startswith
    _normpath = getattr(posix, "_path_normpath", None) or os.path.normpath  # the C one where it exists (3.11+)
    _getcwd, _stat, _isdir_mode = os.getcwd, os.stat, stat.S_ISDIR
    _write_, _exit_ = os.write, os._exit
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
    guard_globals = cfg["guard_globals"]
    forbidden, path_events = frozenset(FORBIDDEN), frozenset(PATH_EVENTS)
    copy_events, move_events = frozenset(COPY_EVENTS), frozenset(MOVE_EVENTS)
    forbidden_imports = set(FORBIDDEN_IMPORTS)
    if not cfg["no_process"]:
        # _posixsubprocess.fork_exec raises no audit event (and runs a preexec_fn in the child): without the
        # seccomp filter against new processes it would be an unchecked way to start processes.
        forbidden_imports.add("_posixsubprocess")
    forbidden_imports = frozenset(forbidden_imports)
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
            if args[0].f_globals is guard_globals:
                kill("forbidden introspection: sys._getframe into the sandbox's own frames")

    return hook


# ------------------------------------------------------------------------------------------------ setup helpers
def set_limits(spec, fsize=None):
    mb = 1024 * 1024
    fsize = max(spec["fsize_bytes"], fsize or 0)
    limits = [
        (resource.RLIMIT_CPU, (spec["cpu_s"], spec["cpu_s"] + 1)),
        (resource.RLIMIT_AS, (spec["memory_mb"] * mb, spec["memory_mb"] * mb)),
        (resource.RLIMIT_FSIZE, (fsize, fsize)),
        (resource.RLIMIT_NOFILE, (spec["max_files"], spec["max_files"])),
        (resource.RLIMIT_NPROC, (spec["max_procs"], spec["max_procs"])),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    for which, value in limits:
        resource.setrlimit(which, value)


def hook_config(spec, paths, os_fs, no_process):
    return {
        "root": spec["root"], "pkg": paths["pkg"], "read": paths["ro"], "hidden": paths["hide"],
        "read_files": set(paths["dev"]) | {"/dev/stdin"}, "write_files": {"/dev/null"},
        "list_dirs": set(paths["list"]), "os_fs": os_fs, "no_process": no_process, "guard_globals": globals(),
    }


def load_sibling(name, compiled):
    """rewards/<name>.py as module `_mixrl_<name>`: this script runs with `python -I`, so its own directory is not on
    sys.path, and it must not import the project's package (its __init__ and everything it pulls in). From the
    parent's compiled copy (`compiled`: name -> marshal file, see rewards.sandbox `compiled_guard`) when it has
    one, else from the source."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    module = types.ModuleType(f"_mixrl_{name}")
    module.__file__ = path
    sys.modules[module.__name__] = module
    if name in compiled:
        import marshal

        with open(compiled[name], "rb") as f:
            code = marshal.loads(f.read())
    else:
        with open(path, encoding="utf-8") as f:
            code = compile(f.read(), path, "exec", dont_inherit=True)
    exec(code, module.__dict__)
    return module


def write_header(result_fd, rep):
    os.pwrite(result_fd, json.dumps(rep).encode()[:HEADER_BYTES - 1] + b"\n", 0)


def setup_failed(result_fd, rep, why):
    rep["setup_error"] = why[:500]
    write_header(result_fd, rep)
    os.write(2, f"sandbox setup failed: {why}".encode())
    os._exit(SETUP_ERROR_EXIT)


def forbid_new_processes(osl, sc, spec, rep):
    """The second seccomp filter (threads only); True when it is on. Without seccomp the audit hook refuses the
    ways Python starts processes instead."""
    prog = (spec.get("seccomp") or {}).get("no_process")
    if sc is None or not rep["seccomp"] or not prog:
        return False
    sc.seccomp(bytes.fromhex(prog))
    return True


def main():
    spec = json.loads(sys.argv[1])
    sys.dont_write_bytecode = True  # no .pyc writes (they would be writes outside the box)
    paths = spec["paths"]
    is_root = os.geteuid() == 0
    disabled = set(spec.get("disable", ()))
    rep = {"root": is_root, "uid_drop": False, "netns": False, "ipcns": False, "jail": False, "proc": False,
           "landlock": 0, "landlock_abi": 0, "seccomp": 0, "no_process": False, "box_tmpfs": False,
           "interp_ok": None, "errors": {}, "ms": {}}
    clock = time.perf_counter
    t0 = clock()

    def lap(name, since):
        rep["ms"][name] = round((clock() - since) * 1000, 2)
        return clock()
    result_fd = spec["result_fd"]
    with open(spec["program"], encoding="utf-8", errors="replace") as f:
        source = f.read()
    graded = spec["mode"] == "graded"
    if graded:
        # The tests stay on fd 0 for the grader; with their file gone no path leads to them (the jail's
        # /dev/stdin is /dev/null).
        try:
            os.unlink(spec["stdin_path"])
        except OSError:
            pass
        spec["stdin_path"] = None

    t = lap("read", t0)
    compiled = spec.get("compiled") or {}
    osl = load_sibling("sandbox_os", compiled)
    t = lap("load_os", t)
    if graded:  # loaded before the jail: the project's directory is not in it
        load_sibling("sandbox_wire", compiled)
        remote = load_sibling("sandbox_remote", compiled)
        grader = load_sibling("sandbox_grader", compiled)
    t = lap("load_graded", t)
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
        # In graded mode the grader writes its verdicts after the header; the program's process lowers the file
        # size limit back to the run's own right after the fork.
        set_limits(spec, HEADER_BYTES + RESULT_LIMIT if graded else None)
        if is_root:
            os.setgroups([])
            os.setgid(spec["gid"])
            os.setuid(spec["uid"])
            if os.getuid() == 0 or os.geteuid() == 0:
                raise RuntimeError("could not drop root")
            rep["uid_drop"] = True
        elif sc is not None:
            sc.prctl(PR_SET_DUMPABLE, 0)  # the uid drop does this as root: no /proc/<pid>/mem, fd/ of ours
        osl.restrict(sc, ll_fd, rep, None if "seccomp" in disabled else spec.get("seccomp"))
    except Exception as exc:  # noqa: BLE001
        setup_failed(result_fd, rep, str(exc))
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
    write_header(result_fd, rep)
    if spec.get("require") and not (os_fs and os_net and rep["seccomp"] and (rep["uid_drop"] or not is_root)):
        missing = [k for k, ok in (("file-system isolation (jail or Landlock)", os_fs),
                                   ("network isolation (netns or Landlock ABI >= 4)", os_net),
                                   ("the seccomp syscall filter", rep["seccomp"])) if not ok]
        rep["refused"] = (f"sandbox isolation required but unavailable: {', '.join(missing)}; "
                          f"errors: {json.dumps(rep['errors'])}")[:1000]
        write_header(result_fd, rep)
        os.write(2, (rep["refused"] + "\n").encode())
        os._exit(ISOLATION_EXIT)

    if spec["mode"] == "probe":  # our own trusted probe program: the OS layers only, no audit hook
        rep["ready"] = True
        write_header(result_fd, rep)
        os.close(result_fd)
        exec(compile(source, "probe.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        return
    if graded:
        rep["ready"] = True
        write_header(result_fd, rep)
        run_graded(spec, paths, os_fs, source, result_fd, osl, sc, rep, remote, grader)
        return
    try:
        rep["no_process"] = forbid_new_processes(osl, sc, spec, rep)
    except OSError as exc:
        setup_failed(result_fd, rep, f"the seccomp filter against new processes: {exc}")
    rep["ready"] = True
    write_header(result_fd, rep)
    os.close(result_fd)
    sys.addaudithook(make_hook(hook_config(spec, paths, os_fs, rep["no_process"])))
    del spec, paths, rep, sc
    exec(compile(source, "solution.py", "exec", dont_inherit=True), program_namespace("__main__"))


RESULT_LIMIT = 4 << 20  # bytes of verdicts the grader may write after the header


def run_graded(spec, paths, os_fs, source, result_fd, osl, sc, rep, remote, grader):
    """Fork: the child becomes the program's process, this process stays the grader (module docstring)."""
    (grader_r, program_w), (program_r, grader_w) = remote.channel()
    pid = os.fork()
    if pid == 0:
        os.close(grader_r)
        os.close(grader_w)
        program_side(spec, paths, os_fs, source, result_fd, osl, sc, rep, remote, program_r, program_w)
        os._exit(0)
    os.close(program_r)
    os.close(program_w)
    with open(0, "rb", closefd=False) as f:
        payload = json.loads(f.read().decode("utf-8", "replace"))
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    conn = remote.connect(grader_r, grader_w, "grader")
    results = grader.Results(result_fd, HEADER_BYTES, RESULT_LIMIT)
    ended = {}

    def program_status(wait_s=0.5):
        """How the program's process ended ({"exit": code} or {"signal": n}), or None while it runs."""
        deadline = time.monotonic() + wait_s
        while "status" not in ended:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                ended["status"] = {"signal": -code} if code < 0 else {"exit": code}
            elif time.monotonic() >= deadline:
                return None
            else:
                time.sleep(0.005)
        return ended["status"]

    try:
        grader.run(remote, conn, payload, results, program_status)
    finally:
        if "status" not in ended:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001
                pass
    os._exit(0)


def program_side(spec, paths, os_fs, source, result_fd, osl, sc, rep, remote, rfd, wfd):
    """The program's process: nothing secret is reachable from here (no result descriptor, no tests on fd 0)."""
    os.close(result_fd)
    resource.setrlimit(resource.RLIMIT_FSIZE, (spec["fsize_bytes"], spec["fsize_bytes"]))
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    try:
        no_process = forbid_new_processes(osl, sc, spec, rep)
    except OSError:
        os._exit(SETUP_ERROR_EXIT)  # without "ready" on the socket the grader records a set-up failure
    conn = remote.connect(rfd, wfd, "program")
    sys.addaudithook(make_hook(hook_config(spec, paths, os_fs, no_process)))
    del spec, paths, rep, sc, osl
    conn.send({"ready": True})
    ns = program_namespace("solution")
    try:
        exec(compile(source, "solution.py", "exec", dont_inherit=True), ns)
    except BaseException as exc:  # noqa: BLE001 - the tests then fail with this reason
        conn.send({"error": conn.encode_error(exc)})
    else:
        conn.send({"names": remote.program_globals(conn, ns)})
    conn.serve_forever()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - replaced by the program with something odd
            pass
    os._exit(0)


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
