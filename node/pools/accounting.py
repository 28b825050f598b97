"""What warm capacity costs while nobody uses it: idle worker-seconds and MB-seconds.

An ``IdleMeter`` integrates, over time, how many workers of one pool sat warm and
unused and how much memory they held; ``take()`` returns what accrued since the last
call, so that the node can report it (metrics and ``PoolUsage`` events) and the platform,
not a tenant, is charged for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class IdleCapacity:
    """Idle capacity one pool held over a period."""

    instance_seconds: float = 0.0
    memory_mb_seconds: float = 0.0
    starts: int = 0  #: workers started
    cold_starts: int = 0  #: of which a caller waited for
    start_cpu_ms: float = 0.0  #: CPU time those starts used

    def __iadd__(self, other: IdleCapacity) -> IdleCapacity:
        self.instance_seconds += other.instance_seconds
        self.memory_mb_seconds += other.memory_mb_seconds
        self.starts += other.starts
        self.cold_starts += other.cold_starts
        self.start_cpu_ms += other.start_cpu_ms
        return self


class IdleMeter:
    """Call ``change(idle, memory_mb)`` whenever a pool's idle set changes."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._since = clock()
        self._idle = 0
        self._memory_mb = 0.0
        self._acc = IdleCapacity()

    def change(self, idle: int, memory_mb: float) -> None:
        self._accrue()
        self._idle, self._memory_mb = idle, memory_mb

    def started(self, *, cold: bool, cpu_ms: float = 0.0) -> None:
        self._acc.starts += 1
        self._acc.cold_starts += int(cold)
        self._acc.start_cpu_ms += cpu_ms

    def take(self) -> IdleCapacity:
        self._accrue()
        taken, self._acc = self._acc, IdleCapacity()
        return taken

    def _accrue(self) -> None:
        now = self._clock()
        elapsed = max(0.0, now - self._since)
        self._since = now
        self._acc.instance_seconds += self._idle * elapsed
        self._acc.memory_mb_seconds += self._memory_mb * elapsed
