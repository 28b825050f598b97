"""One write transaction at a time among a process's sessions on a SQLite file.

SQLite has one write lock per database. A session whose first write finds it held waits
in SQLite's busy handler, which sleeps between tries on a growing schedule (1, 2, 5, 10
... then 100 ms at a time) and is not fair: a writer that arrives while another sleeps
takes the lock first. Under a burst of sandbox creates, destroys and their teardowns
(each a short transaction of its own on its own pooled connection), a create's one
commit waited 31 ms at the median, 364 ms at p90 and 2.4 s at worst, while the writes
themselves take about a millisecond (docs/benchmarks-history.md, "Sandbox lifecycle at
the machine's speed (issue 30), 2026-12-05").

So the engine's sessions queue for a gate of their own before their first write
statement (on the event loop, in first-come order: ``asyncio.Lock``), and leave it once
their transaction has committed or rolled back (the dialect's ``do_commit`` and
``do_rollback``: SQLAlchemy's ``commit`` event comes before the commit, when the lock is
still held), or their connection goes back to the pool or away. The
gate only orders what SQLite would serialise anyway; correctness stays with SQLite's own
lock (another process, or this process's batched writer in ``app.db.transactions``,
still meets it and waits in the busy handler). PostgreSQL has row locks: no gate.

The gate is taken inside SQLAlchemy's greenlet, where the async engine runs its
synchronous code (``await_`` suspends the greenlet until the lock is free); a
transaction that writes while this task already holds the gate for another would wait
for itself, but it would have waited for SQLite's lock before, the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.util import await_

#: statements that only read (anything else may write, and takes the gate)
_READS = ("SELECT", "PRAGMA", "EXPLAIN")


class WriteGate:
    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._holder: Any = None  #: the DBAPI connection in the gate (one at a time)
        self.waits = 0  #: writes that found the gate held (for tests and metrics)

    def install(self, engine: AsyncEngine) -> None:
        sync = engine.sync_engine
        event.listen(sync, "before_cursor_execute", self._before_execute)
        # left once the commit or rollback is done, not when it is asked for (SQLAlchemy's
        # commit event): the next writer would meet the lock still held
        dialect = sync.dialect
        dialect.do_commit = self._then_leave(dialect.do_commit)  # type: ignore[method-assign,assignment]
        dialect.do_rollback = self._then_leave(dialect.do_rollback)  # type: ignore[method-assign,assignment]
        for name in ("checkin", "invalidate", "soft_invalidate", "close", "detach"):
            event.listen(sync.pool, name, self._gone)

    def _before_execute(self, conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        dbapi = conn.connection.dbapi_connection
        if dbapi is self._holder or statement.lstrip()[:7].upper().startswith(_READS):
            return
        if self._lock.locked():
            self.waits += 1
        await_(self._lock.acquire())
        self._holder = dbapi

    def _then_leave(self, end: Callable[[Any], None]) -> Callable[[Any], None]:
        def ended(connection: Any) -> None:
            try:
                end(connection)
            finally:  # committed, rolled back, or failed at it: SQLite's lock is free
                self._gone(getattr(connection, "dbapi_connection", connection))

        return ended

    def _gone(self, dbapi: Any, *_: Any) -> None:
        """The transaction ended, or its connection went back to the pool or away."""
        if dbapi is not None and dbapi is self._holder:
            self._holder = None
            self._lock.release()
