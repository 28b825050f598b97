"""Which of a tenant's sandboxes a list shows: filters on the record, done in SQL.

States, backend and image are columns. A metadata filter (every one must match) is on
the ``meta`` JSON column: PostgreSQL reads a key with ``->>`` (SQLAlchemy's JSON
indexing), SQLite looks it up with ``json_each``, whose keys are decoded (a
``json_extract`` path compares a key as escaped in the stored text, so keys with quotes
or non-ASCII letters would never match). Newest first, continued by a cursor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import ColumnElement, Select, exists, func, literal_column, select

from app.db.cursors import older_than
from app.db.models import Sandbox
from wire.sandboxes import SandboxState

LIVE = (SandboxState.CREATING, SandboxState.RUNNING, SandboxState.PAUSED)
#: a destroyed sandbox (its teardown on the way, or done) takes no more calls
GONE = (SandboxState.STOPPING.value, SandboxState.STOPPED.value)


def states(state: str | None) -> list[str] | None:
    """The states a ``state`` filter names: ``live`` (creating, running, paused), one
    state, or None (every state)."""
    if state == "live":
        return [s.value for s in LIVE]
    return None if state is None else [state]


@dataclass(frozen=True)
class Filters:
    #: states shown; None: every state
    states: Sequence[str] | None = None
    backend: str | None = None
    image: str | None = None
    #: key -> value, every one must match
    metadata: Mapping[str, str] = field(default_factory=dict)


def meta_is(key: str, value: str, dialect: str) -> ColumnElement[bool]:
    """The sandbox's metadata holds ``key`` with ``value``."""
    if dialect == "sqlite":
        entries = func.json_each(Sandbox.meta).table_valued("key", "value").alias("meta_entry")
        return exists(
            select(literal_column("1"))
            .select_from(entries)
            .where(entries.c.key == key, entries.c.value == value)
        )
    matches: ColumnElement[bool] = Sandbox.meta[key].as_string() == value
    return matches


def query(
    tenant_id: str,
    filters: Filters,
    *,
    dialect: str,
    limit: int,
    after: tuple[datetime, str] | None = None,
) -> Select[Sandbox]:
    """The tenant's sandboxes that pass ``filters``, newest first, after the cursor's row."""
    stmt = select(Sandbox).where(Sandbox.tenant_id == tenant_id)
    if filters.states is not None:
        stmt = stmt.where(Sandbox.state.in_(list(filters.states)))
    if filters.backend is not None:
        stmt = stmt.where(Sandbox.backend == filters.backend)
    if filters.image is not None:
        stmt = stmt.where(Sandbox.image == filters.image)
    for key, value in sorted(filters.metadata.items()):
        stmt = stmt.where(meta_is(key, value, dialect))
    if after is not None:
        stmt = stmt.where(older_than(Sandbox.created_at, Sandbox.id, after))
    return stmt.order_by(Sandbox.created_at.desc(), Sandbox.id.desc()).limit(limit)
