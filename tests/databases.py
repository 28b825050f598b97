"""The tests' PostgreSQL databases: made once per test session, reset for each test.

``CREATE DATABASE`` copies a whole template (and ``DROP DATABASE`` removes it): on this
machine about 0.1 s when idle and one to two seconds under load, for each of the ~150 tests
that ask for a database. So each xdist worker keeps the databases it made, and a test is
handed one that nobody else uses, reset before the test to the state it asked for:

* ``empty``: no tables at all (``DROP SCHEMA public CASCADE``), for the tests of the
  migrations themselves and of processes that migrate;
* ``migrated``: at this release's head with every table empty (``TRUNCATE`` of every
  table but ``alembic_version``), for the gateways of ``stack``. A database that is not at
  head any more (a test moved its schema) is emptied and migrated again.

The reset comes first, after ending every other connection to the database: processes
of the previous test (a killed gateway, a node) cannot reach into the next one.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field
from typing import Literal

import asyncpg

from app.db.engine import make_engine
from app.db.migrate import at_head, upgrade
from app.settings import Settings

State = Literal["empty", "migrated"]


def url_of(server: str, name: str) -> str:
    """The URL of database ``name`` on the server of the URL ``server``."""
    return server.rsplit("/", 1)[0] + "/" + name


async def _execute(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        for sql in statements:
            await conn.execute(sql)
    finally:
        await conn.close()


async def migrate(url: str) -> None:
    """Bring the database at ``url`` to head, as a gateway does at start-up."""
    engine = make_engine(Settings(dev_mode=True, database_url=url).resolved_database_url)
    try:
        await upgrade(engine)
    finally:
        await engine.dispose()


async def _is_at_head(url: str) -> bool:
    engine = make_engine(Settings(dev_mode=True, database_url=url).resolved_database_url)
    try:
        return await at_head(engine)
    finally:
        await engine.dispose()


@dataclass
class Databases:
    """One session's databases on the server at ``server`` (an admin URL)."""

    server: str
    prefix: str = field(default_factory=lambda: "corral_t_" + secrets.token_hex(4))
    free: dict[State, list[str]] = field(default_factory=lambda: {"empty": [], "migrated": []})
    made: list[str] = field(default_factory=list)

    def acquire(self, state: State) -> str:
        """The name of a database of this session, in ``state``, for one test."""
        return asyncio.run(self._acquire(state))

    def release(self, state: State, name: str) -> None:
        self.free[state].append(name)

    def close(self) -> None:
        """Drop every database of the session."""

        async def drop() -> None:
            await _execute(
                self.server, *(f'DROP DATABASE IF EXISTS "{n}" WITH (FORCE)' for n in self.made)
            )

        asyncio.run(drop())
        self.made.clear()

    async def _acquire(self, state: State) -> str:
        pool = self.free[state]
        if not pool:
            name = f"{self.prefix}_{len(self.made)}"
            await _execute(self.server, f'CREATE DATABASE "{name}"')
            self.made.append(name)
            if state == "migrated":
                await migrate(url_of(self.server, name))
            return name
        name = pool.pop()
        url = url_of(self.server, name)
        await _execute(
            self.server,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE datname = '{name}' AND pid <> pg_backend_pid()",
        )
        if state == "migrated" and await _is_at_head(url):
            await _truncate_all(url)
        else:
            await _execute(url, "DROP SCHEMA public CASCADE", "CREATE SCHEMA public")
            if state == "migrated":
                await migrate(url)
        return name


async def _truncate_all(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        tables = [
            row["tablename"]
            for row in await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                "AND tablename <> 'alembic_version'"
            )
        ]
        if tables:
            names = ", ".join(f'"{t}"' for t in tables)
            await conn.execute(f"TRUNCATE {names} RESTART IDENTITY CASCADE")
    finally:
        await conn.close()
