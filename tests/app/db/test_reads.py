"""A ``KeyRead`` on SQLite's cursor returns what ``Connection.execute`` returns for the
same statement, without going through it; the committers read it on either database."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from app.db.models import Base, Sandbox, Tenant
from app.db.reads import KeyRead
from app.db.transactions import SessionTransactions, SQLiteTransactions, transactions_for
from app.sandboxes.place import PLACE, SandboxPlace

T = Sandbox.__table__
CREATED = datetime(2026, 12, 3, 10, 11, 12, 345678, tzinfo=UTC)


def sandbox(sandbox_id: str, **fields: Any) -> Sandbox:
    values: dict[str, Any] = {
        "id": sandbox_id,
        "tenant_id": "ten_a",
        "backend": "crun",
        "image": "python",
        "state": "running",
        "node_id": "node-1",
        "spec": {"user": "agent", "env": ["TOKEN"], "nested": {"n": [1, 2.5, None]}},
        "meta": {"k": "ü"},
        "created_at": CREATED,
        "expires_at": None,
    }
    values.update(fields)
    return Sandbox(**values)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = create_engine(f"sqlite:///{tmp_path / 'r.db'}")
    Base.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(Tenant.__table__.insert(), {"id": "ten_a", "name": "a"})
    from sqlalchemy.orm import Session

    with Session(engine) as session, session.begin():
        session.add(sandbox("sbx_1"))
        session.add(sandbox("sbx_2", state="stopped", node_id=None, reason="ttl", spec={}))
    yield engine
    engine.dispose()


def test_the_cursor_returns_what_execute_returns(engine: Engine, executed: list[str]) -> None:
    every = KeyRead(T.c.id, list(T.c))
    with engine.connect() as conn:
        for key in ("sbx_1", "sbx_2"):
            expected = tuple(conn.execute(every.statement, {"key": key}).one())
            executed.clear()
            assert every.on(conn, key) == expected
            assert PLACE.on(conn, key) == tuple(conn.execute(PLACE.statement, {"key": key}).one())
            assert executed == ["SELECT"]  # the comparison's own execute, not the read's
        assert every.on(conn, "sbx_none") is None
    place = SandboxPlace.of(PLACE.on(engine.connect(), "sbx_1") or ())
    assert place.spec == {"user": "agent", "env": ["TOKEN"], "nested": {"n": [1, 2.5, None]}}
    assert (place.state, place.node_id, place.tenant_id) == ("running", "node-1", "ten_a")


def test_a_driver_error_is_raised_as_execute_raises_it(engine: Engine) -> None:
    broken = KeyRead(T.c.id, [T.c.id])
    with engine.connect() as conn:
        conn.exec_driver_sql("ALTER TABLE sandboxes RENAME TO gone")
        with pytest.raises(OperationalError) as caught:
            broken.on(conn, "sbx_1")
        assert isinstance(caught.value.orig, sqlite3.OperationalError)


@pytest_asyncio.fixture
async def committers(engine: Engine, tmp_path: Path) -> AsyncIterator[list[Any]]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'r.db'}"
    async_engine = create_async_engine(url)
    sessions = async_sessionmaker(async_engine, expire_on_commit=False)
    on_file = transactions_for(url, sessions)
    assert isinstance(on_file, SQLiteTransactions)
    try:
        yield [on_file, SessionTransactions(sessions)]
    finally:
        await on_file.close()
        await async_engine.dispose()


async def test_both_committers_read_the_same_place(committers: list[Any]) -> None:
    on_file, through_sessions = committers
    for key in ("sbx_1", "sbx_2", "sbx_none"):
        assert await on_file.read(PLACE, key) == await through_sessions.read(PLACE, key)
    assert (await on_file.read(PLACE, "sbx_2"))[2:5] == ("stopped", None, "ttl")


async def test_a_place_reads_the_same_on_postgresql(
    postgres_url: str, committers: list[Any]
) -> None:
    """The cluster's committer (sessions on asyncpg) reads what the embedded one reads."""
    url = postgres_url.replace("postgresql://", "postgresql+asyncpg://", 1)
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
        sessions = async_sessionmaker(engine, expire_on_commit=False)
        async with sessions() as session, session.begin():
            session.add(Tenant(id="ten_a", name="a"))
            await session.flush()
            session.add(sandbox("sbx_1"))
            session.add(sandbox("sbx_2", state="stopped", node_id=None, reason="ttl", spec={}))
        on_postgres = SessionTransactions(sessions)
        on_file = committers[0]
        for key in ("sbx_1", "sbx_2", "sbx_none"):
            assert await on_postgres.read(PLACE, key) == await on_file.read(PLACE, key)
    finally:
        await engine.dispose()
