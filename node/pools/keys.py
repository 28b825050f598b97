"""The bookkeeping of one key of a pool: its workers by state, its waiters, its demand.

``Entry`` is the pool's record of one ready worker; ``KeyState`` holds a key's idle
entries (reused most recent first), busy entries, waiting acquires, starts in flight, its
``Sizing`` and its ``IdleMeter``. Nothing here awaits or starts anything: ``pool`` does.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from dataclasses import dataclass

from node.pools.accounting import IdleMeter
from node.pools.sizing import Bounds, Sizing


@dataclass(eq=False)
class Entry[W]:
    """One ready worker and what the pool knows of it."""

    worker: W
    key: str
    started_at: float
    memory_mb: float = 0.0
    uses: int = 0  #: calls it was handed out for
    idle_since: float = 0.0
    #: one-shot workers: until when the hand-out still counts as supply (refill delay)
    defer_until: float = 0.0


class KeyState[W]:
    def __init__(
        self, name: str, bounds: Bounds, *, window_s: float, clock: Callable[[], float]
    ) -> None:
        self.name = name
        self.bounds = bounds
        #: the key whose idle workers this one may adopt (set by ``Pool.acquire``)
        self.spare: str | None = None
        self.sizing = Sizing(window_s=window_s)
        self.meter = IdleMeter(clock)
        self.idle: list[Entry[W]] = []  #: oldest first; taken from the end
        self.busy: set[Entry[W]] = set()
        #: one-shot hand-outs whose replacement still waits (see ``Entry.defer_until``)
        self.deferred: set[Entry[W]] = set()
        self.waiters: collections.deque[asyncio.Future[Entry[W]]] = collections.deque()
        self.starting = 0
        self.failures = 0  #: failed starts in a row
        self.retry_at = 0.0  #: no background start before (back-off)
        self.last_error: BaseException | None = None
        self._idle_memory = 0.0

    def __repr__(self) -> str:
        return (
            f"<KeyState {self.name} idle={len(self.idle)} busy={len(self.busy)} "
            f"starting={self.starting} waiters={len(self.waiters)}>"
        )

    # --- the idle set (metered) ---------------------------------------------------------
    def push_idle(self, entry: Entry[W], now: float) -> None:
        entry.idle_since = now
        self.idle.append(entry)
        self._idle_memory += entry.memory_mb
        self.meter.change(len(self.idle), self._idle_memory)

    def pop_idle(self) -> Entry[W]:
        entry = self.idle.pop()
        self._forget_idle(entry)
        return entry

    def remove_idle(self, entry: Entry[W]) -> None:
        self.idle.remove(entry)
        self._forget_idle(entry)

    def clear_idle(self) -> list[Entry[W]]:
        entries, self.idle = self.idle, []
        self._idle_memory = 0.0
        self.meter.change(0, 0.0)
        return entries

    def _forget_idle(self, entry: Entry[W]) -> None:
        self._idle_memory = max(0.0, self._idle_memory - entry.memory_mb) if self.idle else 0.0
        self.meter.change(len(self.idle), self._idle_memory)

    # --- demand and supply --------------------------------------------------------------
    def supply(self, now: float, *, one_shot: bool) -> int:
        """Workers that count towards the target. Reusable: idle, starting and busy ones
        (they come back). One-shot: idle ones, starts no waiter is owed, and hand-outs
        whose replacement still waits (``Entry.defer_until``)."""
        if not one_shot:
            return len(self.idle) + self.starting + len(self.busy)
        if self.deferred:
            self.deferred = {entry for entry in self.deferred if entry.defer_until > now}
        return len(self.idle) + max(0, self.starting - len(self.waiters)) + len(self.deferred)

    @property
    def unserved(self) -> int:
        """Waiters no start in flight is meant for."""
        return len(self.waiters) - self.starting

    @property
    def empty(self) -> bool:
        return not (self.idle or self.busy or self.starting or self.waiters)
