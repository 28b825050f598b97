"""Lists sorted by a column the page names, continued page after page by a cursor.

A list names the columns it may be sorted by (``columns``: a URL name for each SQL
expression; nothing else is ever put in an ``ORDER BY``); ``?sort=image`` sorts by one
ascending, ``?sort=-image`` descending. Every order ends with the row's id, so it is
total, and a page continues after the (value, id) of the last row shown (keyset
pagination), never by an offset: rows added or removed meanwhile neither repeat nor
shift a page. Nullable columns are sorted as ``coalesce(column, '')`` so the comparison
holds for every row.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from sqlalchemy import DateTime, Select, and_, or_

from app.errors import ValidationFailed

#: a column or an expression of one (mapped attributes and SQL expressions alike)
Sortable = Any


@dataclass(frozen=True)
class Order:
    name: str  #: the column's name in the URL
    descending: bool
    key: Sortable  #: what rows are sorted by (then their id)

    @property
    def param(self) -> str:
        return ("-" if self.descending else "") + self.name


def choose(asked: str | None, columns: Mapping[str, Sortable], default: str) -> Order:
    """The order ``asked`` names (``name`` or ``-name``), if ``columns`` has it; else
    ``default`` (written the same way)."""
    for wanted in (asked or "", default):
        name = wanted.removeprefix("-")
        if name in columns:
            return Order(name, wanted.startswith("-"), columns[name])
    raise ValueError(f"no column {default!r} to sort by")


def apply(
    query: Select[Any], order: Order, row_id: Sortable, cursor: str | None, *, limit: int
) -> Select[Any]:
    """``query`` sorted by ``order`` then ``row_id``, after ``cursor``'s row, a page long;
    the sort key is selected last (``key_of``)."""
    if cursor:
        value, last_id = decode(cursor)
        if not isinstance(value, _kind(order.key)):  # made for another order
            raise ValidationFailed("the page's cursor is not one of this order")
        if order.descending:
            query = query.where(or_(order.key < value, and_(order.key == value, row_id < last_id)))
        else:
            query = query.where(or_(order.key > value, and_(order.key == value, row_id > last_id)))
    if order.descending:
        query = query.order_by(order.key.desc(), row_id.desc())
    else:
        query = query.order_by(order.key.asc(), row_id.asc())
    return query.add_columns(order.key.label("sort_key")).limit(limit)


def _kind(key: Sortable) -> type:
    """What a key's values are: times, or text (every sortable column is one or the
    other)."""
    column_type = key.type
    impl = getattr(column_type, "impl", column_type)  # a TypeDecorator's own type
    return datetime if isinstance(impl, DateTime) else str


def encode(value: Any, row_id: str) -> str:
    """The cursor after a row: its sort value and id, opaque to the page."""
    shown = {"t": value.isoformat()} if isinstance(value, datetime) else value
    raw = json.dumps([shown, row_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(cursor: str) -> tuple[Any, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        value, row_id = json.loads(raw)
        if isinstance(value, dict):
            value = datetime.fromisoformat(value["t"])
        if not isinstance(row_id, str) or not isinstance(value, str | int | float | datetime):
            raise ValueError("not a cursor")
    except (ValueError, TypeError, KeyError) as exc:
        raise ValidationFailed("the page's cursor is not one this console made") from exc
    return value, row_id


def header(base: str, filters: Mapping[str, str], order: Order, name: str) -> dict[str, str]:
    """A column header's link (sorted by ``name``: ascending first, then the other way)
    and its mark (the arrow of the order shown)."""
    descending = name == order.name and not order.descending
    kept = {k: v for k, v in filters.items() if v}
    href = f"{base}?{urlencode({**kept, 'sort': ('-' if descending else '') + name})}"
    mark = ("▼" if order.descending else "▲") if name == order.name else ""
    return {"href": href, "mark": mark}
