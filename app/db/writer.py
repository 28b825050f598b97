"""Group commit: many small writes from concurrent requests, one transaction.

Every invocation writes its row three times (queued, running, finished). Committing each
write on its own makes the database the bottleneck long before the workers are: SQLite
serialises writers (and a busy writer makes the others sleep), and PostgreSQL pays a
round trip and a commit per write. ``BatchWriter`` queues writes and one task runs
whatever has queued up in a single transaction, so under load one commit carries many
writes, and with no load a write is committed at once (no batching delay).

What a write is, and how a batch is committed (a session's transaction; on a SQLite file,
on the event loop or in one call to a writer thread), is in ``app.db.transactions``.
Since one invocation's writes are queued in lifecycle order, they are committed in that
order.

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
from typing import Any

from app.db.failures import is_connection_failure
from app.db.transactions import Batchable, Transactions, Write

__all__ = ["MAX_BATCH", "BatchWriter", "Batchable", "Write"]

log = logging.getLogger(__name__)


#: Upper bound of writes in one transaction.
MAX_BATCH = 256
_CLOSE_TIMEOUT_S = 30.0


class BatchWriter:
    def __init__(self, transactions: Transactions, *, max_batch: int = MAX_BATCH) -> None:
        self._transactions = transactions
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
        try:
            if self._task is not None:
                await self._stop()
        finally:
            await self._transactions.close()

    async def _stop(self) -> None:
        assert self._task is not None
        self._queue.put_nowait(None)
        try:
            await asyncio.wait_for(asyncio.shield(self._task), _CLOSE_TIMEOUT_S)
        except TimeoutError:
            log.error("batch writer: pending writes not committed in %ss", _CLOSE_TIMEOUT_S)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._task = None

    def counters(self) -> dict[str, float]:
        """Writes, batches (transactions), seconds spent committing, and the committer's
        own counters."""
        return {
            "writes": float(self.writes),
            "batches": float(self.batches),
            "commit_seconds": self.commit_seconds,
            **self._transactions.counters(),
        }

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
            results = await self._transactions.run([op for op, _ in batch])
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


def _log_failure(future: asyncio.Future[Any], what: str) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("%s: write failed: %r", what, future.exception())
