"""Reading a row by primary key through the committers: on a SQLite file, on the event
loop's own connection, never waiting for a writer; through the sessions otherwise."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import async_sessionmaker

from app.db.engine import make_engine, make_sessionmaker
from app.db.models import Base, Sandbox, Tenant
from app.db.transactions import SessionTransactions, SQLiteTransactions, transactions_for
from app.sandboxes.place import PLACE

NOW = datetime(2026, 12, 2, 20, 0, tzinfo=UTC)


def sandbox(n: int, state: str = "running") -> Sandbox:
    return Sandbox(
        id=f"sbx_{n}",
        tenant_id="t1",
        backend="crun",
        image="python",
        state=state,
        node_id="node-1",
        spec={"user": "user"},
        created_at=NOW,
    )


async def database(url: str) -> async_sessionmaker[Any]:
    engine = make_engine(url)
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    sessions = make_sessionmaker(engine)
    async with sessions.begin() as session:
        session.add(Tenant(id="t1", name="one"))
    return sessions


@pytest.fixture
async def stored(tmp_path: Path) -> AsyncIterator[tuple[Path, async_sessionmaker[Any]]]:
    path = tmp_path / "db.sqlite"
    sessions = await database(f"sqlite+aiosqlite:///{path}")
    async with sessions.begin() as session:
        session.add(sandbox(1))
    try:
        yield path, sessions
    finally:
        await sessions.kw["bind"].dispose()


async def test_a_sqlite_file_is_read_on_the_loops_connection_not_the_sessions(
    stored: tuple[Path, async_sessionmaker[Any]], tmp_path: Path
) -> None:
    path, _ = stored
    # sessions on another, empty database: a row found came from the file itself
    elsewhere = await database(f"sqlite+aiosqlite:///{tmp_path}/other.sqlite")
    transactions = transactions_for(f"sqlite+aiosqlite:///{path}", elsewhere)
    assert isinstance(transactions, SQLiteTransactions)
    try:
        row = await transactions.get(Sandbox, "sbx_1")
        assert await transactions.get(Sandbox, "sbx_2") is None
    finally:
        await transactions.close()
        await elsewhere.kw["bind"].dispose()
    assert row is not None
    assert (row.tenant_id, row.state, row.node_id) == ("t1", "running", "node-1")
    assert row.spec == {"user": "user"}
    assert row.created_at.replace(tzinfo=UTC) == NOW  # loaded, usable detached


async def test_a_read_neither_waits_for_a_writer_nor_sees_its_uncommitted_rows(
    stored: tuple[Path, async_sessionmaker[Any]],
) -> None:
    path, sessions = stored
    transactions = transactions_for(f"sqlite+aiosqlite:///{path}", sessions)
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        holder.execute("UPDATE sandboxes SET state = 'stopped' WHERE id = 'sbx_1'")
        row = await asyncio.wait_for(transactions.get(Sandbox, "sbx_1"), 1)
        assert row is not None and row.state == "running"
        holder.execute("COMMIT")
        row = await transactions.get(Sandbox, "sbx_1")
        assert row is not None and row.state == "stopped"  # a new read, the new state
    finally:
        holder.close()
        await transactions.close()
    assert transactions.counters()["read_busy"] == 0


async def test_a_read_sqlite_answers_busy_goes_through_a_session(
    stored: tuple[Path, async_sessionmaker[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, sessions = stored
    transactions = transactions_for(f"sqlite+aiosqlite:///{path}", sessions)
    assert isinstance(transactions, SQLiteTransactions)

    def busy(*_: object) -> None:
        error = sqlite3.OperationalError("database is locked")
        error.sqlite_errorcode = sqlite3.SQLITE_BUSY  # type: ignore[attr-defined]
        raise OperationalError("SELECT", {}, error)

    monkeypatch.setattr(transactions._loop_conn, "get", busy)
    monkeypatch.setattr(transactions._loop_conn, "read", busy)
    try:
        row = await transactions.get(Sandbox, "sbx_1")
        place = await transactions.read(PLACE, "sbx_1")
    finally:
        await transactions.close()
    assert row is not None and row.id == "sbx_1"
    assert place is not None and place[0] == "sbx_1"
    assert transactions.counters()["read_busy"] == 2


async def test_sessions_read_a_row_as_they_commit_one(
    stored: tuple[Path, async_sessionmaker[Any]],
) -> None:
    """The committer of PostgreSQL (and of an in-memory SQLite database)."""
    _, sessions = stored
    transactions = SessionTransactions(sessions)
    async with sessions.begin() as session:
        session.add(sandbox(7, state="paused"))
    row = await transactions.get(Sandbox, "sbx_7")
    assert row is not None and row.state == "paused"
    assert await transactions.get(Sandbox, "sbx_8") is None
