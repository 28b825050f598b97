"""Requests waiting for the invocation they started to be stored.

The recorder ``resolve``s a waiter with the columns it stored (the row's projection);
a waiter that times out is forgotten, and so is a resolution nobody waits for, so
nothing accumulates.
"""

from __future__ import annotations

import asyncio
from typing import Any

Outcome = dict[str, Any]


class Waiters:
    def __init__(self) -> None:
        self._futures: dict[str, asyncio.Future[Outcome | None]] = {}

    def expect(self, invocation_id: str) -> None:
        """Register interest before the work is dispatched (so no outcome is missed)."""
        if invocation_id not in self._futures:
            self._futures[invocation_id] = asyncio.get_running_loop().create_future()

    async def wait(self, invocation_id: str, timeout: float) -> Outcome | None:
        """The stored outcome, or None if it did not come in time (read the row then)."""
        self.expect(invocation_id)
        future = self._futures[invocation_id]
        # a timer that answers None, rather than wait_for around a shield: the future is
        # this waiter's own (it leaves the table below), so nothing else needs it intact
        timer = asyncio.get_running_loop().call_later(timeout, _expire, future)
        try:
            return await future
        finally:
            timer.cancel()
            self._futures.pop(invocation_id, None)

    def forget(self, invocation_id: str) -> None:
        future = self._futures.pop(invocation_id, None)
        if future is not None and not future.done():
            future.cancel()

    def resolve(self, invocation_id: str, outcome: Outcome) -> None:
        future = self._futures.get(invocation_id)
        if future is not None and not future.done():
            future.set_result(outcome)

    def __len__(self) -> int:
        return len(self._futures)

    def close(self) -> None:
        for future in self._futures.values():
            future.cancel()
        self._futures.clear()


def _expire(future: asyncio.Future[Outcome | None]) -> None:
    if not future.done():
        future.set_result(None)
