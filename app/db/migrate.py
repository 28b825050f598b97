"""Run Alembic migrations from inside the application (startup, ``corral db upgrade``)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

import migrations

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(migrations.__file__).parent


def alembic_config(url: str | None = None) -> Config:
    cfg = Config(str(MIGRATIONS_DIR / "alembic.ini"))
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


#: Key of the PostgreSQL advisory lock that serialises migrations across processes
#: (a gateway and its nodes often start together against one database).
_MIGRATION_LOCK_KEY = 0x636F7272616C  # "corral"


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    def _upgrade(conn: Connection) -> None:
        cfg = alembic_config()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)

    async with _sqlite_file_lock(engine), engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK_KEY})
        await conn.run_sync(_upgrade)
    log.info("database schema at %s", revision)


@contextlib.asynccontextmanager
async def _sqlite_file_lock(engine: AsyncEngine) -> AsyncIterator[None]:
    """For a SQLite file, an exclusive flock beside it while migrating."""
    database = engine.url.database if engine.dialect.name == "sqlite" else None
    if not database or database == ":memory:":
        yield
        return
    fd = os.open(f"{database}.migrate-lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


async def downgrade(engine: AsyncEngine, revision: str) -> None:
    def _downgrade(conn: Connection) -> None:
        cfg = alembic_config()
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)

    async with engine.begin() as conn:
        await conn.run_sync(_downgrade)
