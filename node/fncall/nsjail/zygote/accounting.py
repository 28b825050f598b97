"""What the jail's processes are and what they cost: listed from /proc, their CPU time
and run-queue wait, PID 1's own and reaped children's CPU time, and the jail cgroup's
counter."""

from __future__ import annotations

import contextlib
import os
import resource

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _jail_pids(exclude: frozenset[int]) -> list[tuple[int, bytes]]:
    """(pid, the rest of /proc/pid/stat after the command name) of every process in the
    jail but PID 1 and ``exclude``."""
    found: list[tuple[int, bytes]] = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or name == "1" or int(name) in exclude:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                found.append((int(name), f.read().rsplit(b")", 1)[1]))
        except (OSError, IndexError):
            continue
    return found


def _other_processes(exclude: frozenset[int]) -> int:
    """Live processes in the jail besides PID 1 and ``exclude`` (zombies not counted)."""
    return sum(1 for _, stat_ in _jail_pids(exclude) if stat_.split()[:1] != [b"Z"])


def _jail_cpu_ms(exclude: frozenset[int], reaped_before: float) -> float:
    """CPU time of the jail's processes (``exclude`` aside) and of everything PID 1 has
    reaped since ``reaped_before`` was read: each live or dead-but-unreaped process's
    own time plus its waited-for children's (from /proc), and PID 1's reaped children's."""
    ticks = 0
    for _, stat_ in _jail_pids(exclude):
        with contextlib.suppress(ValueError, IndexError):
            ticks += sum(int(field) for field in stat_.split()[11:15])
    return ticks * 1000 / CLK_TCK + _reaped_cpu_ms() - reaped_before


def _jail_wait_ms(exclude: frozenset[int]) -> float | None:
    """How long the jail's threads (``exclude`` aside) have waited on a run queue: the
    run delay of /proc/PID/task/TID/schedstat, summed (None: the kernel does not say)."""
    total, seen = 0, False
    for pid, _ in _jail_pids(exclude):
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with (
                    contextlib.suppress(OSError, ValueError, IndexError),
                    open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f,
                ):
                    total += int(f.read().split()[1])
                    seen = True
    return total / 1e6 if seen else None


def _reaped_cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000


def _self_cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (usage.ru_utime + usage.ru_stime) * 1000


def _cgroup_cpu_ns(fd: int | None) -> int | None:
    """The jail cgroup's CPU time (ns), read through the descriptor the host passed."""
    if fd is None:
        return None
    try:
        return int(os.pread(fd, 64, 0))
    except (OSError, ValueError):
        return None
