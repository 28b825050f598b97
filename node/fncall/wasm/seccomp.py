"""The seccomp walls of the wasm worker and compile jails.

Two filters, stacked (the kernel applies the stricter answer of both):

1. ``kafel_policy()``, installed by nsjail before it execs Python: an **allowlist** of the
   system calls CPython, asyncio and wasmtime need. Everything else fails with EPERM:
   process creation (``clone`` only with ``CLONE_THREAD``, no ``fork``/``vfork``),
   ``socket`` (no network, no AF_VSOCK or netlink: the worker's only channel is its
   stdin/stdout pipes; ``socketpair`` stays for asyncio's wake-up pipe), ``ptrace``,
   mounts and namespaces, ``bpf``, ``io_uring``, ``keyctl``, ``userfaultfd``, ``kill`` of
   other processes, and every x32 system call (their numbers match no rule).
   ``execve`` must be allowed here, because nsjail's own exec of Python passes through it.
2. ``install_no_exec()``, installed by the worker itself once Python has started, before
   it reads any request: ``execve``/``execveat`` fail with EPERM and any call with the
   x32 bit fails too, so code that takes over the worker cannot exec a program.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
import struct
from typing import Final

#: What CPython (threads, asyncio) and wasmtime (mmap'd code, signal-based traps, memory
#: images) were seen to call in the worker, plus their close relatives.
ALLOWED: Final = (
    # memory
    "brk", "mmap", "munmap", "mprotect", "mremap", "madvise", "memfd_create", "ftruncate",
    "membarrier", "mlock", "munlock",
    # threads, signals, scheduling
    "futex", "set_robust_list", "get_robust_list", "set_tid_address", "rseq", "gettid",
    "getpid", "getppid", "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "sigaltstack",
    "rt_sigtimedwait", "rt_sigpending", "rt_sigsuspend", "tgkill", "sched_yield",
    "sched_getaffinity", "sched_getparam", "sched_getscheduler", "exit", "exit_group",
    "arch_prctl", "prctl", "getrlimit", "prlimit64", "getrusage", "times", "sysinfo",
    "newuname", "getuid", "geteuid", "getgid", "getegid", "getgroups", "getresuid",
    "getresgid", "getpgrp", "getpgid", "getsid", "umask", "setitimer", "getitimer",
    # time
    "clock_gettime", "clock_getres", "clock_nanosleep", "nanosleep", "gettimeofday", "time",
    # descriptors and files (inside the jail's own mounts)
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "lseek",
    "close", "close_range", "dup", "dup2", "dup3", "fcntl", "ioctl", "pipe", "pipe2",
    "eventfd2", "socketpair", "recvfrom", "sendto", "recvmsg", "sendmsg", "shutdown",
    "getsockname", "getsockopt", "setsockopt", "open", "openat", "openat2", "creat", "newstat",
    "newfstat", "newlstat", "newfstatat", "statx", "statfs", "fstatfs", "access", "faccessat",
    "faccessat2", "readlink", "readlinkat", "getdents64", "getcwd", "chdir", "fchdir",
    "mkdir", "mkdirat", "mknod", "mknodat", "rmdir", "unlink", "unlinkat", "rename",
    "renameat", "renameat2", "chmod", "fchmod", "fchmodat", "utimensat", "fsync",
    "fdatasync", "fadvise64", "fallocate", "flock", "getxattr", "fgetxattr", "lgetxattr",
    # waiting
    "poll", "ppoll", "select", "pselect6", "epoll_create", "epoll_create1", "epoll_ctl",
    "epoll_wait", "epoll_pwait", "epoll_pwait2",
    # randomness
    "getrandom",
    # nsjail's exec of the worker (the worker forbids it for itself: install_no_exec)
    "execve",
)  # fmt: skip

#: clone() flags a new thread always has; anything without CLONE_THREAD is a process.
CLONE_THREAD: Final = 0x00010000
#: CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER |
#: CLONE_NEWPID | CLONE_NEWNET
CLONE_NAMESPACE_FLAGS: Final = 0x7E020000
EPERM: Final = 1
ENOSYS: Final = 38


def kafel_policy() -> str:
    """The allowlist as one Kafel string for nsjail's ``--seccomp_string``."""
    allowed = ", ".join(ALLOWED)
    clone = (
        f"clone {{ (clone_flags & {CLONE_THREAD:#x}) != 0 && "
        f"(clone_flags & {CLONE_NAMESPACE_FLAGS:#x}) == 0 }}"
    )
    # clone3's flags live in memory seccomp cannot read: ENOSYS makes glibc use clone
    return f"ALLOW {{ {allowed}, {clone} }} ERRNO({ENOSYS}) {{ clone3 }} DEFAULT ERRNO({EPERM})"


# --- the worker's own filter ---------------------------------------------------------
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_SYSCALL_BIT = 0x40000000
_NR_EXECVE, _NR_EXECVEAT = 59, 322
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
# BPF opcodes: ld|w|abs, jmp|jeq|k, jmp|jge|k, ret|k
_LD, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _no_exec_program() -> bytes:
    def op(code: int, jt: int, jf: int, k: int) -> bytes:
        return struct.pack("HBBI", code, jt, jf, k)

    return b"".join(
        (
            op(_LD, 0, 0, 4),  # seccomp_data.arch
            op(_JEQ, 1, 0, _AUDIT_ARCH_X86_64),
            op(_RET, 0, 0, _RET_KILL_PROCESS),
            op(_LD, 0, 0, 0),  # seccomp_data.nr
            op(_JGE, 3, 0, _X32_SYSCALL_BIT),
            op(_JEQ, 2, 0, _NR_EXECVE),
            op(_JEQ, 1, 0, _NR_EXECVEAT),
            op(_RET, 0, 0, _RET_ALLOW),
            op(_RET, 0, 0, _RET_ERRNO | EPERM),
        )
    )


def install_no_exec() -> bool:
    """Forbid exec (and x32 calls) to this process for good; False where unsupported
    (not x86-64). Raises OSError if the kernel refuses the filter."""
    if platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    program = _no_exec_program()
    buffer = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")
    return True
