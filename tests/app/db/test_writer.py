"""Group commit: batching, ordering, isolation of a failing write, draining on close."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.engine import make_engine, make_sessionmaker
from app.db.writer import BatchWriter


@pytest.fixture
async def sessions(tmp_path: Path) -> AsyncIterator[async_sessionmaker[Any]]:
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path}/w.db")
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
    writer = BatchWriter(sessions)
    await writer.start()
    try:
        results = await asyncio.gather(*(writer.write(put(n)) for n in range(100)))
    finally:
        await writer.close()
    assert results == list(range(100))
    assert await rows(sessions) == list(range(100))
    assert writer.writes == 100
    assert writer.batches < 100  # queued together, committed together


async def test_a_failing_write_fails_alone(sessions: async_sessionmaker[Any]) -> None:
    writer = BatchWriter(sessions)
    await writer.start()
    try:
        outcomes = await asyncio.gather(
            writer.write(put(1)),
            writer.write(put(1)),
            writer.write(put(2)),
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

    writer = BatchWriter(sessions)
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

    writer = BatchWriter(sessions)
    await writer.start()
    writer.post(step("running", 1), what="test")
    finished = writer.write(step("finished", 2))
    writer.post(step("late", 3), what="test")
    await finished
    await writer.close()  # drains the posted write
    assert order == ["running", "finished", "late"]
    assert await rows(sessions) == [1, 2, 3]
