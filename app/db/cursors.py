"""Cursors of lists kept newest first: a row's ``(created_at, id)``, as one opaque string.

A page continues after the row its cursor names, so rows created meanwhile neither
repeat nor shift a page; the id breaks ties between rows created at the same instant.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import ColumnElement, and_, or_

from app.errors import ValidationFailed


class Listed(Protocol):
    @property
    def created_at(self) -> datetime: ...

    @property
    def id(self) -> str: ...


def encode_cursor(row: Listed) -> str:
    return f"{row.created_at.isoformat()}|{row.id}"


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    created, sep, row_id = cursor.partition("|")
    try:
        when = datetime.fromisoformat(created)
    except ValueError:
        when = None
    if not sep or not row_id or when is None or when.tzinfo is None:
        raise ValidationFailed("cursor is not one this API returned")
    return when, row_id


def older_than(created_at: Any, row_id: Any, after: tuple[datetime, str]) -> ColumnElement[bool]:
    """The rows after ``after`` in newest-first order (columns ``created_at``, ``row_id``)."""
    created, last_id = after
    return or_(created_at < created, and_(created_at == created, row_id < last_id))
