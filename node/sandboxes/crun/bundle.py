"""A sandbox's OCI bundle: ``config.json`` for crun (or runc) and the exec process spec.

Namespaces: user, pid, mount, ipc, uts, cgroup and network (only its own loopback, unless
the spec's allow list has the backend attach it: ``node.sandboxes.network``). The user
namespace maps the sandbox's ids 0-65535 to a host range no other sandbox holds
(``crun.uidranges``): root inside is an unprivileged host uid whose capability set below
reaches only the sandbox's own namespaces and files, under ``no_new_privs`` and the
seccomp allow-list (``node.sandboxes.crun.seccomp``); commands run as the image's
unprivileged user unless asked otherwise. PID 1 is ``corral-init`` (bind-mounted
read-only from a small tmpfs of the host's own, so no host path shows in the sandbox's
mountinfo), run as root: nothing inside can kill it, write its memory or change its
limits, it reaps orphans, and it starts the node's commands (``crun.spawn``). Host-wide
figures are masked or replaced by the sandbox's own (``crun.lxcfs``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from node.sandboxes.crun.seccomp import profile
from node.sandboxes.crun.uidranges import IdRange
from wire.sandboxes import SandboxSpec

INIT_PATH = "/.corral/init"
PERIOD_US = 100_000
#: what root inside a sandbox may do (Docker's default set, less NET_RAW and MKNOD)
ROOT_CAPABILITIES = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_AUDIT_WRITE",
    "CAP_SETFCAP",
]
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: read as empty inside (files) or as an empty directory: kernel memory and state of the
#: whole host (physical page maps, slab caches, timers, keys), its boot command line and
#: identifiers (boot id, firmware and DMI tables)
MASKED_PATHS = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/cmdline",
    "/proc/kcore",
    "/proc/keys",
    "/proc/key-users",
    "/proc/kpagecgroup",
    "/proc/kpagecount",
    "/proc/kpageflags",
    "/proc/latency_stats",
    "/proc/pagetypeinfo",
    "/proc/sched_debug",
    "/proc/scsi",
    "/proc/slabinfo",
    "/proc/sys/kernel/random/boot_id",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/vmallocinfo",
    "/proc/zoneinfo",
    "/sys/devices/virtual/dmi",
    "/sys/devices/virtual/powercap",
    "/sys/firmware",
]
READONLY_PATHS = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
]
NOFILE = 4096


def capabilities(uid: int) -> dict[str, list[str]]:
    caps = ROOT_CAPABILITIES if uid == 0 else []
    return {
        "bounding": ROOT_CAPABILITIES,
        "effective": caps,
        "permitted": caps,
        "inheritable": [],
        "ambient": [],
    }


def process(
    args: list[str],
    *,
    uid: int,
    gid: int,
    cwd: str,
    env: Mapping[str, str],
) -> dict[str, Any]:
    """An OCI ``process``: the container's PID 1, or a command ``crun exec`` runs."""
    return {
        "terminal": False,
        "user": {"uid": uid, "gid": gid, "additionalGids": [gid]},
        "args": args,
        "env": [f"{k}={v}" for k, v in env.items()],
        "cwd": cwd,
        "capabilities": capabilities(uid),
        "rlimits": [
            {"type": "RLIMIT_NOFILE", "hard": NOFILE, "soft": NOFILE},
            {"type": "RLIMIT_CORE", "hard": 0, "soft": 0},
        ],
        "noNewPrivileges": True,
    }


def config(
    spec: SandboxSpec,
    *,
    rootfs: Path,
    init_binary: Path,
    cgroup_parent: str,
    ids: IdRange | None,
    views: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """The sandbox's ``config.json``; ``ids`` its user namespace's host range (None: none,
    for tests of the walls that stand without one), ``views`` bind mounts of the
    sandbox's own figures over the host's (``crun.lxcfs``)."""
    memory = spec.memory_mb << 20
    namespaces = ["pid", "network", "ipc", "uts", "mount", "cgroup"]
    users: dict[str, Any] = {}
    if ids is not None:
        namespaces.insert(0, "user")
        mapping = [{"containerID": 0, "hostID": ids.first, "size": ids.size}]
        users = {"uidMappings": mapping, "gidMappings": mapping}
    # root, with the capability set below: it starts commands as any user (a non-root
    # uid keeps no capability once set); nothing inside can signal or kill it
    init = process([INIT_PATH], uid=0, gid=0, cwd="/", env={"PATH": DEFAULT_PATH})
    return {
        "ociVersion": "1.0.2",
        "process": init,
        "root": {"path": str(rootfs), "readonly": False},
        "hostname": "sandbox",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {
                "destination": "/dev",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
            },
            {
                "destination": "/dev/pts",
                "type": "devpts",
                "source": "devpts",
                "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
            },
            {
                "destination": "/dev/shm",
                "type": "tmpfs",
                "source": "shm",
                "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
            },
            {
                "destination": "/dev/mqueue",
                "type": "mqueue",
                "source": "mqueue",
                "options": ["nosuid", "noexec", "nodev"],
            },
            {
                "destination": "/sys",
                "type": "sysfs",
                "source": "sysfs",
                "options": ["nosuid", "noexec", "nodev", "ro"],
            },
            {
                "destination": "/sys/fs/cgroup",
                "type": "cgroup",
                "source": "cgroup",
                "options": ["nosuid", "noexec", "nodev", "relatime", "ro"],
            },
            {
                "destination": INIT_PATH,
                "type": "bind",
                "source": str(init_binary),
                "options": ["bind", "ro", "nosuid", "nodev"],
            },
            *views,
        ],
        "linux": {
            "namespaces": [{"type": kind} for kind in namespaces],
            **users,
            "cgroupsPath": f"/{cgroup_parent}/{spec.sandbox_id}",
            "resources": {
                "devices": [{"allow": False, "access": "rwm"}],
                "memory": {"limit": memory, "swap": memory},
                "pids": {"limit": spec.pids},
                "cpu": {"quota": int(spec.cpu * PERIOD_US), "period": PERIOD_US},
            },
            "maskedPaths": MASKED_PATHS,
            "readonlyPaths": READONLY_PATHS,
            "seccomp": profile(),
        },
    }
