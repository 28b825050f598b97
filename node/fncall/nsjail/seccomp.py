"""The seccomp-bpf policy every process of every jail runs under: an allow-list, written in
Kafel for ``--seccomp_string``.

nsjail installs it before it execs the zygote, so PID 1, the template and all code (Python
in the template's interpreter, and every exec'd toolchain and program) run under it. One
list serves every language: whatever the language of a jail, its code can exec any
interpreter under ``/usr`` (bash can run ``python3``, Python can run ``node``), so a
narrower list for one language would not narrow what its code can reach.

Decisions, first match wins:

* ``socket``/``socketpair`` of any family but AF_UNIX, AF_INET, AF_INET6 ->
  EAFNOSUPPORT (what a kernel without the family says): no AF_VSOCK to the hypervisor,
  no AF_NETLINK, AF_PACKET, AF_ALG, AF_KEY, AF_XDP, ... The jail's network namespace has
  only ``lo``, so AF_INET/AF_INET6 reach nothing outside it.
* ``clone`` with any ``CLONE_NEW*`` flag, ``prlimit64``, ``setpriority``,
  ``sched_setaffinity`` and the ``sched_set*`` calls aimed at another process (the code
  could otherwise lower PID 1's limits or priority: same uid) -> EPERM.
* ``clone3`` -> ENOSYS: its flags are in memory seccomp cannot read; glibc then falls
  back to ``clone``, whose flags are filtered.
* ``ALLOWED`` (below, by group) -> allowed.
* everything else -> EPERM: ``DENIED`` (kept as a list so that the tests and reviewers
  see what is refused on purpose), any call added to the kernel later, and every number
  outside the x86-64 table, which includes every x32 call (``nr | 0x40000000``: the x32
  ABI would otherwise reach ``unshare``, ``mount``, ``bpf`` under numbers no rule names)
  and ``int 0x80`` calls (another audit arch: killed by the arch check Kafel emits).

Errors instead of SIGSYS kills let programs fail normally. The list was derived by
tracing (strace, from the host) the hello world, compile and typical programs of every
language (threads, processes, pipes, sockets on ``lo``, files, mmap, timers, signals,
SysV IPC) and the zygote itself, then completed with the siblings of each call seen
(``pwrite64`` with ``pread64``, ``epoll_pwait2`` with ``epoll_pwait``).
"""

from __future__ import annotations

from typing import Final

EPERM: Final = 1
ENOSYS: Final = 38
EAFNOSUPPORT: Final = 97

#: AF_UNIX, AF_INET, AF_INET6
SOCKET_FAMILIES: Final = (1, 2, 10)

#: CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER |
#: CLONE_NEWPID | CLONE_NEWNET
CLONE_NAMESPACE_FLAGS: Final = 0x7E020000

ALLOWED: Final[dict[str, tuple[str, ...]]] = {
    "files": (
        "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev",
        "preadv2", "pwritev2", "open", "openat", "openat2", "creat", "close", "close_range",
        "lseek", "stat", "fstat", "lstat", "newfstatat", "statx", "statfs", "fstatfs",
        "access", "faccessat", "faccessat2", "getdents", "getdents64", "getcwd", "chdir",
        "fchdir", "mkdir", "mkdirat", "rmdir", "unlink", "unlinkat", "rename", "renameat",
        "renameat2", "link", "linkat", "symlink", "symlinkat", "readlink", "readlinkat",
        "chmod", "fchmod", "fchmodat", "chown", "fchown", "lchown", "fchownat", "truncate",
        "ftruncate", "fallocate", "fsync", "fdatasync", "sync", "syncfs", "sync_file_range",
        "fadvise64", "readahead", "utime", "utimes", "utimensat", "futimesat", "umask",
        # FIFOs (device nodes need a capability nobody in a jail has)
        "mknod", "mknodat",
        "flock", "fcntl", "dup", "dup2", "dup3", "pipe", "pipe2", "sendfile",
        "copy_file_range", "splice", "tee", "ioctl",
        # reading extended attributes (ls, Java); setting them is refused
        "getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr", "flistxattr",
    ),
    "memory": (
        "brk", "mmap", "munmap", "mprotect", "mremap", "madvise", "msync", "mincore",
        "mlock", "mlock2", "munlock", "mlockall", "munlockall", "membarrier",
        "memfd_create", "pkey_alloc", "pkey_free", "pkey_mprotect",
        # the JVM reads and sets its own NUMA policy
        "get_mempolicy", "set_mempolicy", "mbind",
    ),
    "processes": (
        "clone", "fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4",
        "waitid", "getpid", "getppid", "gettid", "getpgid", "setpgid", "getpgrp", "getsid",
        "setsid", "prctl", "arch_prctl", "set_tid_address", "set_robust_list", "rseq",
        "pidfd_open", "pidfd_send_signal", "kill", "tkill", "tgkill",
        "sched_yield", "sched_getaffinity", "sched_setaffinity", "sched_getscheduler",
        "sched_setscheduler", "sched_getparam", "sched_setparam", "sched_getattr",
        "sched_setattr", "sched_get_priority_max", "sched_get_priority_min",
        "sched_rr_get_interval", "getpriority", "setpriority", "getrlimit", "setrlimit",
        "prlimit64", "getrusage", "times", "capget", "seccomp",
    ),
    "signals": (
        "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigsuspend", "rt_sigpending",
        "rt_sigtimedwait", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "sigaltstack", "pause",
        "alarm", "signalfd", "signalfd4", "restart_syscall",
    ),
    "time": (
        "nanosleep", "clock_nanosleep", "clock_gettime", "clock_getres", "gettimeofday",
        "time", "getitimer", "setitimer", "timer_create", "timer_settime", "timer_gettime",
        "timer_getoverrun", "timer_delete", "timerfd_create", "timerfd_settime",
        "timerfd_gettime",
    ),
    "waiting": (
        "futex", "futex_waitv", "poll", "ppoll", "select", "pselect6", "epoll_create",
        "epoll_create1", "epoll_ctl", "epoll_wait", "epoll_pwait", "epoll_pwait2",
        "eventfd", "eventfd2",
    ),
    "sockets": (
        "socket", "socketpair", "bind", "listen", "accept", "accept4", "connect",
        "getsockname", "getpeername", "sendto", "recvfrom", "sendmsg", "recvmsg",
        "sendmmsg", "recvmmsg", "shutdown", "setsockopt", "getsockopt",
    ),
    # SysV IPC lives in the jail's IPC namespace; the zygote removes what is left
    "sysv_ipc": (
        "shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semctl",
        "msgget", "msgsnd", "msgrcv", "msgctl",
    ),
    "identity": (
        "getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid", "getgroups",
        "uname", "sysinfo", "getrandom", "getcpu",
    ),
}  # fmt: skip

#: Refused with EPERM on purpose (the default would refuse them too).
DENIED: Final[dict[str, tuple[str, ...]]] = {
    "host administration": (
        "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
        "reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog",
        "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "iopl", "ioperm",
        "vhangup", "sethostname", "setdomainname",
    ),
    "mounts and namespaces": (
        "mount", "umount2", "pivot_root", "chroot", "setns", "unshare", "fsopen",
        "fsconfig", "fsmount", "fspick", "open_tree", "move_mount", "mount_setattr",
    ),
    "other processes": (
        "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
        "process_madvise", "process_mrelease", "migrate_pages", "move_pages",
        "get_robust_list", "ioprio_set",
    ),
    "attack surface": (
        "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key",
        "io_uring_setup", "io_uring_enter", "io_uring_register", "io_setup", "io_submit",
        "io_getevents", "io_pgetevents", "io_cancel", "io_destroy", "open_by_handle_at",
        "name_to_handle_at", "lookup_dcookie", "fanotify_init", "uselib", "memfd_secret",
        "modify_ldt", "personality", "remap_file_pages", "vmsplice", "sysfs", "ustat",
    ),
    # POSIX message queues outlive their processes and cannot be listed without an
    # mqueue mount, so the zygote could not clear them between calls
    "message queues": (
        "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify",
        "mq_getsetattr",
    ),
    # shared per-uid counters of the host (every jail is uid 65534): one tenant could
    # use up the instances of all
    "per-user host counters": (
        "inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch",
    ),
    # changing ids or capabilities: nothing to gain without capabilities
    "identity changes": (
        "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setfsuid",
        "setfsgid", "setgroups", "capset",
    ),
    "extended attributes": (
        "setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr",
        "fremovexattr",
    ),
}  # fmt: skip

#: Allowed only for the caller itself (argument ``pid``/``who`` 0): aimed at another
#: process of the jail (PID 1, the template: same uid) they are refused.
SELF_ONLY: Final = {
    "prlimit64": "pid",
    "sched_setaffinity": "pid",
    "sched_setscheduler": "pid",
    "sched_setparam": "pid",
    "sched_setattr": "pid",
    "setpriority": "who",
}

#: Kafel spells some calls by their kernel function (``sys_newstat``).
KAFEL_NAMES: Final = {
    "stat": "newstat",
    "fstat": "newfstat",
    "lstat": "newlstat",
    "uname": "newuname",
    "umount2": "umount",
    "sendfile": "sendfile64",
}


def allowed() -> list[str]:
    return [name for group in ALLOWED.values() for name in group]


def denied() -> list[str]:
    return [name for group in DENIED.values() for name in group]


def _kafel(name: str) -> str:
    return KAFEL_NAMES.get(name, name)


def kafel_policy() -> str:
    """The policy as one Kafel string."""
    families = " && ".join(f"family != {family}" for family in SOCKET_FAMILIES)
    refused_families = f"socket {{ {families} }}, socketpair {{ {families} }}"
    self_only = [f"{name} {{ {arg} != 0 }}" for name, arg in SELF_ONLY.items()]
    eperm = [f"clone {{ (clone_flags & {CLONE_NAMESPACE_FLAGS:#x}) != 0 }}", *self_only]
    return (
        f"ERRNO({EAFNOSUPPORT}) {{ {refused_families} }} "
        f"ERRNO({EPERM}) {{ {', '.join(eperm)} }} "
        f"ERRNO({ENOSYS}) {{ clone3 }} "
        f"ERRNO({EPERM}) {{ {', '.join(map(_kafel, denied()))} }} "
        f"ALLOW {{ {', '.join(map(_kafel, allowed()))} }} "
        f"DEFAULT ERRNO({EPERM})"
    )
