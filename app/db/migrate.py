"""Run Alembic migrations from inside the application (startup, ``corral db upgrade``)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
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
    """Migrate to ``revision``. A database already at this release's head (the usual
    start-up of every gateway but the first) costs one query: no lock is taken and
    Alembic's revision scripts are not run (``at_head``)."""

    def _upgrade(conn: Connection) -> None:
        cfg = alembic_config()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)

    if revision == "head" and await at_head(engine):
        log.info("database schema already at head")
        return
    async with _sqlite_file_lock(engine), engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK_KEY})
        await conn.run_sync(_upgrade)
    log.info("database schema at %s", revision)


async def at_head(engine: AsyncEngine) -> bool:
    """Whether the database's revisions are exactly this release's heads, read in one
    query of ``alembic_version``. Migrations only move a schema forward and the version
    row is written in the same transaction as the schema change, so a database that
    reads as at head needs nothing, whoever else is starting; anything else (no table
    yet, an older or a newer revision) takes the locked path of ``upgrade``."""
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(text("SELECT version_num FROM alembic_version"))
            current = frozenset(str(row[0]) for row in rows)
    except DBAPIError:  # no alembic_version table: never migrated
        return False
    return current == _script_revisions()[0]


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


@dataclass(frozen=True, slots=True)
class SchemaState:
    """Where a database's schema stands against this release's migrations."""

    current: frozenset[str]  #: the database's revisions (empty: never migrated)
    expected: frozenset[str]  #: this release's heads
    known: frozenset[str]  #: every revision this release has

    @property
    def at_head(self) -> bool:
        return self.current == self.expected

    @property
    def ahead(self) -> bool:
        """Migrated by a newer release (a revision this one does not know)."""
        return bool(self.current) and not self.current <= self.known

    @property
    def usable(self) -> bool:
        """At this release's head, or ahead of it (migrations keep old releases working)."""
        return self.at_head or self.ahead


@functools.cache
def _script_revisions() -> tuple[frozenset[str], frozenset[str]]:
    script = ScriptDirectory.from_config(alembic_config())
    return frozenset(script.get_heads()), frozenset(r.revision for r in script.walk_revisions())


async def schema_state(engine: AsyncEngine) -> SchemaState:
    def read(conn: Connection) -> set[str]:
        return set(MigrationContext.configure(conn).get_current_heads())

    async with engine.connect() as conn:
        current = await conn.run_sync(read)
    expected, known = _script_revisions()
    return SchemaState(frozenset(current), expected, known)


async def downgrade(engine: AsyncEngine, revision: str) -> None:
    def _downgrade(conn: Connection) -> None:
        cfg = alembic_config()
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)

    async with engine.begin() as conn:
        await conn.run_sync(_downgrade)
