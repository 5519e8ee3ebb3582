"""The seccomp layer of the code sandbox: a classic-BPF syscall filter, written without libseccomp (its Python
binding needs a compiler; CI installs without one). The parent builds it once (`host_filter`) and passes it in
the run's spec; the guard installs it (sandbox_os.Sys.seccomp) last, after Landlock, just before the untrusted
program runs. Pure functions of (architecture, syscall table), so the program can be checked without a kernel.

What it denies, with EPERM: running any other program (execve, execveat: not every kernel's Landlock stops an
anonymous memory file run through /proc/self/fd/N, and without Landlock nothing else would), reaching into other
processes (ptrace, process_vm_*, kcmp, pidfd_getfd, process_madvise), new namespaces (unshare, setns, clone with
a CLONE_NEW* flag), leaving the process group the parent kills (setsid, setpgid), mounts (mount, umount2,
pivot_root, chroot and the fsopen family), kernel interfaces with a history of exploits or no use in a program
(io_uring, bpf, userfaultfd, perf_event_open, keyrings, modify_ldt, personality), and administration calls
(modules, kexec, swap, reboot, acct, quotactl, syslog, vhangup, iopl/ioperm, file handles, fanotify, NUMA page
moves), System V IPC and POSIX message queues (objects that would outlive the run). clone3 gets ENOSYS: its flags
sit in memory a filter cannot read, and glibc then falls back to clone. A second filter (`build_no_process_filter`)
is stacked in the process that runs the program: no new processes, threads only.
Any other architecture (e.g. i386 calls through int 0x80) and, on x86_64, the x32 ABI get EPERM for everything.
memfd_create stays allowed: once exec is denied an anonymous file runs nothing.
"""

import errno
import functools
import os
import struct

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
OFF_NR, OFF_ARCH, OFF_ARG0 = 0, 4, 16  # args[0] low word on little-endian arches (both below)
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
MACHINE_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}
X32_SYSCALL_BIT = 0x40000000

# Classic BPF opcodes (linux/filter.h).
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000

# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET (CLONE_NEWTIME is clone3/unshare only).
CLONE_NEW_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

CLONE_THREAD = 0x00010000

_COMMON = {  # same number on every arch since Linux 5.1 (the unified table from 403 on)
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429,
    "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435, "pidfd_getfd": 438,
    "process_madvise": 440, "mount_setattr": 442, "open_tree_attr": 467,
}
SYSCALLS = {
    "x86_64": {
        "clone": 56, "execve": 59, "ptrace": 101, "syslog": 103, "setpgid": 109, "setsid": 112, "uselib": 134,
        "personality": 135, "vhangup": 153, "modify_ldt": 154, "pivot_root": 155, "chroot": 161, "acct": 163,
        "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169, "iopl": 172, "ioperm": 173,
        "init_module": 175, "delete_module": 176, "quotactl": 179, "lookup_dcookie": 212, "kexec_load": 246,
        "add_key": 248, "request_key": 249, "keyctl": 250, "migrate_pages": 256, "unshare": 272,
        "move_pages": 279, "perf_event_open": 298, "fanotify_init": 300, "name_to_handle_at": 303,
        "open_by_handle_at": 304, "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
        "finit_module": 313, "kexec_file_load": 320, "bpf": 321, "execveat": 322, "userfaultfd": 323,
        "shmget": 29, "shmat": 30, "shmctl": 31, "fork": 57, "vfork": 58, "semget": 64, "semop": 65, "semctl": 66,
        "shmdt": 67, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "semtimedop": 220, "mq_open": 240,
        "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243, "mq_notify": 244, "mq_getsetattr": 245,
        **_COMMON,
    },
    "aarch64": {
        "lookup_dcookie": 18, "umount2": 39, "mount": 40, "pivot_root": 41, "chroot": 51, "vhangup": 58,
        "quotactl": 60, "acct": 89, "personality": 92, "unshare": 97, "kexec_load": 104, "init_module": 105,
        "delete_module": 106, "syslog": 116, "ptrace": 117, "reboot": 142, "setpgid": 154, "setsid": 157,
        "add_key": 217, "request_key": 218, "keyctl": 219, "clone": 220, "execve": 221, "swapon": 224,
        "swapoff": 225, "migrate_pages": 238, "move_pages": 239, "perf_event_open": 241, "fanotify_init": 262,
        "name_to_handle_at": 264, "open_by_handle_at": 265, "setns": 268, "process_vm_readv": 270,
        "process_vm_writev": 271, "kcmp": 272, "finit_module": 273, "bpf": 280, "execveat": 281,
        "userfaultfd": 282, "kexec_file_load": 294, "mq_open": 180, "mq_unlink": 181, "mq_timedsend": 182,
        "mq_timedreceive": 183, "mq_notify": 184, "mq_getsetattr": 185, "msgget": 186, "msgctl": 187,
        "msgrcv": 188, "msgsnd": 189, "semget": 190, "semctl": 191, "semtimedop": 192, "semop": 193, "shmget": 194,
        "shmctl": 195, "shmat": 196, "shmdt": 197, **_COMMON,
    },
}
DENY = (
    "execve", "execveat", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "process_madvise", "unshare", "setns", "setsid", "setpgid", "mount", "umount2", "pivot_root", "chroot",
    "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "open_tree_attr",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "userfaultfd", "perf_event_open", "keyctl",
    "add_key", "request_key", "modify_ldt", "personality", "uselib", "init_module", "finit_module",
    "delete_module", "kexec_load", "kexec_file_load", "swapon", "swapoff", "reboot", "acct", "quotactl",
    "syslog", "vhangup", "iopl", "ioperm", "lookup_dcookie", "open_by_handle_at", "name_to_handle_at",
    "fanotify_init", "migrate_pages", "move_pages",
    # System V IPC and POSIX message queues: objects that would outlive the run where it has no IPC namespace
    "shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semctl", "semtimedop", "msgget", "msgsnd", "msgrcv",
    "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
)


def host_arch():
    """The filter's name for this machine's architecture, or None where there is no table for it."""
    machine = os.uname().machine
    machine = MACHINE_ALIASES.get(machine, machine)
    return machine if machine in SYSCALLS else None


def denied_numbers(arch, numbers=None, deny=DENY):
    """The syscall numbers the filter always answers with EPERM on `arch` (clone, checked by its flags, and
    clone3, answered ENOSYS, are not among them)."""
    numbers = SYSCALLS.get(arch, {}) if numbers is None else numbers
    return sorted({numbers[name] for name in deny if name in numbers})


def _insn(code, k, jt=0, jf=0):
    return struct.pack("=HBBI", code, jt, jf, k & 0xFFFFFFFF)


def build_filter(arch, numbers, deny=DENY):
    """The filter for `arch` as packed `struct sock_filter`s. `numbers`: syscall name -> number on that arch
    (names it lacks are skipped: e.g. aarch64 has no iopl). Each denied number costs two instructions (compare,
    return), so no jump ever needs more than a one-instruction skip."""
    if arch not in AUDIT_ARCH:
        raise ValueError(f"no seccomp filter for architecture {arch!r}")
    eperm = RET_ERRNO | errno.EPERM
    prog = [_insn(LD_W_ABS, OFF_ARCH), _insn(JEQ_K, AUDIT_ARCH[arch], jt=1), _insn(RET_K, eperm),
            _insn(LD_W_ABS, OFF_NR)]
    if arch == "x86_64":
        prog += [_insn(JGE_K, X32_SYSCALL_BIT, jf=1), _insn(RET_K, eperm)]
    for nr in denied_numbers(arch, numbers, deny):
        prog += [_insn(JEQ_K, nr, jf=1), _insn(RET_K, eperm)]
    if "clone3" in numbers:
        prog += [_insn(JEQ_K, numbers["clone3"], jf=1), _insn(RET_K, RET_ERRNO | errno.ENOSYS)]
    if "clone" in numbers:  # the last check: it overwrites the accumulator with the flags
        prog += [_insn(JEQ_K, numbers["clone"], jf=3), _insn(LD_W_ABS, OFF_ARG0),
                 _insn(JSET_K, CLONE_NEW_FLAGS, jf=1), _insn(RET_K, eperm)]
    prog.append(_insn(RET_K, RET_ALLOW))
    if len(prog) > 4096:  # BPF_MAXINSNS
        raise ValueError("seccomp filter too long")
    return b"".join(prog)


def build_no_process_filter(arch, numbers):
    """The second filter, for the process that runs the program: no new process (fork, vfork, and clone without
    CLONE_THREAD get EPERM; clone3 already gets ENOSYS from the first), threads still allowed. With it the
    program's memory limit (RLIMIT_AS, per process) is the whole sample's. Stacked on the first filter: the kernel
    applies both, so this one needs no architecture check of its own beyond refusing what it cannot read."""
    if arch not in AUDIT_ARCH:
        raise ValueError(f"no seccomp filter for architecture {arch!r}")
    eperm = RET_ERRNO | errno.EPERM
    prog = [_insn(LD_W_ABS, OFF_ARCH), _insn(JEQ_K, AUDIT_ARCH[arch], jt=1), _insn(RET_K, eperm),
            _insn(LD_W_ABS, OFF_NR)]
    for name in ("fork", "vfork"):
        if name in numbers:
            prog += [_insn(JEQ_K, numbers[name], jf=1), _insn(RET_K, eperm)]
    prog += [_insn(JEQ_K, numbers["clone"], jf=3), _insn(LD_W_ABS, OFF_ARG0),
             _insn(JSET_K, CLONE_THREAD, jt=1), _insn(RET_K, eperm)]
    prog.append(_insn(RET_K, RET_ALLOW))
    return b"".join(prog)


@functools.cache
def host_no_process_filter():
    arch = host_arch()
    return None if arch is None else build_no_process_filter(arch, SYSCALLS[arch])


@functools.cache
def host_filter():
    """The filter for this machine, or None where its architecture has no table."""
    arch = host_arch()
    return None if arch is None else build_filter(arch, SYSCALLS[arch])
