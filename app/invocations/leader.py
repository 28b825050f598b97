"""Electing the one reconciler among the gateways that share a database.

PostgreSQL: a session advisory lock held on a connection of its own; whoever holds it
leads, and if its process dies or its connection breaks the lock is released and
another gateway takes over at its next try. SQLite (one host): an exclusive ``flock``
beside the database file, released by the kernel when the holder dies.

Two leaders at once (a connection that broke while its holder kept running) are
harmless, only wasteful: every reconciler write is a compare-and-set on the row's
claim token.
"""

from __future__ import annotations

import fcntl
import logging
import os
from abc import ABC, abstractmethod

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

log = logging.getLogger(__name__)

#: Key of the PostgreSQL advisory lock of the reconciler ("corral-r").
LOCK_KEY = 0x636F7272616C2D72


class Election(ABC):
    @abstractmethod
    async def lead(self) -> bool:
        """Whether this process leads now (taking the lead if it is free)."""

    @abstractmethod
    async def close(self) -> None:
        """Give the lead up."""


class PostgresElection(Election):
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._conn: AsyncConnection | None = None

    async def lead(self) -> bool:
        if self._conn is not None:
            try:
                await self._conn.execute(text("SELECT 1"))
                await self._conn.commit()
                return True
            except Exception as exc:
                log.warning("reconciler: lost the lead (%r)", exc)
                await self._drop()
        conn = await self._engine.connect()
        try:
            held = bool(await conn.scalar(text("SELECT pg_try_advisory_lock(:k)"), {"k": LOCK_KEY}))
            await conn.commit()
        except BaseException:
            await conn.invalidate()
            await conn.close()
            raise
        if not held:
            await conn.close()
            return False
        log.info("reconciler: this gateway leads")
        self._conn = conn
        return True

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.invalidate()  # never hand a connection holding the lock back
                await conn.close()
            except Exception as exc:
                log.debug("reconciler: closing the lead's connection: %r", exc)

    async def close(self) -> None:
        await self._drop()


class FileElection(Election):
    def __init__(self, path: str) -> None:
        self._path = path
        self._fd: int | None = None

    async def lead(self) -> bool:
        if self._fd is not None:
            return True
        fd = os.open(self._path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        log.info("reconciler: this process leads")
        self._fd = fd
        return True

    async def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the lock
            self._fd = None


def election_for(engine: AsyncEngine) -> Election:
    if engine.dialect.name == "postgresql":
        return PostgresElection(engine)
    database = engine.url.database or ""
    if not database or database == ":memory:":
        raise ValueError("an in-memory SQLite database cannot elect a reconciler")
    return FileElection(f"{database}.leader-lock")
