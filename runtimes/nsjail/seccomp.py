"""The seccomp-bpf policy every jail runs under, written in Kafel for ``--seccomp_string``.

The jail already has no capabilities, so most of these calls would fail anyway; the
filter is the second wall, and it shrinks the kernel surface that hostile code can reach
(io_uring, bpf, perf, keyrings, userfaultfd, nested namespaces). Denied calls fail with
EPERM, so programs get a normal error instead of dying with SIGSYS; ``clone3`` fails with
ENOSYS because its flags cannot be inspected by seccomp and glibc then falls back to
``clone``, whose namespace flags are filtered.
"""

from __future__ import annotations

from typing import Final

#: Kernel modules, kexec, reboot and swap: host administration.
ADMIN: Final = (
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "syslog",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "iopl",
    "ioperm",
    "vhangup",
)

#: Mounts and namespaces: would let code rearrange or leave its jail.
#: (Kafel calls x86-64 syscall 166, umount2, ``umount``.)
NAMESPACES: Final = (
    "mount",
    "umount",
    "pivot_root",
    "chroot",
    "setns",
    "unshare",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "open_tree",
    "move_mount",
    "mount_setattr",
)

#: Debugging and cross-process memory access.
INTROSPECTION: Final = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "perf_event_open",
    "kcmp",
)

#: Large or historically buggy kernel interfaces user code has no use for.
ATTACK_SURFACE: Final = (
    "bpf",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "open_by_handle_at",
    "name_to_handle_at",
    "lookup_dcookie",
    "fanotify_init",
    "uselib",
    # POSIX message queues outlive their processes and cannot be listed without an
    # mqueue mount, so the zygote could not clear them between calls.
    "mq_open",
    "mq_unlink",
    "mq_timedsend",
    "mq_timedreceive",
    "mq_notify",
    "mq_getsetattr",
)

DENIED: Final = ADMIN + NAMESPACES + INTROSPECTION + ATTACK_SURFACE

#: CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER |
#: CLONE_NEWPID | CLONE_NEWNET
CLONE_NAMESPACE_FLAGS: Final = 0x7E020000

EPERM: Final = 1
ENOSYS: Final = 38


def kafel_policy() -> str:
    """The policy as one Kafel string."""
    denied = ", ".join(DENIED)
    clone_rule = f"clone {{ (clone_flags & {CLONE_NAMESPACE_FLAGS:#x}) != 0 }}"
    return f"ERRNO({EPERM}) {{ {denied}, {clone_rule} }} ERRNO({ENOSYS}) {{ clone3 }} DEFAULT ALLOW"
