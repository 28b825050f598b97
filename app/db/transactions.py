"""Where a batch of writes is committed: one transaction per batch (``app.db.writer``).

A write is either an ``async (session) -> T`` callable, or a ``Batchable``: a write of a
kind that runs many of its kind in one statement (``executemany``), as the invocation
lifecycle does (``app.db.invocations``). A batchable's ``run_many`` is synchronous, on a
synchronous SQLAlchemy ``Connection``, so the same statements run on either committer:

* ``SessionTransactions``: an ``AsyncSession``'s transaction on the event loop's driver
  (asyncpg, aiosqlite); batchables run under ``AsyncConnection.run_sync``, plain writes
  on the session. Every statement, the commit and the connection's reset each cross to
  the driver and back.
* ``SQLiteTransactions`` (file-backed SQLite, the embedded default): a plain ``sqlite3``
  connection, no async driver in between. A batch of one write (nothing queued behind
  it: the writer is keeping up, and latency is what counts) is committed at once on the
  event loop, if the database's write lock is free; it never waits for that lock there
  (its busy timeout is 0). A larger batch, or a lone write that found the lock held (a
  session of the gateway's, another process), is committed whole in a thread that owns
  a second connection, so the event loop hands it over once and is answered once. A
  batch that holds a plain write is committed by its ``SessionTransactions``. Measured:
  a lifecycle write's commit through aiosqlite 1.2 ms, in the thread 0.36 ms; at
  concurrency 1, where every batch is one write, committing on the loop took a call's
  p50 from 3.3-4.1 to 2.8-3.0 ms: two thread wake-ups per commit fewer
  (docs/benchmarks-history.md, "A lone write commits on the event loop when the write
  lock is free").

  Checkpoints: the loop's connection never checkpoints as it commits (a checkpoint
  syncs the file: too long for the event loop). After ``checkpoint_every`` commits on
  the loop, the next batch is committed in the thread, followed there by a passive
  checkpoint before any other commit, so the write-ahead log is copied back whole and
  the next commit starts it again from its beginning: it does not grow without end
  when every commit is made on the loop. (The thread's connection also checkpoints by
  itself, as SQLite does, when the log passes 1,000 pages.)

Both committers also read a row by primary key (``get``): ``SQLiteTransactions`` on its
loop connection, on the event loop (one ``Sandbox`` row through aiosqlite cost 1.3 ms of
CPU, on the loop 0.35 ms: docs/benchmarks-history.md, "Exec in a running sandbox: the
embedded node called in its process, its record read on the loop"); the sessions otherwise.

Within a batch, batchables run grouped by class in ``stage`` order (the lifecycle order of
a row: created, running, finished), then plain writes in queue order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar, Protocol, Self

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session
from sqlalchemy.pool import QueuePool

from app.db.engine import sqlite_pragmas
from app.db.reads import KeyRead

log = logging.getLogger(__name__)


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

    def counters(self) -> dict[str, float]:
        """The committer's own counters, for ``/metrics``."""

    async def get[M](self, model: type[M], key: str) -> M | None:
        """The committed row of ``model`` whose primary key is ``key`` (detached), or None."""

    async def read(self, query: KeyRead, key: str) -> tuple[Any, ...] | None:
        """``query``'s columns of the committed row whose key is ``key``, or None."""


class RowReader(Protocol):
    """Reads a committed row by its primary key (what a committer also does)."""

    async def get[M](self, model: type[M], key: str) -> M | None: ...

    async def read(self, query: KeyRead, key: str) -> tuple[Any, ...] | None: ...


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

    async def get[M](self, model: type[M], key: str) -> M | None:
        async with self._sessions() as session:
            row: M | None = await session.get(model, key)
        return row

    async def read(self, query: KeyRead, key: str) -> tuple[Any, ...] | None:
        async with self._sessions() as session:
            row = (await session.execute(query.statement, {"key": key})).first()
        return None if row is None else tuple(row)

    async def close(self) -> None:
        return None

    def counters(self) -> dict[str, float]:
        return {}


#: Commits on the event loop between two passive checkpoints in the thread (SQLite's own
#: automatic checkpoint comes at 1,000 pages; a lifecycle write is a few pages).
CHECKPOINT_EVERY = 500


class SQLiteTransactions:
    """Batches of batchables on a SQLite file: a lone write on the event loop when the
    write lock is free, anything else in a thread of its own."""

    def __init__(
        self,
        loop_engine: Engine,
        thread_engine: Engine,
        fallback: SessionTransactions,
        *,
        checkpoint_every: int = CHECKPOINT_EVERY,
    ) -> None:
        self._loop_engine = loop_engine
        self._thread_engine = thread_engine
        # one connection each, kept: checking one out of the pool for every commit was
        # 15 % of the writer thread's time at concurrency 32 (docs/benchmarks-history.md,
        # "What changed, from the profiles")
        self._loop_conn = _KeptConnection(loop_engine)
        self._thread_conn = _KeptConnection(thread_engine)
        self._fallback = fallback
        self._checkpoint_every = checkpoint_every
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="corral-sqlite-writer")
        self._closed = False
        #: commits made on the event loop, and lone writes handed to the thread because
        #: the write lock was held
        self.loop_commits = 0
        self.lock_busy = 0
        self.read_busy = 0  #: reads on the loop that SQLite answered busy
        self._since_checkpoint = 0

    async def run(self, ops: Sequence[Write]) -> list[Any]:
        if not all(isinstance(op, Batchable) for op in ops):
            return await self._fallback.run(ops)
        checkpoint = self._since_checkpoint >= self._checkpoint_every
        if len(ops) == 1 and not checkpoint:
            try:
                results = self._loop_conn.commit(ops)
            except OperationalError as exc:
                if not _is_busy(exc):
                    raise
                self.lock_busy += 1  # nothing kept: the transaction was rolled back
            else:
                self.loop_commits += 1
                self._since_checkpoint += 1
                return results
        loop = asyncio.get_running_loop()
        results = await loop.run_in_executor(self._thread, self._commit_in_thread, ops, checkpoint)
        if checkpoint:
            self._since_checkpoint = 0
        return results

    async def get[M](self, model: type[M], key: str) -> M | None:
        return await self._read_on_loop(
            lambda: self._loop_conn.get(model, key), lambda: self._fallback.get(model, key)
        )

    async def read(self, query: KeyRead, key: str) -> tuple[Any, ...] | None:
        return await self._read_on_loop(
            lambda: self._loop_conn.read(query, key), lambda: self._fallback.read(query, key)
        )

    async def _read_on_loop[T](
        self, on_loop: Callable[[], T], through_session: Callable[[], Awaitable[T]]
    ) -> T:
        """Read on the event loop, on the loop's own connection (no commit is ever open on
        it between two steps of the loop): a write-ahead-log reader takes no lock and does
        not wait for a writer. Should SQLite still answer busy (recovering the log), the
        read goes through a session."""
        try:
            return on_loop()
        except OperationalError as exc:
            if not _is_busy(exc):
                raise
            self.read_busy += 1
        return await through_session()

    def _commit_in_thread(self, ops: Sequence[Write], checkpoint: bool) -> list[Any]:
        results = self._thread_conn.commit(ops)
        if checkpoint:
            # after the commit and before the next one, so the next writer finds the log
            # all copied back and starts it again from its beginning
            try:
                self._thread_conn.checkpoint()
            except (OperationalError, sqlite3.Error) as exc:
                log.warning("sqlite writer: checkpoint failed: %r", exc)
        return results

    def counters(self) -> dict[str, float]:
        return {
            "loop_commits": float(self.loop_commits),
            "lock_busy": float(self.lock_busy),
            "read_busy": float(self.read_busy),
        }

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop_conn.close()
        self._loop_engine.dispose()
        # The thread's connection belongs to the thread: it is closed there.
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._thread, self._thread_conn.close)
        await loop.run_in_executor(self._thread, self._thread_engine.dispose)
        self._thread.shutdown(wait=True)


class _KeptConnection:
    """A connection of a one-connection engine, opened on first use and kept between
    commits, used by one thread only. Each batch is its own transaction (rolled back if
    it fails); a connection the failure left invalid or closed is dropped, and the next
    batch opens a new one."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._conn: Connection | None = None

    def commit(self, ops: Sequence[Write]) -> list[Any]:
        conn = self._conn
        if conn is None:
            conn = self._conn = self._engine.connect()
        try:
            with conn.begin():
                return apply_batchables(conn, ops)
        except BaseException:
            if conn.invalidated or conn.closed:
                self.close()
            raise

    def get[M](self, model: type[M], key: str) -> M | None:
        """A row by primary key through a short ORM session on this connection."""
        with self._reading() as conn, Session(bind=conn, expire_on_commit=False) as session:
            return session.get(model, key)

    def read(self, query: KeyRead, key: str) -> tuple[Any, ...] | None:
        """``query``'s columns of a row, on this connection."""
        with self._reading() as conn:
            return query.on(conn, key)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[Connection]:
        """This connection for one read: the statement's implicit read transaction ends
        with it (no ``BEGIN`` for a read), and a connection the read left invalid or
        closed is dropped."""
        conn = self._conn
        if conn is None:
            conn = self._conn = self._engine.connect()
        try:
            yield conn
        except BaseException:
            if conn.invalidated or conn.closed:
                self.close()
            raise
        finally:
            if not conn.closed and conn.in_transaction():
                conn.rollback()

    def checkpoint(self) -> None:
        """A passive checkpoint of the write-ahead log (outside any transaction)."""
        if self._conn is None:
            self._conn = self._engine.connect()
        driver = self._conn.connection.driver_connection
        assert driver is not None
        driver.execute("PRAGMA wal_checkpoint(PASSIVE)").close()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _is_busy(exc: OperationalError) -> bool:
    """Whether the database said its write lock is held (SQLITE_BUSY, any extended code)."""
    code = getattr(exc.orig, "sqlite_errorcode", None)
    return code is not None and code & 0xFF == sqlite3.SQLITE_BUSY


def _sqlite_engine(url: URL, *, busy_timeout_ms: int, autocheckpoint: bool) -> Engine:
    """A one-connection engine on the SQLite file at ``url`` (plain ``sqlite3``)."""

    def pragmas(dbapi_conn: Any, record: Any) -> None:
        sqlite_pragmas(dbapi_conn, record)
        dbapi_conn.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
        if not autocheckpoint:
            dbapi_conn.execute("PRAGMA wal_autocheckpoint=0")

    engine = create_engine(
        url.set(drivername="sqlite"),
        poolclass=QueuePool,
        pool_size=1,
        max_overflow=0,
        connect_args={"timeout": busy_timeout_ms / 1000},
    )
    event.listen(engine, "connect", pragmas)
    return engine


def transactions_for(
    url: str, sessions: async_sessionmaker[Any], *, checkpoint_every: int = CHECKPOINT_EVERY
) -> Transactions:
    """The committer for the database at ``url``: ``SQLiteTransactions`` for a SQLite file,
    sessions otherwise (an in-memory SQLite database is one per connection: sessions)."""
    fallback = SessionTransactions(sessions)
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return fallback
    return SQLiteTransactions(
        _sqlite_engine(parsed, busy_timeout_ms=0, autocheckpoint=False),
        _sqlite_engine(parsed, busy_timeout_ms=30_000, autocheckpoint=True),
        fallback,
        checkpoint_every=checkpoint_every,
    )
