"""The seccomp policy of a container sandbox, in the OCI runtime spec's JSON form.

An allow-list: the FnCall jails' list (``node.fncall.nsjail.seccomp``, derived by tracing
every language's toolchain) plus what a long-lived machine's own administration needs
(switching users and groups, ``chroot``, capabilities within the container's bounding
set: ``apt-get`` drops to ``_apt``, ``su`` and ``sudo`` switch users). Refused, with
``EPERM``: anything else, among it ``mount``, ``unshare``, ``setns``, ``bpf``,
``ptrace`` of other users' processes, keyrings and ``io_uring``; ``clone`` with a
``CLONE_NEW*`` flag (a nested user namespace would hand the code capabilities over new
namespaces and a kernel surface the container's own do not expose); ``prlimit64``,
``setpriority`` and the ``sched_set*`` calls aimed at any process but the caller (root
inside shares PID 1's ids, so the kernel alone would let it lower ``corral-init``'s
open-file limit and wedge every later command, as the jails' filter already refuses);
sockets of any
family but unix, inet and inet6 (no vsock to the hypervisor, no netlink). ``clone3``
answers ``ENOSYS`` (its flags are out of seccomp's reach; libc falls back to
``clone``). Only the native x86-64 ABI is listed: x32 and i386 numbers are refused by
the architecture check.
"""

from __future__ import annotations

from typing import Any

from node.fncall.nsjail import seccomp as jail_seccomp

EPERM = 1
ENOSYS = 38
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
#: CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
CLONE_NEW_MASK = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000
CLONE_NEW_MASK |= 0x20000000 | 0x40000000 | 0x00000080

ADMINISTRATION = (
    "setuid",
    "setgid",
    "setreuid",
    "setregid",
    "setresuid",
    "setresgid",
    "setfsuid",
    "setfsgid",
    "setgroups",
    "capset",
    "chroot",
    "personality",
    "fchmodat2",
)
#: allowed only on the calling process (its pid argument, at this index, is 0)
SELF_ONLY = jail_seccomp.SELF_ONLY
_ARGUMENT_INDEX = {"pid": 0, "who": 1}
#: decided by argument below, so never allowed by name alone
BY_ARGUMENT = ("socket", "socketpair", "clone", "clone3", *SELF_ONLY)
PRIO_PROCESS = 0


def allowed() -> list[str]:
    names = set(jail_seccomp.allowed()) | set(ADMINISTRATION)
    return sorted(names - set(BY_ARGUMENT))


def profile() -> dict[str, Any]:
    """``linux.seccomp`` of the sandbox's OCI config."""
    rules: list[dict[str, Any]] = [{"names": allowed(), "action": "SCMP_ACT_ALLOW"}]
    for family in (AF_UNIX, AF_INET, AF_INET6):
        for call in ("socket", "socketpair"):
            rules.append(
                {
                    "names": [call],
                    "action": "SCMP_ACT_ALLOW",
                    "args": [{"index": 0, "value": family, "op": "SCMP_CMP_EQ"}],
                }
            )
    rules.append(
        {
            "names": ["clone"],
            "action": "SCMP_ACT_ALLOW",
            "args": [
                {"index": 0, "value": CLONE_NEW_MASK, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}
            ],
        }
    )
    for call, argument in SELF_ONLY.items():
        index = _ARGUMENT_INDEX[argument]
        args = [{"index": index, "value": 0, "op": "SCMP_CMP_EQ"}]
        if call == "setpriority":  # and of this process, not its group or its user's
            args.append({"index": 0, "value": PRIO_PROCESS, "op": "SCMP_CMP_EQ"})
        rules.append({"names": [call], "action": "SCMP_ACT_ALLOW", "args": args})
    rules.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS})
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": EPERM,
        "architectures": ["SCMP_ARCH_X86_64"],
        "syscalls": rules,
    }
