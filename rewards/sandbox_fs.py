"""The code sandbox's file-system side on the host (parent process): what a sandboxed program may read
(`host_paths`, with the library directories the interpreter really loads from), how much its box holds
(`tree_usage`, the write quota where no size-limited tmpfs is available) and the removal of whatever it left
(`remove_tree`, which never raises and never recurses).
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import stat
import subprocess
import sys

logger = logging.getLogger(__name__)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_PATH_FLAGS = getattr(os, "O_PATH", 0) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


# ------------------------------------------------------------------------------------------ what may be read
def under(path: str, roots) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _both(path: str) -> list[str]:
    out = [os.path.normpath(path)]
    real = os.path.realpath(path)
    if real != out[0]:
        out.append(real)
    return out


# Run in a fresh interpreter (ours may have loaded anything, torch included): import what a sandboxed program
# can import (every stdlib extension module, the allowed packages and their extension modules), then list the
# shared objects mapped into the process.
LIB_PROBE = r"""
import importlib, json, os, sys
for d in [p for p in sys.path if p.endswith("lib-dynload") and os.path.isdir(p)]:
    for f in sorted(os.listdir(d)):
        if f.endswith(".so"):
            try:
                importlib.import_module(f.split(".")[0])
            except BaseException:
                pass
for name in json.loads(sys.argv[1]):
    try:
        pkg = importlib.import_module(name)
    except BaseException:
        continue
    for base in getattr(pkg, "__path__", []):
        for root, _dirs, files in os.walk(base):
            for f in files:
                if f.endswith(".so"):
                    rel = os.path.relpath(os.path.join(root, f.split(".")[0]), base).replace(os.sep, ".")
                    try:
                        importlib.import_module(name + "." + rel)
                    except BaseException:
                        pass
libs = set()
with open("/proc/self/maps") as maps:
    for line in maps:
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/") and ".so" in os.path.basename(parts[5]):
            libs.add(parts[5].strip())
print("\n" + json.dumps(sorted(libs)))
"""


def loaded_libraries(packages: tuple[str, ...]) -> list[str]:
    """Real paths of the shared libraries a sandboxed program can end up loading (see LIB_PROBE)."""
    try:
        out = subprocess.run([sys.executable, "-I", "-c", LIB_PROBE, json.dumps(list(packages))],
                             capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "TERM": "dumb"},
                             stdin=subprocess.DEVNULL)
        return [p for p in json.loads(out.stdout.strip().splitlines()[-1]) if os.path.isfile(p)]
    except Exception as exc:  # noqa: BLE001 - then only what this process itself maps
        logger.warning("code sandbox: could not list the interpreter's libraries in a fresh process (%s); using "
                       "this process's own", exc)
        libs = set()
        with open("/proc/self/maps") as maps:
            for line in maps:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/") and ".so" in os.path.basename(parts[5]):
                    libs.add(parts[5].strip())
        return sorted(p for p in libs if os.path.isfile(p))


def _aliases(path: str) -> list[str]:
    """`path` as the dynamic loader may name it: through top-level symlinks like /lib -> usr/lib (ld.so.cache
    lists /lib/x86_64-linux-gnu/...), so that the jail recreates those links."""
    out = [path]
    for link in ("/lib", "/lib64", "/lib32", "/libx32", "/usr/lib64"):
        if os.path.islink(link):
            target = os.path.realpath(link)
            if under(path, [target]):
                out.append(link + path[len(target):])
    return out


def library_paths(libs: list[str], readable: list[str], python_dirs: list[str]) -> list[str]:
    """Directories of `libs`, where a directory holds no Python tree (else the files themselves, with the
    symlinks next to them that name them): the loader needs the libraries, not whole system trees, which
    also hold other interpreters' dist-packages."""
    out: list[str] = []
    for lib in libs:
        if under(lib, readable):
            continue  # the stdlib's, an allowed package's
        d = os.path.dirname(lib)
        try:
            names = os.listdir(d)
        except OSError:
            continue
        pythonic = any(n.startswith("python") or n in ("site-packages", "dist-packages") for n in names)
        if not pythonic and not any(under(p, [d]) for p in python_dirs):
            out += _aliases(d)
            continue
        out += _aliases(lib)
        for n in names:
            p = os.path.join(d, n)
            if os.path.islink(p) and os.path.realpath(p) == lib:
                out += _aliases(p)
    return list(dict.fromkeys(out))


@functools.cache
def host_paths(packages: tuple[str, ...] = ("numpy",)) -> dict:
    """The paths a sandboxed program may read, as this interpreter names them (plus their real paths):
    stdlib: the interpreter's stdlib dir(s) (lib-dynload included); hide: site-/dist-packages inside them (may
    hold anything, this project included); pkg: the allowed packages' dirs (and "<name>.libs"); list: the
    site-packages dirs (listing only, for the import system); ro: stdlib + the library dirs the interpreter and
    those packages load from + a few files (ld.so.cache, localtime, zoneinfo, CPU topology); dev: device nodes."""
    import importlib.util
    import sysconfig

    stdlib = os.path.dirname(os.__file__)
    stdlib_dirs = _both(stdlib)
    for entry in sys.path:
        if entry.endswith("lib-dynload") and os.path.isdir(entry) and not under(entry, stdlib_dirs):
            stdlib_dirs += _both(entry)
    hide = [os.path.join(d, n) for d in stdlib_dirs for n in ("site-packages", "dist-packages")
            if os.path.isdir(os.path.join(d, n))]
    pkg: list[str] = []
    for name in packages:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            continue
        locations = list(spec.submodule_search_locations or []) or ([spec.origin] if spec.origin else [])
        for loc in locations:
            pkg += _both(loc)
            libs = os.path.join(os.path.dirname(loc), os.path.basename(loc) + ".libs")
            if os.path.isdir(libs):
                pkg += _both(libs)
    listing = set()
    for key in ("purelib", "platlib"):
        listing.update(_both(sysconfig.get_paths()[key]))
    listing.update(os.path.normpath(e) for e in sys.path if e.endswith(("site-packages", "dist-packages")))
    python_dirs = stdlib_dirs + pkg + sorted(listing) + _both(sys.prefix) + _both(sys.base_prefix)
    syslibs = library_paths(loaded_libraries(tuple(packages)), stdlib_dirs + pkg, python_dirs)
    misc = [p for d in ("/etc/ld.so.cache", "/etc/localtime", "/usr/share/zoneinfo", "/sys/devices/system/cpu")
            if os.path.exists(d) for p in _both(d)]
    ro = list(dict.fromkeys(stdlib_dirs + syslibs + misc))
    dev = [d for d in ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random") if os.path.exists(d)]
    return {"stdlib": stdlib_dirs, "hide": hide, "pkg": list(dict.fromkeys(pkg)), "list": sorted(listing),
            "ro": ro, "dev": dev}


# ------------------------------------------------------------------------------------- what the program left
def _open_dir(name: str, dir_fd: int | None) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        pass
    # A directory its owner made unreadable (root is never refused): restore the owner's rights through an
    # O_PATH handle, which needs none and cannot be a symlink swapped in meanwhile.
    handle = os.open(name, _PATH_FLAGS, dir_fd=dir_fd)
    try:
        os.chmod(f"/proc/self/fd/{handle}", 0o700)
    finally:
        os.close(handle)
    return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


def _walk(path: str, remove: bool, max_files: float, max_bytes: float) -> tuple[int, int]:
    """(entries, bytes on disk) under `path`; removes them when `remove`. Iterative and descriptor-based: depth
    costs no stack and no more than two open descriptors, names are never resolved through symlinks, and a
    tree moved while we walk it stops the walk instead of leading it elsewhere. Stops early (not removing)
    once over `max_files` or `max_bytes`."""
    files = used = 0
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0, 0
    if not stat.S_ISDIR(st.st_mode):
        if remove:
            os.unlink(path)
        return 1, st.st_blocks * 512
    cur = _open_dir(path, None)
    cur_id = (st.st_dev, st.st_ino)
    stack: list[tuple[tuple[int, int], list[str], str]] = []  # (ancestor id, its dirs still to do, child taken)
    pending: list[str] | None = None
    try:
        while True:
            if pending is None:
                pending = []
                if remove:
                    mode = os.fstat(cur).st_mode
                    if mode & 0o700 != 0o700:  # unlink needs write and search on the dir itself
                        os.fchmod(cur, stat.S_IMODE(mode) | 0o700)
                with os.scandir(cur) as entries:
                    for entry in entries:
                        try:
                            est = entry.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        files += 1
                        used += est.st_blocks * 512
                        if not remove and (files > max_files or used > max_bytes):
                            return files, used
                        if stat.S_ISDIR(est.st_mode):
                            pending.append(entry.name)
                        elif remove:
                            try:
                                os.unlink(entry.name, dir_fd=cur)
                            except FileNotFoundError:
                                pass
            if pending:
                name = pending.pop()
                try:
                    sub = _open_dir(name, cur)
                except FileNotFoundError:
                    continue
                except PermissionError:
                    if remove:
                        raise
                    continue  # counting only: a dir not ours to open is left out
                except OSError as exc:
                    if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                        raise
                    if remove:  # swapped for a file or a symlink after the listing
                        os.unlink(name, dir_fd=cur)
                    continue
                stack.append((cur_id, pending, name))
                os.close(cur)
                sst = os.fstat(sub)
                cur, cur_id, pending = sub, (sst.st_dev, sst.st_ino), None
                continue
            if not stack:
                break
            parent_id, pending, name = stack.pop()
            parent = os.open("..", _DIR_FLAGS, dir_fd=cur)
            os.close(cur)
            cur = parent
            pst = os.fstat(cur)
            if (pst.st_dev, pst.st_ino) != parent_id:
                raise OSError(errno.ESTALE, f"{path}: the tree moved while it was walked")
            cur_id = parent_id
            if remove:
                os.rmdir(name, dir_fd=cur)
    finally:
        os.close(cur)
    if remove:
        os.rmdir(path)
    return files, used


def tree_usage(path: str, max_files: float = float("inf"), max_bytes: float = float("inf")) -> tuple[int, int]:
    """(entries, bytes on disk) under `path`, counted only until either limit is passed; (0, 0) if it is gone."""
    try:
        return _walk(path, False, max_files, max_bytes)
    except OSError:
        return 0, 0


def remove_tree(path: str) -> tuple[int, int]:
    """Remove `path` whatever is in it (any depth, odd names, unreadable or read-only dirs, files chmod 000,
    fifos, sockets); returns (entries, bytes) it held. Never raises: a failure is logged (and retried once,
    for a tree that was still changing)."""
    for attempt in (1, 2):
        try:
            return _walk(path, True, float("inf"), float("inf"))
        except Exception as exc:  # noqa: BLE001 - cleanup must not fail the run
            if attempt == 2:
                logger.error("code sandbox: could not remove %s: %s: %s", path, type(exc).__name__, exc)
    return 0, 0
