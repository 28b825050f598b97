"""The async engine and session factory, owned by the app lifespan."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

from app.db.write_gate import WriteGate


def make_engine(url: str) -> AsyncEngine:
    # Connections enough for the requests in flight: an overflow connection is closed when
    # it is returned, and the next one is opened again (for aiosqlite: a new thread, a new
    # open and the pragmas), which under 32 concurrent calls was most of a function
    # call's cost.
    # (PostgreSQL's connections are counted against its max_connections, shared by every
    # gateway: fewer.)
    kwargs: dict[str, Any]
    if url.startswith("sqlite"):
        kwargs = {"pool_size": 32, "max_overflow": 32, "connect_args": {"timeout": 30}}
    else:
        kwargs = {"pool_size": 20, "max_overflow": 20, "pool_pre_ping": True}
    engine = create_async_engine(url, **kwargs)
    if url.startswith("sqlite"):
        event.listen(engine.sync_engine, "connect", sqlite_pragmas)
        if ":memory:" not in url:
            WriteGate().install(engine)  # sessions queue for SQLite's one write lock
    return engine


def sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[Any]:
    return async_sessionmaker(engine, expire_on_commit=False)
