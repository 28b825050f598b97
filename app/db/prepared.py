"""The lifecycle's statements on SQLite's own cursor: compiled once, no execution layer.

A lifecycle write (``app.db.invocations``) runs a few fixed Core statements per batch.
Through ``Connection.execute`` each one pays SQLAlchemy's execution layers (an execution
context, the compiled cache's look-up, parameter processing, a result object) in Python:
on the embedded default that was 13 % of the event loop's thread at concurrency 1, twice
what ``sqlite3`` itself spent executing and committing (docs/benchmarks-history.md, "The
lifecycle's statements on `sqlite3`'s cursor").

``Prepared`` compiles its statement once per set of parameter names for the ``pysqlite``
driver (the plain ``sqlite3`` connections of ``app.db.transactions``) and keeps the SQL
text, the order of its parameters, their types' bind processors, the constant defaults of
the columns the parameters leave out and the statement's own literals; it then runs on
the connection's DB-API cursor, inside the same transaction. The values stored are the
ones ``Connection.execute`` would store, since they go through the same processors
(``tests/app/db/test_prepared.py`` compares the stored rows). On every other driver
(asyncpg, aiosqlite under ``run_sync``) it is ``Connection.execute``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.dml import UpdateBase


@dataclass(frozen=True, slots=True)
class _Compiled:
    sql: str
    #: per positional parameter: its name, its type's bind processor, and its value when
    #: the parameters leave it out (a column's constant default, a literal of the
    #: statement's); a required one they leave out is a KeyError
    names: tuple[str, ...]
    processors: tuple[Callable[[Any], Any] | None, ...]
    defaults: Mapping[str, Any]

    def row(self, params: Mapping[str, Any]) -> tuple[Any, ...]:
        values = []
        for name, process in zip(self.names, self.processors, strict=True):
            value = params[name] if name in params else self.defaults[name]
            values.append(process(value) if process is not None else value)
        return tuple(values)


class Prepared:
    """A Core DML statement, run on SQLite's cursor where the driver is ``sqlite3``."""

    def __init__(self, statement: UpdateBase) -> None:
        self.statement = statement
        self._compiled: dict[tuple[str, ...], _Compiled] = {}

    @staticmethod
    def on_cursor(conn: Connection) -> bool:
        """Whether statements on ``conn`` run on the driver's cursor (``sqlite3``)."""
        return conn.dialect.driver == "pysqlite"

    def execute(self, conn: Connection, params: Sequence[Mapping[str, Any]]) -> int:
        """Run the statement once per parameter set (all with the same names); the rows
        it changed."""
        if not self.on_cursor(conn):
            result = conn.execute(self.statement, params[0] if len(params) == 1 else params)
            return int(result.rowcount)
        keys = tuple(params[0])
        compiled = self._compiled.get(keys) or self._compile(keys, conn.dialect)
        rows = [compiled.row(p) for p in params]
        cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        try:
            if len(rows) == 1:
                cursor.execute(compiled.sql, rows[0])
            else:
                cursor.executemany(compiled.sql, rows)
            return int(cursor.rowcount)
        except sqlite3.Error as exc:
            # what execute() would raise: SQLAlchemy's class for it (OperationalError,
            # IntegrityError, ...), the driver's error as ``orig``, so callers (the
            # writer's busy test, its lost-connection test) see one kind of error
            raise DBAPIError.instance(
                compiled.sql, rows, exc, sqlite3.Error, dialect=conn.dialect
            ) from exc
        finally:
            cursor.close()

    @staticmethod
    def query(conn: Connection, sql: str, params: Sequence[Any]) -> list[Any]:
        """The rows of a SELECT in SQLite's own SQL, run on the driver's cursor (only where
        ``on_cursor``); the driver's errors raised as ``execute`` raises them."""
        cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        try:
            rows: list[Any] = cursor.execute(sql, params).fetchall()
            return rows
        except sqlite3.Error as exc:
            raise DBAPIError.instance(
                sql, params, exc, sqlite3.Error, dialect=conn.dialect
            ) from exc
        finally:
            cursor.close()

    def _compile(self, keys: tuple[str, ...], dialect: Dialect) -> _Compiled:
        compiled: Any = self.statement.compile(dialect=dialect, column_keys=list(keys))
        defaults: dict[str, Any] = {}
        for column in [*compiled.insert_prefetch, *compiled.update_prefetch]:
            default = column.default if column in compiled.insert_prefetch else column.onupdate
            if default is None or not default.is_scalar:
                raise TypeError(f"{column}: only constant defaults can be prepared")
            defaults[column.key] = default.arg
        for name, bind in compiled.binds.items():  # the statement's own literals
            if name not in defaults and not bind.required:
                defaults[name] = bind.effective_value
        processors = compiled._bind_processors  # the processors execute() applies
        names = tuple(compiled.positiontup)
        prepared = _Compiled(
            sql=compiled.string,
            names=names,
            processors=tuple(processors.get(name) for name in names),
            defaults=defaults,
        )
        self._compiled[keys] = prepared
        return prepared
