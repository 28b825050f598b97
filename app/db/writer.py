"""Group commit: many small writes from concurrent requests, one transaction.

Every invocation writes its row three times (queued, running, finished). Committing each
write on its own makes the database the bottleneck long before the workers are: SQLite
serialises writers (and a busy writer makes the others sleep), and PostgreSQL pays a
round trip and a commit per write. ``BatchWriter`` queues writes and one task runs
whatever has queued up in a single transaction, so under load one commit carries many
writes, and with no load a write is committed at once (no batching delay).

A write is either an ``async (session) -> T`` callable, or a ``Batchable``: a write
of a kind that knows how to run many of its kind in one statement (``executemany``), which
is what the invocation lifecycle uses (``app.db.invocations``). Within a batch, batchables
run grouped by class in ``stage`` order (the lifecycle order of a row: created, running,
finished), then plain callables in queue order; since one invocation's writes are queued
in lifecycle order, they are committed in that order.

``write(op)`` waits for the commit and returns ``op``'s result; ``post(op)`` does not wait
(its failure is logged). If a batch fails, its writes are retried one by one, so one bad
write cannot fail its neighbours; but not if the connection was lost: the commit may have
landed, so each write fails with the lost connection and its caller decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, Self

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.failures import is_connection_failure

log = logging.getLogger(__name__)


class Batchable(ABC):
    """A write that runs together with the other writes of its class in a batch."""

    #: Order of the classes within a batch.
    stage: ClassVar[int]

    @classmethod
    @abstractmethod
    async def run_many(cls, session: AsyncSession, writes: Sequence[Self]) -> list[Any]:
        """Apply ``writes`` (in queue order) and return one result per write."""


Write = Callable[[AsyncSession], Awaitable[Any]] | Batchable

#: Upper bound of writes in one transaction.
MAX_BATCH = 256
_CLOSE_TIMEOUT_S = 30.0


class BatchWriter:
    def __init__(self, sessions: async_sessionmaker[Any], *, max_batch: int = MAX_BATCH) -> None:
        self._sessions = sessions
        self._max_batch = max_batch
        # None is the stop sign: everything queued before it is committed first.
        self._queue: asyncio.Queue[tuple[Write, asyncio.Future[Any]] | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.batches = 0
        self.writes = 0
        self.commit_seconds = 0.0

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="corral-batch-writer")

    async def close(self) -> None:
        """Commit everything queued, then stop."""
        if self._task is None:
            return
        self._queue.put_nowait(None)
        try:
            await asyncio.wait_for(asyncio.shield(self._task), _CLOSE_TIMEOUT_S)
        except TimeoutError:
            log.error("batch writer: pending writes not committed in %ss", _CLOSE_TIMEOUT_S)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._task = None

    def write(self, op: Write) -> asyncio.Future[Any]:
        """Queue ``op`` now; the returned future resolves when it is committed. A caller
        that is cancelled does not cancel the write."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((op, future))
        return asyncio.shield(future)

    def post(self, op: Write, *, what: str) -> None:
        """Queue a write without waiting for it."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        future.add_done_callback(lambda f: _log_failure(f, what))
        self._queue.put_nowait((op, future))

    async def _run(self) -> None:
        stopping = False
        while not stopping:
            first = await self._queue.get()
            batch = [first] if first is not None else []
            stopping = first is None
            while not stopping and len(batch) < self._max_batch:
                try:
                    item = self._queue.get_nowait()
                except asyncio.QueueEmpty:
                    break
                if item is None:
                    stopping = True
                else:
                    batch.append(item)
            if batch:
                await self._commit(batch)

    async def _commit(self, batch: list[tuple[Write, asyncio.Future[Any]]]) -> None:
        started = time.perf_counter()
        try:
            async with self._sessions.begin() as session:
                results = await _apply(session, [op for op, _ in batch])
        except Exception as exc:
            if len(batch) == 1 or is_connection_failure(exc):
                # A lost connection is no bad write's fault, and the commit may have
                # landed: running the writes again could apply them twice. Their callers
                # learn it and decide (``app.invocations.service``).
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                return
            log.warning(
                "a batch of %d writes failed (%r); retrying them one by one", len(batch), exc
            )
            for item in batch:
                await self._commit([item])
            return
        self.batches += 1
        self.writes += len(batch)
        self.commit_seconds += time.perf_counter() - started
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)


async def _apply(session: AsyncSession, ops: list[Write]) -> list[Any]:
    results: list[Any] = [None] * len(ops)
    groups: dict[type[Batchable], list[int]] = {}
    plain: list[int] = []
    for index, op in enumerate(ops):
        if isinstance(op, Batchable):
            groups.setdefault(type(op), []).append(index)
        else:
            plain.append(index)
    for kind in sorted(groups, key=lambda k: k.stage):
        indexes = groups[kind]
        outcome = await kind.run_many(session, [ops[i] for i in indexes])  # type: ignore[misc]
        for i, value in zip(indexes, outcome, strict=True):
            results[i] = value
    for i in plain:
        op = ops[i]
        assert not isinstance(op, Batchable)
        results[i] = await op(session)
    return results


def _log_failure(future: asyncio.Future[Any], what: str) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("%s: write failed: %r", what, future.exception())
