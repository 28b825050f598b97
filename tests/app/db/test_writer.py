"""Group commit: batching, ordering, isolation of a failing write, draining on close; on a
SQLite file, a lone batchable write committed on the event loop unless the write lock is
held, larger batches committed whole in the writer's own thread, and the loop's commits
checkpointed by that thread."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
from sqlalchemy import Connection, event, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.engine import make_engine, make_sessionmaker
from app.db.transactions import (
    Batchable,
    SessionTransactions,
    SQLiteTransactions,
    transactions_for,
)
from app.db.writer import BatchWriter


def url_of(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path}/w.db"


@pytest.fixture
async def sessions(tmp_path: Path) -> AsyncIterator[async_sessionmaker[Any]]:
    engine = make_engine(url_of(tmp_path))
    async with engine.begin() as conn:
        await conn.execute(text("CREATE TABLE t (n INTEGER PRIMARY KEY)"))
    try:
        yield make_sessionmaker(engine)
    finally:
        await engine.dispose()


def put(n: int) -> Any:
    async def op(session: AsyncSession) -> int:
        await session.execute(text("INSERT INTO t (n) VALUES (:n)"), {"n": n})
        return n

    return op


async def rows(sessions: async_sessionmaker[Any]) -> list[int]:
    async with sessions() as session:
        return [r[0] for r in (await session.execute(text("SELECT n FROM t ORDER BY n"))).all()]


async def test_concurrent_writes_share_transactions(sessions: async_sessionmaker[Any]) -> None:
    writer = BatchWriter(SessionTransactions(sessions))
    await writer.start()
    try:
        results = await asyncio.gather(*(writer.write(put(n)) for n in range(100)))
    finally:
        await writer.close()
    assert results == list(range(100))
    assert await rows(sessions) == list(range(100))
    assert writer.writes == 100
    assert writer.batches < 100  # queued together, committed together


@pytest.mark.parametrize("committer", ["sessions", "thread"])
async def test_a_failing_write_fails_alone(
    committer: str, tmp_path: Path, sessions: async_sessionmaker[Any]
) -> None:
    """Plain writes in sessions; batchables in the SQLite writer's thread."""
    if committer == "sessions":
        writer, make = BatchWriter(SessionTransactions(sessions)), put
    else:
        writer, make = BatchWriter(transactions_for(url_of(tmp_path), sessions)), Put
    await writer.start()
    try:
        outcomes = await asyncio.gather(
            writer.write(make(1)),
            writer.write(make(1)),
            writer.write(make(2)),
            return_exceptions=True,
        )
    finally:
        await writer.close()
    assert outcomes[0] == 1 and outcomes[2] == 2
    assert isinstance(outcomes[1], Exception)  # the duplicate key, and only it
    assert await rows(sessions) == [1, 2]


async def test_a_lost_connection_fails_the_batch_without_running_it_again(
    sessions: async_sessionmaker[Any],
) -> None:
    """A lost connection is no one write's fault, and a commit it interrupts may have
    landed: the writes are not run again one by one (a second insert of a row that
    was stored would fail as a duplicate, or apply an update twice)."""
    calls: list[int] = []

    def counted(n: int) -> Any:
        async def op(session: AsyncSession) -> int:
            calls.append(n)
            if n == 0:
                raise OperationalError("COMMIT", None, ConnectionResetError("lost"))
            await session.execute(text("INSERT INTO t (n) VALUES (:n)"), {"n": n})
            return n

        return op

    writer = BatchWriter(SessionTransactions(sessions))
    await writer.start()
    try:
        outcomes = await asyncio.gather(
            *(writer.write(counted(n)) for n in (1, 0, 2)), return_exceptions=True
        )
    finally:
        await writer.close()
    assert all(isinstance(o, OperationalError) for o in outcomes), outcomes
    assert calls == [1, 0]  # one batch (all three were queued at once), never again
    assert await rows(sessions) == []


async def test_posted_writes_are_committed_in_order_and_on_close(
    sessions: async_sessionmaker[Any],
) -> None:
    order: list[str] = []

    def step(name: str, n: int) -> Any:
        async def op(session: AsyncSession) -> None:
            await session.execute(text("INSERT INTO t (n) VALUES (:n)"), {"n": n})
            order.append(name)

        return op

    writer = BatchWriter(SessionTransactions(sessions))
    await writer.start()
    writer.post(step("running", 1), what="test")
    finished = writer.write(step("finished", 2))
    writer.post(step("late", 3), what="test")
    await finished
    await writer.close()  # drains the posted write
    assert order == ["running", "finished", "late"]
    assert await rows(sessions) == [1, 2, 3]


@dataclass(frozen=True)
class Put(Batchable):
    """A batchable insert that notes the thread and the batch it ran in."""

    stage: ClassVar[int] = 0
    seen: ClassVar[list[tuple[str, int]]] = []
    n: int

    @classmethod
    def run_many(cls, conn: Connection, writes: Sequence[Put]) -> list[Any]:
        cls.seen.append((threading.current_thread().name, len(writes)))
        conn.execute(text("INSERT INTO t (n) VALUES (:n)"), [{"n": w.n} for w in writes])
        return [w.n for w in writes]


def writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("corral-sqlite-writer")]


@pytest.fixture
async def file_writer(
    tmp_path: Path, sessions: async_sessionmaker[Any]
) -> AsyncIterator[BatchWriter]:
    """A writer on the SQLite file, as the app makes it; closed by the test or after it."""
    Put.seen.clear()
    transactions = transactions_for(url_of(tmp_path), sessions)
    assert isinstance(transactions, SQLiteTransactions)
    writer = BatchWriter(transactions)
    await writer.start()
    try:
        yield writer
    finally:
        await writer.close()


async def test_batches_on_a_sqlite_file_commit_in_the_writers_thread(
    file_writer: BatchWriter, sessions: async_sessionmaker[Any]
) -> None:
    writer = file_writer
    results = await asyncio.gather(*(writer.write(Put(n)) for n in range(50)))
    mixed = await asyncio.gather(writer.write(Put(100)), writer.write(put(101)))
    await writer.close()
    assert results == list(range(50)) and mixed == [100, 101]
    assert await rows(sessions) == [*range(50), 100, 101]  # committed, seen by others
    threads = {name for name, _ in Put.seen[:-1]}
    assert len(threads) == 1 and threads.pop().startswith("corral-sqlite-writer")
    assert sum(n for _, n in Put.seen[:-1]) == 50 and len(Put.seen) - 1 < 50  # batched
    # a batch that holds a plain write is committed in a session, on the event loop
    assert Put.seen[-1] == (threading.current_thread().name, 1)
    assert writer_threads() == []  # closed with the writer


async def test_a_lone_write_commits_on_the_event_loop(
    file_writer: BatchWriter, sessions: async_sessionmaker[Any]
) -> None:
    for n in range(3):
        assert await file_writer.write(Put(n)) == n
    counters = file_writer.counters()
    assert Put.seen == [(threading.current_thread().name, 1)] * 3
    assert counters["loop_commits"] == 3 and counters["lock_busy"] == 0
    assert await rows(sessions) == [0, 1, 2]


async def test_a_lone_write_that_finds_the_lock_held_waits_in_the_thread(
    file_writer: BatchWriter, tmp_path: Path, sessions: async_sessionmaker[Any]
) -> None:
    """Another connection holds the write lock (a session's transaction, another
    process): the lone write does not wait for it on the event loop, which keeps
    running; it waits in the thread and commits once the lock is released."""
    writer = file_writer
    holder = sqlite3.connect(tmp_path / "w.db", isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        holder.execute("INSERT INTO t (n) VALUES (1000)")
        pending = writer.write(Put(5))
        ticks = 0
        started = time.monotonic()
        while time.monotonic() - started < 0.5:
            await asyncio.sleep(0.01)
            ticks += 1
        assert not pending.done()
        assert ticks > 10  # the loop was not held by the waiting write
        holder.execute("COMMIT")
        assert await asyncio.wait_for(pending, 10) == 5
        counters = writer.counters()
    finally:
        holder.close()
    assert counters["lock_busy"] == 1 and counters["loop_commits"] == 0
    assert [name for name, _ in Put.seen][-1].startswith("corral-sqlite-writer")
    assert await rows(sessions) == [5, 1000]


def wal_bytes(tmp_path: Path) -> int:
    return (tmp_path / "w.db-wal").stat().st_size


@pytest.mark.parametrize("checkpoint_every", [25, 10**9])
async def test_commits_on_the_event_loop_are_checkpointed(
    checkpoint_every: int, tmp_path: Path, sessions: async_sessionmaker[Any]
) -> None:
    """The loop's connection never checkpoints as it commits; the thread does, every
    ``checkpoint_every`` of its commits, so the write-ahead log is reused, not grown."""
    writer = BatchWriter(
        transactions_for(url_of(tmp_path), sessions, checkpoint_every=checkpoint_every)
    )
    await writer.start()
    try:
        for n in range(400):
            await writer.write(Put(n))
    finally:
        await writer.close()
    pages = wal_bytes(tmp_path) // 4096
    if checkpoint_every == 25:
        assert pages < 100  # about 25 commits' worth, reused since
    else:
        assert pages > 400  # every commit appended (at least a page each)
    assert await rows(sessions) == list(range(400))


@pytest.mark.parametrize("how", ["cancelled future", "cancelled caller"])
async def test_a_cancelled_caller_does_not_cancel_its_write(
    how: str, file_writer: BatchWriter, tmp_path: Path, sessions: async_sessionmaker[Any]
) -> None:
    """Queued behind a held write lock, the write's waiter is cancelled (a caller's
    timeout, a recorder stopping); the write is still committed once the lock is free."""
    holder = sqlite3.connect(tmp_path / "w.db", isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        if how == "cancelled future":
            future = file_writer.write(Put(1))
            await asyncio.sleep(0.05)
            future.cancel()
        else:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(file_writer.write(Put(1)), 0.05)
        later = file_writer.write(Put(2))
        holder.execute("COMMIT")
        assert await asyncio.wait_for(later, 10) == 2
    finally:
        holder.close()
    assert await rows(sessions) == [1, 2]


def test_an_in_memory_or_server_database_commits_in_sessions() -> None:
    sessions: Any = object()
    assert isinstance(
        transactions_for("sqlite+aiosqlite:///:memory:", sessions), SessionTransactions
    )
    assert isinstance(
        transactions_for("postgresql+asyncpg://u@h/db", sessions), SessionTransactions
    )


@dataclass(frozen=True, slots=True)
class Sever(Batchable):
    """Closes the driver connection under SQLAlchemy, then writes: a lost connection."""

    stage: ClassVar[int] = 0

    @classmethod
    def run_many(cls, conn: Connection, writes: Sequence[Sever]) -> list[Any]:
        driver = conn.connection.driver_connection
        assert driver is not None
        driver.close()
        conn.execute(text("INSERT INTO t (n) VALUES (-1)"))
        return [None for _ in writes]


async def test_the_committers_connections_are_kept_and_a_lost_one_replaced(
    tmp_path: Path, sessions: async_sessionmaker[Any]
) -> None:
    """Each of the two connections is opened once, not checked out per commit; one that
    a failure left unusable is dropped, and the next batch opens a new one."""
    transactions = transactions_for(url_of(tmp_path), sessions)
    assert isinstance(transactions, SQLiteTransactions)
    checkouts: list[str] = []
    for name, engine in (
        ("loop", transactions._loop_engine),
        ("thread", transactions._thread_engine),
    ):
        event.listen(engine, "checkout", lambda *_, name=name: checkouts.append(name))
    try:
        for n in range(5):  # lone writes: on the loop
            assert await transactions.run([Put(n)]) == [n]
        assert await transactions.run([Put(10), Put(11)]) == [10, 11]  # a batch: the thread
        assert await transactions.run([Put(12), Put(13)]) == [12, 13]
        assert checkouts == ["loop", "thread"]
        with pytest.raises(Exception, match="closed database"):
            await transactions.run([Sever()])  # lone: on the loop's connection
        assert await transactions.run([Put(20)]) == [20]  # a new connection
        assert checkouts == ["loop", "thread", "loop"]
    finally:
        await transactions.close()
    assert await rows(sessions) == [0, 1, 2, 3, 4, 10, 11, 12, 13, 20]
