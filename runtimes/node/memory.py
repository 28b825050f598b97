"""The node's memory guard: no new work while the host is short of memory.

A node runs as many executions as there are slots, and a slot is not a reservation of
the execution's memory limit (a limit is a ceiling; most programs use a small part of
it). What keeps the host from running out is this guard: before the node takes its next
Job it waits until the host's available memory (``MemAvailable``) is above the reserve.
Work waits in the queue, where the reconciler and placement can see it, rather than the
kernel's OOM killer choosing what dies.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

POLL_S = 0.05


def available_mb(meminfo: Path = Path("/proc/meminfo")) -> int:
    """The host's available memory (``MemAvailable``), in MiB."""
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError(f"{meminfo} has no MemAvailable line")


class MemoryGuard:
    def __init__(self, reserve_mb: int, read: Callable[[], int] = available_mb) -> None:
        self.reserve_mb = reserve_mb
        self._read = read
        self.held_seconds = 0.0  #: time spent holding work back, for metrics

    def available_mb(self) -> int:
        return self._read()

    def short(self) -> bool:
        return self._read() < self.reserve_mb

    async def room(self) -> None:
        """Return once the host has more than the reserve available."""
        if not self.short():
            return
        started = time.monotonic()
        log.warning(
            "memory guard: %d MiB available, under the %d MiB reserve; holding new work",
            self._read(),
            self.reserve_mb,
        )
        while self.short():  # noqa: ASYNC110 - polled: nothing signals freed host memory
            await asyncio.sleep(POLL_S)
        held = time.monotonic() - started
        self.held_seconds += held
        log.info("memory guard: taking work again after %.1fs", held)
