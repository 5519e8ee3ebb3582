"""The OS-level layers of the code sandbox (see sandbox_guard.py, step 2): network and IPC namespaces, a private
mount-namespace root ("jail") whose box is a size-limited tmpfs (the write quota), Landlock rules and the seccomp
filter (sandbox_seccomp.py), set up by the guard while it is still root, through the few syscalls Python does
not wrap. Loaded by the guard by path (standalone: only the stdlib). Each layer is best effort and reported in
`rep`; what could not be set up is left to the others and to the Python audit hook.
"""

import os
import stat
import struct
import time
import types


# ---------------------------------------------------------------------------------------------- OS layer: syscalls
class Sys:
    """The few syscalls Python does not wrap (unshare, mount, pivot_root, prctl, Landlock), through ctypes."""

    PIVOT_ROOT = types.MappingProxyType({"x86_64": 155, "aarch64": 41, "riscv64": 41, "i686": 217, "i386": 217,
                                         "ppc64le": 203, "s390x": 217, "armv7l": 218})
    LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446  # same on all arches

    def __init__(self):
        import ctypes

        self.ct = ctypes
        self.libc = libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        libc.unshare.argtypes = [ctypes.c_int]
        libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
        libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]

    def _check(self, rc, what):
        if rc < 0:
            err = self.ct.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")
        return rc

    def syscall(self, nr, *args, what="syscall"):
        c_long = self.ct.c_long
        conv = [a if isinstance(a, self.ct._SimpleCData) or hasattr(a, "_obj") else c_long(a) for a in args]
        return self._check(self.libc.syscall(c_long(nr), *conv), what)

    def unshare(self, flags, what):
        self._check(self.libc.unshare(flags), what)

    def mount(self, src, target, fstype, flags, data=None):
        def enc(s):
            return None if s is None else os.fsencode(s)

        self._check(self.libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")

    def umount2(self, target, flags):
        self._check(self.libc.umount2(os.fsencode(target), flags), f"umount {target}")

    def prctl(self, option, arg2=0):
        self._check(self.libc.prctl(option, arg2, 0, 0, 0), f"prctl {option}")

    def seccomp(self, prog):
        """Enforce the classic-BPF program `prog` (packed sock_filters) on this thread and whatever it starts."""
        ct = self.ct
        insns = ct.create_string_buffer(prog, len(prog))
        # struct sock_fprog { unsigned short len; struct sock_filter *filter; } on LP64 (the arches with a table)
        fprog = ct.create_string_buffer(struct.pack("=H6xQ", len(prog) // 8, ct.addressof(insns)), 16)
        self._check(self.libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ct.addressof(fprog), 0, 0),
                    "prctl(PR_SET_SECCOMP)")


CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWIPC = 0x00020000, 0x40000000, 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_KEEP = 8 | 1024 | 2048 | 4096  # noexec, noatime, nodiratime, relatime: kept from the source on remount
MNT_DETACH = 2
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2

# Landlock access rights (include/uapi/linux/landlock.h).
LL_EXECUTE, LL_WRITE_FILE, LL_READ_FILE, LL_READ_DIR = 1, 2, 4, 8
LL_REMOVE_DIR, LL_REMOVE_FILE, LL_MAKE_CHAR, LL_MAKE_DIR = 16, 32, 64, 128
LL_MAKE_REG, LL_MAKE_SOCK, LL_MAKE_FIFO, LL_MAKE_BLOCK, LL_MAKE_SYM = 256, 512, 1024, 2048, 4096
LL_REFER, LL_TRUNCATE, LL_IOCTL_DEV = 8192, 16384, 32768  # ABI 2, 3, 5
LL_FILE_RIGHTS = LL_EXECUTE | LL_WRITE_FILE | LL_READ_FILE | LL_TRUNCATE | LL_IOCTL_DEV
LL_NET_BIND_TCP, LL_NET_CONNECT_TCP = 1, 2  # ABI 4
LL_SCOPE_ABSTRACT_UNIX_SOCKET, LL_SCOPE_SIGNAL = 1, 2  # ABI 6
LL_READ = LL_READ_FILE | LL_READ_DIR
LL_BOX = (LL_READ | LL_WRITE_FILE | LL_REMOVE_DIR | LL_REMOVE_FILE | LL_MAKE_DIR | LL_MAKE_REG | LL_REFER
          | LL_TRUNCATE)
LL_DEV = LL_READ_FILE | LL_WRITE_FILE | LL_IOCTL_DEV


def landlock_abi(sc):
    try:
        return max(0, sc.syscall(Sys.LANDLOCK_CREATE_RULESET, 0, 0, 1, what="landlock_create_ruleset"))
    except OSError:
        return 0


def landlock_ruleset(sc, abi, rules):
    """A Landlock ruleset fd allowing exactly `rules` [(path, rights)] (missing paths are skipped)."""
    ct = sc.ct

    class RulesetAttr(ct.Structure):
        _fields_ = (("handled_access_fs", ct.c_uint64), ("handled_access_net", ct.c_uint64),
                    ("scoped", ct.c_uint64))

    class PathBeneath(ct.Structure):  # __attribute__((packed)) in the uapi header
        _pack_ = 1
        _fields_ = (("allowed_access", ct.c_uint64), ("parent_fd", ct.c_int32))

    handled = (1 << 13) - 1
    if abi >= 2:
        handled |= LL_REFER
    if abi >= 3:
        handled |= LL_TRUNCATE
    if abi >= 5:
        handled |= LL_IOCTL_DEV
    attr = RulesetAttr(handled, 0, 0)
    size = 8
    if abi >= 4:
        attr.handled_access_net, size = LL_NET_BIND_TCP | LL_NET_CONNECT_TCP, 16
    if abi >= 6:
        attr.scoped, size = LL_SCOPE_ABSTRACT_UNIX_SOCKET | LL_SCOPE_SIGNAL, 24
    fd = sc.syscall(Sys.LANDLOCK_CREATE_RULESET, ct.byref(attr), size, 0, what="landlock_create_ruleset")
    try:
        for path, rights in rules:
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                rights &= handled
                if not stat.S_ISDIR(os.fstat(pfd).st_mode):
                    rights &= LL_FILE_RIGHTS
                rule = PathBeneath(rights, pfd)
                sc.syscall(Sys.LANDLOCK_ADD_RULE, fd, 1, ct.byref(rule), 0, what=f"landlock_add_rule {path}")
            finally:
                os.close(pfd)
    except BaseException:
        os.close(fd)
        raise
    return fd


# ----------------------------------------------------------------------------------------------- OS layer: jail
def _mkdirs(path):
    os.makedirs(path, mode=0o755, exist_ok=True)


def _touch(path):
    _mkdirs(os.path.dirname(path))
    if not os.path.lexists(path):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))


def _jail_target(jail, path):
    """Recreate in the jail the host symlinks met along `path` (e.g. /lib -> usr/lib); return the real path."""
    parts = [p for p in path.split("/") if p]
    cur = ""
    for k, comp in enumerate(parts):
        cur = f"{cur}/{comp}"
        if os.path.islink(cur):
            link = jail + cur
            if not os.path.lexists(link):
                _mkdirs(os.path.dirname(link))
                os.symlink(os.readlink(cur), link)
            rest = "/".join(parts[k + 1:])
            return _jail_target(jail, os.path.join(os.path.realpath(cur), rest) if rest else os.path.realpath(cur))
    return path


def _bind(sc, src, dst, readonly, extra=0):
    sc.mount(src, dst, None, MS_BIND)
    if readonly or extra:
        try:
            keep = os.statvfs(src).f_flag & MS_KEEP
        except OSError:
            keep = 0
        flags = MS_REMOUNT | MS_BIND | MS_NOSUID | keep | extra | (MS_RDONLY if readonly else 0)
        try:
            sc.mount(None, dst, None, flags)
        except OSError:
            sc.umount2(dst, MNT_DETACH)  # never leave a writable view of a host dir behind
            raise


def _box_tmpfs(sc, spec, dst):
    """The box as a tmpfs of this mount namespace, holding a copy of what the parent put in the box (the
    program): its size and inode count are the run's write quota, and it vanishes with the namespace, whatever
    the program built in it."""
    opts = (f"size={int(spec['max_write_mb'])}m,nr_inodes={int(spec['max_write_files']) + 1},mode=700,"
            f"uid={int(spec['uid'])},gid={int(spec['gid'])}")
    sc.mount("tmpfs", dst, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts)
    try:
        with os.scandir(spec["root"]) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    with open(entry.path, "rb") as src:
                        data = src.read()
                    fd = os.open(os.path.join(dst, entry.name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                                 0o644)
                    try:
                        os.write(fd, data)
                        os.fchown(fd, int(spec["uid"]), int(spec["gid"]))
                    finally:
                        os.close(fd)
    except BaseException:
        sc.umount2(dst, MNT_DETACH)
        raise


def build_jail(sc, spec, paths, rep):
    """Enter a private root holding only what the program may see (see the module docstring, step 2b)."""
    jail = spec["jail_dir"]
    box = spec["root"]
    sc.unshare(CLONE_NEWNS, "unshare(CLONE_NEWNS)")
    sc.mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount propagates back to the host
    sc.mount("tmpfs", jail, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=1m")
    # Parents before children, so a package inside a hidden dir is bound after the tmpfs that hides the dir.
    ops = [(p, "ro") for p in paths["ro"]] + [(p, "hide") for p in paths["hide"]] + [(p, "pkg") for p in paths["pkg"]]
    ops.sort(key=lambda op: (op[0].count("/"), op[1] == "pkg"))
    hidden = []
    for path, kind in ops:
        if not os.path.exists(path):
            continue
        real = _jail_target(jail, path)
        dst = jail + real
        if kind == "hide":
            if os.path.isdir(dst):
                sc.mount("tmpfs", dst, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=64k")
                hidden.append(dst)
            continue
        if os.path.ismount(dst) and kind != "pkg":
            continue
        if os.path.isdir(real):
            _mkdirs(dst)
        else:
            _touch(dst)
        _bind(sc, real, dst, readonly=True)
    for dst in hidden:
        sc.mount(None, dst, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=755")
    # The box, read-write (no exec, no devices, no setuid); the host dir itself only where no tmpfs could be had.
    _mkdirs(jail + box)
    try:
        _box_tmpfs(sc, spec, jail + box)
        rep["box_tmpfs"] = True
    except Exception as exc:  # noqa: BLE001 - the parent's measurements are the quota then
        rep["errors"]["box_tmpfs"] = f"{type(exc).__name__}: {exc}"[:200]
        _bind(sc, box, jail + box, readonly=False, extra=MS_NODEV | MS_NOEXEC)
    for dev in paths["dev"]:
        if os.path.exists(dev):
            _touch(jail + dev)
            sc.mount(dev, jail + dev, None, MS_BIND)
    # /dev/stdin: the run's input file itself (read-only), not a link through /proc/self/fd (root-only here).
    _touch(jail + "/dev/stdin")
    _bind(sc, spec.get("stdin_path") or "/dev/null", jail + "/dev/stdin", readonly=True)
    _mkdirs(jail + "/proc")
    proc = False
    for opts in ("hidepid=invisible", "hidepid=2"):  # only the sandbox uid's own processes are visible
        try:
            sc.mount("proc", jail + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts)
            proc = True
            break
        except OSError:
            continue
    sc.mount(None, jail, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=755")
    os.chdir(jail)
    nr = Sys.PIVOT_ROOT.get(os.uname().machine)
    try:
        if nr is None:
            raise OSError(38, "pivot_root: unknown syscall number on this architecture")
        sc.syscall(nr, sc.ct.c_char_p(b"."), sc.ct.c_char_p(b"."), what="pivot_root")
        sc.umount2(".", MNT_DETACH)  # the old root, stacked on "/" by pivot_root(".", ".")
    except OSError:
        # E.g. "/" is not a mount point (chroot-style containers): move the jail over "/" and chroot into it;
        # getting out of a chroot needs CAP_SYS_CHROOT, which the uid drop takes away.
        sc.mount(".", "/", None, 8192)  # MS_MOVE
        os.chroot(".")
    os.chdir("/")
    os.chdir(box)
    return proc


def others_can_reach(path):
    """Whether a non-owner, non-group uid can traverse to `path` (search permission on every ancestor)."""
    cur = ""
    for comp in [p for p in path.split("/") if p]:
        cur = f"{cur}/{comp}"
        try:
            st = os.stat(cur)
        except OSError:
            return False
        if not st.st_mode & 0o001:
            return False
    return True


def landlock_rules(spec, paths, jail):
    rules = [(spec["root"], LL_BOX)]
    for p in paths["pkg"]:
        rules.append((p, LL_READ))
    for p in paths["ro"]:
        if not jail and p in paths["stdlib"]:
            # Each entry but the hidden ones (site-/dist-packages may hold any project's files). In the jail
            # those are already empty tmpfs mounts, so the whole dir is fine there.
            hide = set(paths["hide"])
            rules.append((p, LL_READ_DIR))
            try:
                for entry in os.scandir(p):
                    if entry.path not in hide:
                        rules.append((entry.path, LL_READ))
            except OSError:
                pass
        else:
            rules.append((p, LL_READ))
    for p in paths["list"]:
        rules.append((p, LL_READ_DIR))
    for p in paths["dev"]:
        rules.append((p, LL_DEV))
    if jail:
        rules += [("/proc", LL_READ), ("/dev/stdin", LL_READ_FILE)]
    else:
        rules.append(("/proc/self/net", LL_READ))
        if spec.get("stdin_path"):
            rules.append((spec["stdin_path"], LL_READ_FILE))  # /dev/stdin -> /proc/self/fd/0 -> this file
    return rules


def isolate(spec, paths, rep, disabled, is_root, lap):
    """Network namespace, jail and a Landlock ruleset (not yet enforced: `restrict` does that after the uid
    drop). Returns (syscall helper or None, ruleset fd or None); fills `rep` (what is on, errors, timings)."""
    sc = None
    t = time.perf_counter()
    try:
        sc = Sys()
    except Exception as exc:  # noqa: BLE001 - no ctypes: only the Python layer is left
        rep["errors"]["ctypes"] = str(exc)[:200]
    t = lap("ctypes", t)
    if sc is not None and is_root and spec.get("netns", True) and "netns" not in disabled:
        try:
            sc.unshare(CLONE_NEWNET, "unshare(CLONE_NEWNET)")
            rep["netns"] = True
        except OSError as exc:
            rep["errors"]["netns"] = str(exc)[:200]
    t = lap("netns", t)
    if sc is not None and is_root and "ipcns" not in disabled:
        try:  # System V IPC objects and POSIX message queues made in the run die with it
            sc.unshare(CLONE_NEWIPC, "unshare(CLONE_NEWIPC)")
            rep["ipcns"] = True
        except OSError as exc:
            rep["errors"]["ipcns"] = str(exc)[:200]
    if sc is not None and is_root and "jail" not in disabled:
        try:
            rep["proc"] = build_jail(sc, spec, paths, rep)
            rep["jail"] = True
        except Exception as exc:  # noqa: BLE001 - best effort; Landlock and the hook still apply
            rep["errors"]["jail"] = f"{type(exc).__name__}: {exc}"[:200]
            try:
                os.chdir(spec["root"])
            except OSError:
                pass
    t = lap("jail", t)
    ll_fd = None
    if sc is not None and "landlock" not in disabled:
        abi = landlock_abi(sc)
        rep["landlock_abi"] = abi
        if abi >= 1:
            try:
                ll_fd = landlock_ruleset(sc, abi, landlock_rules(spec, paths, rep["jail"]))
            except OSError as exc:
                rep["errors"]["landlock"] = str(exc)[:200]
        else:
            rep["errors"]["landlock"] = "not supported by this kernel"
    lap("landlock_rules", t)
    return sc, ll_fd


def restrict(sc, ll_fd, rep, seccomp=None):
    """After the uid drop: no new privileges, the Landlock ruleset, then the seccomp filter (last: from then on
    no new namespace, no exec). `seccomp`: the spec's {"filter": hex, "denied": n} or {"error": why}; None when
    the layer is disabled."""
    if sc is None:
        return
    try:
        sc.prctl(PR_SET_NO_NEW_PRIVS, 1)
    except OSError as exc:  # then neither Landlock nor seccomp can be enforced by an unprivileged process
        rep["errors"]["no_new_privs"] = str(exc)[:200]
    if ll_fd is not None:
        try:
            sc.syscall(Sys.LANDLOCK_RESTRICT_SELF, ll_fd, 0, what="landlock_restrict_self")
            rep["landlock"] = rep["landlock_abi"]
        except OSError as exc:
            rep["errors"]["landlock"] = str(exc)[:200]
        os.close(ll_fd)
    if seccomp is not None:
        try:
            if "error" in seccomp:
                raise OSError(95, seccomp["error"])
            sc.seccomp(bytes.fromhex(seccomp["filter"]))
            rep["seccomp"] = int(seccomp["denied"])
        except OSError as exc:
            rep["errors"]["seccomp"] = str(exc)[:200]
