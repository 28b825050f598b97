"""The node's memory guard: no new work while the host is short of memory.

A node runs as many executions as there are slots, and a slot is not a reservation of
the execution's memory limit (a limit is a ceiling; most programs use a small part of
it). What keeps the host from running out is this guard: before the node takes its next
Job it waits until the host's available memory (``MemAvailable``) is above the reserve.
Work waits in the queue, where the reconciler and placement can see it, rather than the
kernel's OOM killer choosing what dies.

A reading is reused for ``max_age_s`` (10 ms): the kernel computes ``/proc/meminfo``
afresh on every read, and reading it before each Job was the largest share of a busy
node's own CPU in a profile. What a burst of Jobs does to memory shows only after they
start, later than any reading taken before them, so the reuse does not weaken the guard.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

POLL_S = 0.05
#: How long a reading of the available memory is reused.
MAX_AGE_S = 0.01


def available_mb(meminfo: Path = Path("/proc/meminfo")) -> int:
    """The host's available memory (``MemAvailable``), in MiB."""
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError(f"{meminfo} has no MemAvailable line")


class MemoryGuard:
    def __init__(
        self,
        reserve_mb: int,
        read: Callable[[], int] = available_mb,
        *,
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reserve_mb = reserve_mb
        self._read = read
        self._max_age_s = max_age_s
        self._clock = clock
        self._reading = 0
        self._read_at = -1e18
        self.held_seconds = 0.0  #: time spent holding work back, for metrics

    def available_mb(self) -> int:
        now = self._clock()
        if now - self._read_at >= self._max_age_s:
            self._reading, self._read_at = self._read(), now
        return self._reading

    def short(self) -> bool:
        return self.available_mb() < self.reserve_mb

    async def room(self) -> None:
        """Return once the host has more than the reserve available."""
        if not self.short():
            return
        started = time.monotonic()
        log.warning(
            "memory guard: %d MiB available, under the %d MiB reserve; holding new work",
            self.available_mb(),
            self.reserve_mb,
        )
        while self.short():  # noqa: ASYNC110 - polled: nothing signals freed host memory
            await asyncio.sleep(POLL_S)
        held = time.monotonic() - started
        self.held_seconds += held
        log.info("memory guard: taking work again after %.1fs", held)
