"""Control groups: which hierarchy this host offers, and how a jail gets its groups.

cgroup v1 (and hybrid hosts, whose memory, pids and cpu controllers are v1): the host
creates ``<controller>/<parent>/<jail id>`` for memory, pids, cpu and cpuacct itself and
starts nsjail inside them (``for_new_jail``; nsjail gets no cgroup flags). Every process
of the jail is born in its groups, so the jail's cgroup namespace is rooted there
(``/proc/self/cgroup`` shows ``/``) and ``cpuacct.usage`` counts all of them. cgroup v2:
nsjail creates ``NSJAIL.<pid>`` (``nsjail_flags``) and the host finds it from the
zygote's pid (``for_running_jail``). Jails of other runtimes (the wasm worker) let nsjail
make their groups on both hierarchies (``nsjail_flags``). The handles are in
``node.fncall.nsjail.jailcgroup``.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from node.fncall.nsjail.config import NsjailConfig
from node.fncall.nsjail.jailcgroup import CgroupError, JailCgroup, V1JailCgroup, V2JailCgroup

logger = logging.getLogger(__name__)

__all__ = ["CgroupError", "CgroupMode", "CgroupSetup", "JailCgroup", "detect"]


class CgroupMode(StrEnum):
    V1 = "v1"
    V2 = "v2"
    OFF = "off"


@dataclass(frozen=True, slots=True)
class CgroupSetup:
    """The hierarchy in use and where each controller is mounted."""

    mode: CgroupMode
    parent: str
    memory: Path | None = None  # v1 controller mounts
    pids: Path | None = None
    cpu: Path | None = None
    cpuacct: Path | None = None  # may be the cpu mount (cpu,cpuacct mounted together)
    root: Path | None = None  # v2 mount

    def nsjail_flags(self, *, memory_bytes: int, pids: int, cpu_ms_per_sec: int) -> list[str]:
        """nsjail's flags for a jail whose groups nsjail makes itself, on either hierarchy
        (the wasm worker and compile jails). The nsjail runtime makes its jails' v1 groups
        itself (``for_new_jail``) and asks for these flags on v2 only."""
        if self.mode is CgroupMode.OFF:
            return []
        flags = ["--cgroup_mem_max", str(memory_bytes), "--cgroup_pids_max", str(pids)]
        if self.mode is CgroupMode.V2:
            assert self.root is not None
            flags += ["--use_cgroupv2", "--cgroupv2_mount", str(self.root)]
            if cpu_ms_per_sec:
                flags += ["--cgroup_cpu_ms_per_sec", str(cpu_ms_per_sec)]
            return flags
        assert self.memory is not None and self.pids is not None
        flags += ["--cgroup_mem_mount", str(self.memory), "--cgroup_mem_parent", self.parent]
        flags += ["--cgroup_pids_mount", str(self.pids), "--cgroup_pids_parent", self.parent]
        if cpu_ms_per_sec and self.cpu is not None:
            flags += ["--cgroup_cpu_mount", str(self.cpu), "--cgroup_cpu_parent", self.parent]
            flags += ["--cgroup_cpu_ms_per_sec", str(cpu_ms_per_sec)]
        return flags

    def ensure_parents(self, memory_mb: int | None = None) -> None:
        """Create the v1 parent cgroups (v2 needs none), limit the memory of all the jails
        under them together to ``memory_mb``, and remove the groups of jails a node that
        died could not remove (``sweep``)."""
        if self.mode is not CgroupMode.V1:
            return
        for mount in (self.memory, self.pids, self.cpu, self.cpuacct):
            if mount is None:
                continue
            try:
                (mount / self.parent).mkdir(exist_ok=True)
            except OSError as exc:
                raise CgroupError(f"cannot create cgroup {mount / self.parent}: {exc}") from exc
            sweep(mount / self.parent)
        if memory_mb is not None and self.memory is not None:
            set_memory_limit(self.memory / self.parent, memory_mb * 1024 * 1024)

    def for_new_jail(
        self, name: str, *, memory_bytes: int, pids: int, cpu_ms_per_sec: int
    ) -> V1JailCgroup | None:
        """v1: create the groups of jail ``name`` with its first limits, before nsjail
        starts in them (None on v2 and without cgroups)."""
        if self.mode is not CgroupMode.V1:
            return None
        assert self.memory is not None and self.pids is not None

        def group(mount: Path | None) -> Path | None:
            return mount / self.parent / name if mount is not None else None

        memory, pids_group = group(self.memory), group(self.pids)
        assert memory is not None and pids_group is not None
        cgroup = V1JailCgroup(
            memory=memory,
            pids=pids_group,
            cpu=group(self.cpu) if cpu_ms_per_sec else None,
            cpuacct=group(self.cpuacct),
        )
        cgroup.create(memory_bytes=memory_bytes, pids=pids, cpu_ms_per_sec=cpu_ms_per_sec)
        return cgroup

    def for_running_jail(self, zygote_pid: int) -> JailCgroup | None:
        """v2: the group nsjail made for the jail whose zygote is ``zygote_pid``."""
        if self.mode is not CgroupMode.V2:
            return None
        assert self.root is not None
        return V2JailCgroup.of_pid(self.root, zygote_pid)


def set_memory_limit(group: Path, limit: int) -> None:
    """Set a v1 memory group's limit (and its memory+swap limit, which must stay at or
    above it: the one that grows is written first)."""
    memsw = group / "memory.memsw.limit_in_bytes"
    try:
        current = int((group / "memory.limit_in_bytes").read_text())
        order = [group / "memory.limit_in_bytes"]
        if memsw.exists():
            order = [memsw, *order] if limit > current else [*order, memsw]
        for path in order:
            path.write_text(str(limit))
    except (OSError, ValueError) as exc:
        raise CgroupError(f"cannot limit the memory of {group}: {exc}") from exc


#: a jail's group name (``Jail.id``)
_JAIL_GROUP = re.compile(r"[0-9a-f]{12}")
#: groups younger than this may belong to a jail another runtime is starting right now
SWEEP_AFTER_S = 3600.0


def sweep(parent: Path) -> None:
    """Remove the jail groups under ``parent`` that are empty and older than
    ``SWEEP_AFTER_S``: a node that was killed leaves its jails' groups behind (nsjail
    removes nothing it did not make). A group with a process in it cannot be removed."""
    now = time.time()
    try:
        groups = [p for p in parent.iterdir() if p.is_dir() and _JAIL_GROUP.fullmatch(p.name)]
    except OSError:
        return
    for group in groups:
        try:
            if now - group.stat().st_mtime < SWEEP_AFTER_S:
                continue
            if (group / "cgroup.procs").read_text().strip():
                continue
            group.rmdir()
            logger.info("removed the cgroup %s of a jail that is gone", group)
        except OSError:
            continue


def _cgroup_mounts() -> tuple[dict[str, Path], Path | None]:
    """v1 controller -> mount point, and the v2 mount at the root (if any)."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) < 4:
                continue
            mount_point, fstype, options = fields[1], fields[2], fields[3].split(",")
            if fstype == "cgroup":
                for controller in ("memory", "pids", "cpu", "cpuacct"):
                    if controller in options:
                        v1.setdefault(controller, Path(mount_point))
            elif fstype == "cgroup2":
                v2 = Path(mount_point) if v2 is None or mount_point == "/sys/fs/cgroup" else v2
    return v1, v2


def detect(config: NsjailConfig) -> CgroupSetup:
    """The hierarchy to use, per ``config.cgroups`` ('auto' prefers v1 memory+pids)."""
    if config.cgroups == "off":
        return CgroupSetup(CgroupMode.OFF, config.cgroup_parent)
    v1, v2 = _cgroup_mounts()
    want = config.cgroups
    if want in ("auto", "v1") and "memory" in v1 and "pids" in v1:
        return CgroupSetup(
            CgroupMode.V1,
            config.cgroup_parent,
            memory=v1["memory"],
            pids=v1["pids"],
            cpu=v1.get("cpu"),
            cpuacct=v1.get("cpuacct"),
        )
    if want in ("auto", "v2") and v2 is not None:
        controllers = (v2 / "cgroup.controllers").read_text().split()
        if "memory" in controllers and "pids" in controllers:
            return CgroupSetup(CgroupMode.V2, config.cgroup_parent, root=v2)
    return CgroupSetup(CgroupMode.OFF, config.cgroup_parent)
