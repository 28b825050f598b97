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
import os
from pathlib import Path
from typing import Protocol

logger = logging.getLogger(__name__)

#: processes in a jail's pids group besides those RLIMIT_NPROC counts for its code: nsjail
#: itself (v1), and the courier the template forks a spare through where it cannot fork
#: it as PID 1's child directly (``zygote.siblingfork.SiblingFork``)
OUTSIDE_NPROC = 2
#: a group whose peak came this close to its limit reached it (charges come in batches)
PEAK_MARGIN_BYTES = 1 << 20
#: a jail's CPU weight once it is ready for calls (v1 ``cpu.shares``, the kernel's default)
CPU_SHARES = 1024
#: its weight while it starts. Each jail has its own cpu group, and the scheduler shares a
#: core between groups by weight, not by nice level: at equal weight a start beside 30
#: jails spinning user code got a thirtieth of a core, and a tenant's first burst of
#: runaway cases waited 14 s for its pool to grow (tests/compat/test_verl_reward.py). A
#: start runs only the platform's own zygote and ends at its first greeting (bounded by
#: ``start_timeout_s``, at most ``max_concurrent_starts`` at once), and the weight drops
#: before the jail takes a call: no user code ever runs with it.
START_CPU_SHARES = 16 * CPU_SHARES


class CgroupError(RuntimeError):
    pass


class JailCgroup(Protocol):
    def set_limits(self, *, memory_bytes: int, pids: int) -> None: ...

    def end_start(self) -> None: ...

    def oom_kills(self) -> int | None: ...

    def mark_peak(self) -> None: ...

    def reached_limit(self) -> bool | None: ...

    def memory_bytes(self) -> int | None: ...

    def cpu_usage_ns(self) -> int | None: ...

    def open_files(self) -> int: ...

    def close_files(self) -> None: ...

    def remove_groups(self) -> None: ...

    def remove(self) -> None: ...


def write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


class ControlFiles:
    """One group's control files, each opened on first use and kept until ``close``.

    A call reads and writes half a dozen of them (the peak reset, the OOM-kill counter
    and the CPU counter, before and after it). Opened by path every time, with the
    path built each time, that work was 18 % of a busy node's main thread at
    concurrency 32, and 7 % with the descriptors kept (docs/benchmarks-history.md, "The
    jail's cgroup files, opened once"); each use is
    one ``pread``/``pwrite`` at offset 0, which the kernel answers afresh like a new
    open's first read (tests/node/fncall/nsjail/test_jailcgroup.py). A descriptor whose
    use failed is closed, so the next use opens the file again.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fds: dict[tuple[str, int], int] = {}

    def _fd(self, name: str, flags: int) -> int:
        fd = self._fds.get((name, flags))
        if fd is None:
            fd = os.open(self.directory / name, flags | os.O_CLOEXEC)
            self._fds[name, flags] = fd
        return fd

    def _drop(self, name: str, flags: int) -> None:
        fd = self._fds.pop((name, flags), None)
        if fd is not None:
            os.close(fd)

    def read(self, name: str) -> str:
        try:
            return os.pread(self._fd(name, os.O_RDONLY), 4096, 0).decode()
        except OSError:
            self._drop(name, os.O_RDONLY)
            raise

    def write(self, name: str, value: str) -> None:
        try:
            os.pwrite(self._fd(name, os.O_WRONLY), value.encode(), 0)
        except OSError:
            self._drop(name, os.O_WRONLY)
            raise

    def read_int(self, name: str) -> int | None:
        try:
            return int(self.read(name))
        except (OSError, ValueError):
            return None

    def read_counter(self, name: str, key: str) -> int | None:
        """The value of ``key`` in a flat-keyed file (``memory.events``, ``cpu.stat``)."""
        try:
            for line in self.read(name).splitlines():
                field, _, value = line.partition(" ")
                if field == key:
                    return int(value)
        except (OSError, ValueError):
            return None
        return None

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def open_count(self) -> int:
        return len(self._fds)


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
        self._memory_files = ControlFiles(memory)
        self._pids_files = ControlFiles(pids)
        self._cpuacct_files = ControlFiles(cpuacct) if cpuacct is not None else None
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
                write(self.cpu / "cpu.shares", str(START_CPU_SHARES))
            self.set_limits(memory_bytes=memory_bytes, pids=pids)
        except (OSError, CgroupError) as exc:
            self.remove()
            raise CgroupError(f"cannot create the jail cgroup {self.memory.name}: {exc}") from exc

    def set_limits(self, *, memory_bytes: int, pids: int) -> None:
        try:
            if memory_bytes != self._memory_bytes:
                current = self._memory_bytes
                if current is None:  # a new group, or unknown after a failed write
                    current = int(self._memory_files.read("memory.limit_in_bytes"))
                # v1 keeps limit <= memsw limit: raise memsw first, lower it last
                order = ("memory.memsw.limit_in_bytes", "memory.limit_in_bytes")
                for name in order if memory_bytes > current else reversed(order):
                    if name.startswith("memory.memsw") and not self._memsw:
                        continue
                    self._memory_files.write(name, str(memory_bytes))
                self._memory_bytes = memory_bytes
            if pids != self._pids:
                self._pids_files.write("pids.max", str(pids))
                self._pids = pids
        except (OSError, ValueError) as exc:
            self._memory_bytes = self._pids = None
            raise CgroupError(f"cannot set limits on {self.memory}: {exc}") from exc

    def end_start(self) -> None:
        """The jail is ready: from now on it weighs what every other jail weighs."""
        if self.cpu is None:
            return
        try:
            write(self.cpu / "cpu.shares", str(CPU_SHARES))
        except OSError as exc:
            raise CgroupError(f"cannot set the CPU weight of {self.cpu}: {exc}") from exc

    def oom_kills(self) -> int | None:
        return self._memory_files.read_counter("memory.oom_control", "oom_kill")

    def mark_peak(self) -> None:
        """Start watching for the jail reaching its own memory limit (``reached_limit``):
        the kernel's peak-usage marks are reset. (v1's ``memory.failcnt`` is no help: on
        the kernels seen here it stays 0 through an OOM kill at the group's own limit.)"""
        for name in ("memory.max_usage_in_bytes", "memory.memsw.max_usage_in_bytes"):
            if name.startswith("memory.memsw") and not self._memsw:
                continue
            try:
                self._memory_files.write(name, "0")
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
            peak = self._memory_files.read_int(peak_name)
            limit = self._memory_files.read_int(limit_name)
            if peak is None or limit is None:
                continue
            known = True
            if peak >= limit - PEAK_MARGIN_BYTES:
                return True
        return False if known else None

    def memory_bytes(self) -> int | None:
        """Memory the jail uses now (tmpfs pages included)."""
        return self._memory_files.read_int("memory.usage_in_bytes")

    @property
    def cpu_counter(self) -> Path | None:
        """The file counting the CPU time (ns) of every process the jail ever ran."""
        return self.cpuacct / "cpuacct.usage" if self.cpuacct is not None else None

    def cpu_usage_ns(self) -> int | None:
        """CPU time every process of the jail ever used (``cpuacct.usage``)."""
        if self._cpuacct_files is None:
            return None
        return self._cpuacct_files.read_int("cpuacct.usage")

    def open_files(self) -> int:
        """Control files held open (all closed by ``remove``)."""
        files = (self._memory_files, self._pids_files, self._cpuacct_files)
        return sum(f.open_count() for f in files if f is not None)

    def close_files(self) -> None:
        for files in (self._memory_files, self._pids_files, self._cpuacct_files):
            if files is not None:
                files.close()

    def remove_groups(self) -> None:
        """rmdir the groups (slow on v1: call it off the event loop; touches no state the
        loop uses, ``close_files`` first)."""
        for group in self.groups:
            rmdir(group)

    def remove(self) -> None:
        self.close_files()
        self.remove_groups()


class V2JailCgroup:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._files = ControlFiles(path)
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
                self._files.write("memory.max", str(memory_bytes))
                try:
                    self._files.write("memory.swap.max", "0")
                except OSError as exc:
                    if exc.errno != errno.ENOENT:
                        raise
                self._memory_bytes = memory_bytes
            if pids != self._pids:
                self._files.write("pids.max", str(pids))
                self._pids = pids
        except OSError as exc:
            self._memory_bytes = self._pids = None
            raise CgroupError(f"cannot set limits on {self.path}: {exc}") from exc

    def end_start(self) -> None:
        """Nothing to undo: on v2 nsjail makes the group as it starts the jail, so the host
        finds it only once the jail is ready and a start runs at the default weight."""

    def oom_kills(self) -> int | None:
        return self._files.read_counter("memory.events", "oom_kill")

    def mark_peak(self) -> None:
        self._max_events = self._files.read_counter("memory.events", "max")

    def reached_limit(self) -> bool | None:
        """Whether ``memory.max`` was reached since ``mark_peak`` (``memory.events``)."""
        count = self._files.read_counter("memory.events", "max")
        if count is None or self._max_events is None:
            return None
        return count > self._max_events

    def memory_bytes(self) -> int | None:
        """Memory the jail uses now (tmpfs pages included)."""
        return self._files.read_int("memory.current")

    def cpu_usage_ns(self) -> int | None:
        """CPU time every process of the jail ever used (``cpu.stat`` usage_usec)."""
        usec = self._files.read_counter("cpu.stat", "usage_usec")
        return usec * 1000 if usec is not None else None

    def open_files(self) -> int:
        """Control files held open (all closed by ``remove``)."""
        return self._files.open_count()

    def close_files(self) -> None:
        self._files.close()

    def remove_groups(self) -> None:
        rmdir(self.path)

    def remove(self) -> None:
        self.close_files()
        self.remove_groups()
