"""The host's handle on one jail's cgroups: its limits, its OOM-kill counter and its CPU
usage.

On cgroup v1 the host creates the jail's groups itself (``<controller>/<parent>/<jail
id>`` for memory, pids, cpu and cpuacct), before nsjail starts, and nsjail is started
inside them (``command.cgroup_wrapper``): the jail is born in its own groups, so its
cgroup namespace is rooted there. On v2 nsjail creates the group and the host finds it
from the zygote's pid. Either way the host moves the memory and pids limits per stage
and reads the OOM-kill counter and the CPU time used around each stage.
"""

from __future__ import annotations

import errno
import logging
from pathlib import Path
from typing import Protocol

logger = logging.getLogger(__name__)

#: processes in a jail's pids group besides those RLIMIT_NPROC counts for its code: nsjail
#: itself (v1), and the courier the template forks a spare through where it cannot fork
#: it as PID 1's child directly (``zygote.SiblingFork``)
OUTSIDE_NPROC = 2
#: a group whose peak came this close to its limit reached it (charges come in batches)
PEAK_MARGIN_BYTES = 1 << 20


class CgroupError(RuntimeError):
    pass


class JailCgroup(Protocol):
    def set_limits(self, *, memory_bytes: int, pids: int) -> None: ...

    def oom_kills(self) -> int | None: ...

    def mark_peak(self) -> None: ...

    def reached_limit(self) -> bool | None: ...

    def memory_bytes(self) -> int | None: ...

    def cpu_usage_ns(self) -> int | None: ...

    def remove(self) -> None: ...


def write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read_counter(path: Path, key: str) -> int | None:
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def rmdir(path: Path | None) -> None:
    if path is None:
        return
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("cannot remove cgroup %s: %s", path, exc)


class V1JailCgroup:
    """One jail's v1 groups. ``cpuacct`` is None when no cpuacct hierarchy is mounted
    (CPU time then comes from the zygote's rusage); it may be the cpu group itself where
    cpu and cpuacct are mounted together."""

    def __init__(self, *, memory: Path, pids: Path, cpu: Path | None, cpuacct: Path | None) -> None:
        self.memory = memory
        self.pids = pids
        self.cpu = cpu
        self.cpuacct = cpuacct
        self._memory_bytes: int | None = None
        self._pids: int | None = None
        self._memsw = False

    @property
    def groups(self) -> list[Path]:
        """Every group of the jail, each once."""
        found: list[Path] = []
        for path in (self.memory, self.pids, self.cpu, self.cpuacct):
            if path is not None and path not in found:
                found.append(path)
        return found

    def procs_files(self) -> list[Path]:
        """The ``cgroup.procs`` files a process joins the jail's groups through."""
        return [group / "cgroup.procs" for group in self.groups]

    def create(self, *, memory_bytes: int, pids: int, cpu_ms_per_sec: int) -> None:
        """Make the groups and set their first limits; removes what it made on failure."""
        try:
            for group in self.groups:
                group.mkdir()
            self._memsw = (self.memory / "memory.memsw.limit_in_bytes").exists()
            if self.cpu is not None and cpu_ms_per_sec:
                period_us = 100_000
                write(self.cpu / "cpu.cfs_period_us", str(period_us))
                write(self.cpu / "cpu.cfs_quota_us", str(cpu_ms_per_sec * period_us // 1000))
            self.set_limits(memory_bytes=memory_bytes, pids=pids)
        except (OSError, CgroupError) as exc:
            self.remove()
            raise CgroupError(f"cannot create the jail cgroup {self.memory.name}: {exc}") from exc

    def set_limits(self, *, memory_bytes: int, pids: int) -> None:
        try:
            if memory_bytes != self._memory_bytes:
                current = self._memory_bytes
                if current is None:  # a new group, or unknown after a failed write
                    current = int((self.memory / "memory.limit_in_bytes").read_text())
                # v1 keeps limit <= memsw limit: raise memsw first, lower it last
                order = ("memory.memsw.limit_in_bytes", "memory.limit_in_bytes")
                for name in order if memory_bytes > current else reversed(order):
                    if name.startswith("memory.memsw") and not self._memsw:
                        continue
                    write(self.memory / name, str(memory_bytes))
                self._memory_bytes = memory_bytes
            if pids != self._pids:
                write(self.pids / "pids.max", str(pids))
                self._pids = pids
        except (OSError, ValueError) as exc:
            self._memory_bytes = self._pids = None
            raise CgroupError(f"cannot set limits on {self.memory}: {exc}") from exc

    def oom_kills(self) -> int | None:
        return _read_counter(self.memory / "memory.oom_control", "oom_kill")

    def mark_peak(self) -> None:
        """Start watching for the jail reaching its own memory limit (``reached_limit``):
        the kernel's peak-usage marks are reset. (v1's ``memory.failcnt`` is no help: on
        the kernels seen here it stays 0 through an OOM kill at the group's own limit.)"""
        for name in ("memory.max_usage_in_bytes", "memory.memsw.max_usage_in_bytes"):
            if name.startswith("memory.memsw") and not self._memsw:
                continue
            try:
                write(self.memory / name, "0")
            except OSError:
                logger.warning("cannot reset %s of %s", name, self.memory)

    def reached_limit(self) -> bool | None:
        """Whether the jail's memory (or memory+swap) peaked at its own limit since
        ``mark_peak``: an OOM kill without that came from a parent's limit (the node's
        jails together). The kernel writes both figures; the jail's code cannot."""
        pairs = [("memory.max_usage_in_bytes", "memory.limit_in_bytes")]
        if self._memsw:
            pairs.append(("memory.memsw.max_usage_in_bytes", "memory.memsw.limit_in_bytes"))
        known = False
        for peak_name, limit_name in pairs:
            peak = _read_int(self.memory / peak_name)
            limit = _read_int(self.memory / limit_name)
            if peak is None or limit is None:
                continue
            known = True
            if peak >= limit - PEAK_MARGIN_BYTES:
                return True
        return False if known else None

    def memory_bytes(self) -> int | None:
        """Memory the jail uses now (tmpfs pages included)."""
        return _read_int(self.memory / "memory.usage_in_bytes")

    @property
    def cpu_counter(self) -> Path | None:
        """The file counting the CPU time (ns) of every process the jail ever ran."""
        return self.cpuacct / "cpuacct.usage" if self.cpuacct is not None else None

    def cpu_usage_ns(self) -> int | None:
        """CPU time every process of the jail ever used (``cpuacct.usage``)."""
        if self.cpu_counter is None:
            return None
        return _read_int(self.cpu_counter)

    def remove(self) -> None:
        for group in self.groups:
            rmdir(group)


class V2JailCgroup:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._memory_bytes: int | None = None
        self._pids: int | None = None
        self._max_events: int | None = None

    @classmethod
    def of_pid(cls, root: Path, pid: int) -> V2JailCgroup:
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                for line in f:
                    if line.startswith("0::"):
                        return cls(root / line[3:].strip().lstrip("/"))
        except OSError as exc:
            raise CgroupError(f"cannot read the cgroup of pid {pid}: {exc}") from exc
        raise CgroupError(f"pid {pid} is in no cgroup v2 group")

    def set_limits(self, *, memory_bytes: int, pids: int) -> None:
        try:
            if memory_bytes != self._memory_bytes:
                write(self.path / "memory.max", str(memory_bytes))
                try:
                    write(self.path / "memory.swap.max", "0")
                except OSError as exc:
                    if exc.errno != errno.ENOENT:
                        raise
                self._memory_bytes = memory_bytes
            if pids != self._pids:
                write(self.path / "pids.max", str(pids))
                self._pids = pids
        except OSError as exc:
            self._memory_bytes = self._pids = None
            raise CgroupError(f"cannot set limits on {self.path}: {exc}") from exc

    def oom_kills(self) -> int | None:
        return _read_counter(self.path / "memory.events", "oom_kill")

    def mark_peak(self) -> None:
        self._max_events = _read_counter(self.path / "memory.events", "max")

    def reached_limit(self) -> bool | None:
        """Whether ``memory.max`` was reached since ``mark_peak`` (``memory.events``)."""
        count = _read_counter(self.path / "memory.events", "max")
        if count is None or self._max_events is None:
            return None
        return count > self._max_events

    def memory_bytes(self) -> int | None:
        """Memory the jail uses now (tmpfs pages included)."""
        return _read_int(self.path / "memory.current")

    def cpu_usage_ns(self) -> int | None:
        """CPU time every process of the jail ever used (``cpu.stat`` usage_usec)."""
        usec = _read_counter(self.path / "cpu.stat", "usage_usec")
        return usec * 1000 if usec is not None else None

    def remove(self) -> None:
        rmdir(self.path)


def process_count(cgroup: JailCgroup | None) -> int | None:
    """Tasks in a jail's pids cgroup (diagnostics only)."""
    if isinstance(cgroup, V1JailCgroup):
        path = cgroup.pids / "pids.current"
    elif isinstance(cgroup, V2JailCgroup):
        path = cgroup.path / "pids.current"
    else:
        return None
    return _read_int(path)
