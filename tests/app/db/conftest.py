"""Fixtures of the database tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, event


@pytest.fixture
def executed() -> Iterator[list[str]]:
    """Statements that went through ``Connection.execute`` on SQLite's own driver."""
    seen: list[str] = []

    def listen(conn: Connection, _cursor: Any, statement: str, *_: Any) -> None:
        if conn.dialect.driver == "pysqlite":
            seen.append(statement.split()[0])

    event.listen(Engine, "before_cursor_execute", listen)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", listen)
