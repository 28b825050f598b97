"""Concurrent callers that want the same thing share one fetch of it.

``SingleFlight.do(key, fetch)``: the first caller of ``key`` starts ``fetch()`` as a task
of its own; callers that arrive before it ends await the same task. Its own task, so a
caller that gives up (cancelled, timed out) does not fail the others; the task ends with
its result or exception, delivered to every waiter, and the next call starts afresh.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Hashable
from typing import Any


class SingleFlight[K: Hashable, V]:
    def __init__(self, name: str) -> None:
        self._name = name
        self._flights: dict[K, asyncio.Task[V]] = {}

    async def do(self, key: K, fetch: Callable[[], Coroutine[Any, Any, V]]) -> V:
        flight = self._flights.get(key)
        if flight is None:
            flight = asyncio.create_task(fetch(), name=f"corral-{self._name}")
            self._flights[key] = flight
            flight.add_done_callback(lambda done: self._land(key, done))
        return await asyncio.shield(flight)

    def forget(self, key: K) -> None:
        """Callers from now on start a new fetch (the one in flight may be stale)."""
        self._flights.pop(key, None)

    def _land(self, key: K, done: asyncio.Task[V]) -> None:
        if self._flights.get(key) is done:
            del self._flights[key]
        if not done.cancelled():
            done.exception()  # retrieved: a failure no caller awaited is not logged
