"""A few columns of one row by its primary key, compiled once: the hot paths' reads.

``Session.get`` builds a session, an identity map and an instrumented ORM instance of
every column: 160 µs for a sandbox's row here, where the statement itself takes 8 µs on
SQLite's cursor. A request that only needs to know where a sandbox lives and whether it
runs (every E2B command, file and process call) reads those columns with a ``KeyRead``
instead. On the ``sqlite3`` driver it runs its SQL on the connection's cursor and turns
the values into Python's with the columns' own result processors (JSON, datetimes), so
it returns what ``Connection.execute`` would; on every other driver it is
``Connection.execute`` of the same statement (``tests/app/db/test_reads.py`` compares
the two).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Connection, Dialect, Select, bindparam, select

from app.db.prepared import Prepared


@dataclass(frozen=True, slots=True)
class _Compiled:
    sql: str
    processors: tuple[Callable[[Any], Any] | None, ...]


class KeyRead:
    """``SELECT columns FROM their table WHERE key_column = :key``."""

    def __init__(self, key: ColumnElement[Any], columns: Sequence[ColumnElement[Any]]) -> None:
        self.columns = tuple(columns)
        self.statement: Select[Any] = select(*columns).where(key == bindparam("key"))
        self._compiled: dict[str, _Compiled] = {}

    def on(self, conn: Connection, key: str) -> tuple[Any, ...] | None:
        """The row's values, in the order of ``columns``, or None if there is no row."""
        if not Prepared.on_cursor(conn):
            row = conn.execute(self.statement, {"key": key}).first()
            return None if row is None else tuple(row)
        compiled = self._compiled.get(conn.dialect.name) or self._compile(conn.dialect)
        rows = Prepared.query(conn, compiled.sql, (key,))
        if not rows:
            return None
        return tuple(
            value if process is None or value is None else process(value)
            for value, process in zip(rows[0], compiled.processors, strict=True)
        )

    def _compile(self, dialect: Dialect) -> _Compiled:
        compiled: Any = self.statement.compile(dialect=dialect)
        if tuple(compiled.positiontup) != ("key",):
            raise TypeError("a KeyRead has one parameter, the key")
        processors = tuple(
            column.type._cached_result_processor(dialect, None) for column in self.columns
        )
        prepared = _Compiled(sql=compiled.string, processors=processors)
        self._compiled[dialect.name] = prepared
        return prepared
