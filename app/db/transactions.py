"""Where a batch of writes is committed: one transaction per batch (``app.db.writer``).

A write is either an ``async (session) -> T`` callable, or a ``Batchable``: a write of a
kind that runs many of its kind in one statement (``executemany``), as the invocation
lifecycle does (``app.db.invocations``). A batchable's ``run_many`` is synchronous, on a
synchronous SQLAlchemy ``Connection``, so the same statements run on either committer:

* ``SessionTransactions``: an ``AsyncSession``'s transaction on the event loop's driver
  (asyncpg, aiosqlite); batchables run under ``AsyncConnection.run_sync``, plain writes
  on the session. Every statement, the commit and the connection's reset each cross to
  the driver and back.
* ``ThreadTransactions`` (file-backed SQLite, the embedded default): a batch of
  batchables runs whole in one thread that owns a plain ``sqlite3`` connection, so the
  event loop hands it over once and is answered once, instead of once per statement
  (measured: 1.2 ms per commit of a lifecycle write through aiosqlite, 0.36 ms here). A
  batch that holds a plain write is committed by its ``SessionTransactions``.

Within a batch, batchables run grouped by class in ``stage`` order (the lifecycle order of
a row: created, running, finished), then plain writes in queue order.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, Protocol, Self

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.pool import QueuePool

from app.db.engine import sqlite_pragmas


class Batchable(ABC):
    """A write that runs together with the other writes of its class in a batch."""

    #: Order of the classes within a batch.
    stage: ClassVar[int]

    @classmethod
    @abstractmethod
    def run_many(cls, conn: Connection, writes: Sequence[Self]) -> list[Any]:
        """Apply ``writes`` (in queue order) on ``conn``, inside the batch's transaction,
        and return one result per write. Synchronous: no awaiting inside."""


Write = Callable[[AsyncSession], Awaitable[Any]] | Batchable


class Transactions(Protocol):
    """Commits one batch of writes in one transaction."""

    async def run(self, ops: Sequence[Write]) -> list[Any]:
        """Apply ``ops`` and commit; one result per op. Raises what the database raised
        (nothing of the batch is kept, unless the connection was lost at the commit)."""

    async def close(self) -> None:
        """Release what the committer holds (the writer has stopped)."""


def apply_batchables(conn: Connection, ops: Sequence[Write]) -> list[Any]:
    """Run the batchables of ``ops`` grouped by class in stage order; their results in
    place, None for the plain writes."""
    results: list[Any] = [None] * len(ops)
    groups: dict[type[Batchable], list[int]] = {}
    for index, op in enumerate(ops):
        if isinstance(op, Batchable):
            groups.setdefault(type(op), []).append(index)
    for kind in sorted(groups, key=lambda k: k.stage):
        indexes = groups[kind]
        outcome = kind.run_many(conn, [ops[i] for i in indexes])  # type: ignore[misc]
        for i, value in zip(indexes, outcome, strict=True):
            results[i] = value
    return results


class SessionTransactions:
    def __init__(self, sessions: async_sessionmaker[Any]) -> None:
        self._sessions = sessions

    async def run(self, ops: Sequence[Write]) -> list[Any]:
        async with self._sessions.begin() as session:
            results: list[Any]
            if any(isinstance(op, Batchable) for op in ops):
                conn = await session.connection()
                results = await conn.run_sync(apply_batchables, ops)
            else:
                results = [None] * len(ops)
            for i, op in enumerate(ops):
                if not isinstance(op, Batchable):
                    results[i] = await op(session)
        return results

    async def close(self) -> None:
        return None


class ThreadTransactions:
    """Batches of batchables on a SQLite file, committed in a thread of their own."""

    def __init__(self, engine: Engine, fallback: SessionTransactions) -> None:
        self._engine = engine
        self._fallback = fallback
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="corral-sqlite-writer")
        self._closed = False

    async def run(self, ops: Sequence[Write]) -> list[Any]:
        if not all(isinstance(op, Batchable) for op in ops):
            return await self._fallback.run(ops)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self._commit, ops)

    def _commit(self, ops: Sequence[Write]) -> list[Any]:
        with self._engine.begin() as conn:
            return apply_batchables(conn, ops)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # The connection belongs to the thread: it is closed there.
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, self._engine.dispose)
        self._thread.shutdown(wait=True)


def transactions_for(url: str, sessions: async_sessionmaker[Any]) -> Transactions:
    """The committer for the database at ``url``: a writer thread for a SQLite file,
    sessions otherwise (an in-memory SQLite database is one per connection: sessions)."""
    fallback = SessionTransactions(sessions)
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return fallback
    engine = create_engine(
        parsed.set(drivername="sqlite"),
        poolclass=QueuePool,
        pool_size=1,
        max_overflow=0,
        connect_args={"timeout": 30},
    )
    event.listen(engine, "connect", sqlite_pragmas)
    return ThreadTransactions(engine, fallback)
