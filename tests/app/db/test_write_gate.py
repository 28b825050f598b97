"""The sessions of one process queue for SQLite's write lock at their own gate
(``app.db.write_gate``), never in SQLite's busy handler, and a transaction that ends in
any way (commit, failure, cancellation, a lost connection) lets the next one in."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.engine import make_engine, make_sessionmaker


@pytest_asyncio.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    """An engine as the gateway makes it, whose connections do not wait for SQLite's lock
    at all (busy timeout 0): a write that met another connection's lock would fail."""
    made = make_engine(f"sqlite+aiosqlite:///{tmp_path}/gate.db")

    def no_waiting(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.execute("PRAGMA busy_timeout=0")

    event.listen(made.sync_engine, "connect", no_waiting)
    async with made.begin() as conn:
        await conn.execute(text("CREATE TABLE t (n INTEGER)"))
    yield made
    await made.dispose()


async def count(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(text("SELECT count(*) FROM t"))).scalar_one())


async def test_concurrent_write_transactions_take_turns_and_all_commit(
    engine: AsyncEngine,
) -> None:
    """Fails without the gate: the second writer meets the first one's lock and SQLite
    answers "database is locked" (with a busy timeout, it would sleep and retry on
    SQLite's schedule, up to 100 ms a time, out of arrival order)."""
    sessions = make_sessionmaker(engine)

    async def write(n: int) -> None:
        async with sessions.begin() as session:
            await session.execute(text("INSERT INTO t VALUES (:n)"), {"n": n})
            await asyncio.sleep(0.02)  # the transaction holds the lock across awaits
            await session.execute(text("INSERT INTO t VALUES (:n)"), {"n": n})

    await asyncio.gather(*(write(n) for n in range(6)))
    assert await count(engine) == 12


async def test_reads_do_not_wait_for_a_writer(engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(engine)
    async with sessions.begin() as writing:
        await writing.execute(text("INSERT INTO t VALUES (1)"))
        assert await asyncio.wait_for(count(engine), 5) == 0  # the committed state


async def test_a_failed_transaction_lets_the_next_writer_in(engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(engine)
    with pytest.raises(ZeroDivisionError):
        async with sessions.begin() as session:
            await session.execute(text("INSERT INTO t VALUES (1)"))
            raise ZeroDivisionError
    async with sessions.begin() as session:
        await asyncio.wait_for(session.execute(text("INSERT INTO t VALUES (2)")), 5)
    assert await count(engine) == 1


async def test_a_cancelled_writer_lets_the_next_one_in(engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(engine)
    holding = asyncio.Event()

    async def hold() -> None:
        async with sessions.begin() as session:
            await session.execute(text("INSERT INTO t VALUES (1)"))
            holding.set()
            await asyncio.sleep(60)

    held = asyncio.create_task(hold())
    await holding.wait()
    waiting = asyncio.create_task(write_one(sessions, 2))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # queued at the gate, not failed by SQLite
    held.cancel()
    await asyncio.wait_for(waiting, 5)
    assert await count(engine) == 1


async def test_a_connection_lost_mid_transaction_lets_the_next_writer_in(
    engine: AsyncEngine,
) -> None:
    sessions = make_sessionmaker(engine)
    async with sessions() as session:
        await session.begin()
        await session.execute(text("INSERT INTO t VALUES (1)"))
        connection = await session.connection()
        await connection.invalidate()
        await session.rollback()
    await asyncio.wait_for(write_one(sessions, 2), 5)
    assert await count(engine) == 1


async def write_one(sessions: Any, n: int) -> None:
    async with sessions.begin() as session:
        await session.execute(text("INSERT INTO t VALUES (:n)"), {"n": n})
