"""Usage rollups: per tenant, UTC day and kind, what ran and what it cost."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any, cast

from sqlalchemy import Table, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import UsageRollup

_COST_FIELDS = ("queue_ms", "setup_ms", "exec_ms", "teardown_ms", "cpu_ms")


def _upsert(insert: Any) -> Any:
    """``INSERT .. ON CONFLICT (tenant, day, kind) DO UPDATE`` adding to the counters."""
    stmt = insert(_TABLE)
    return stmt.on_conflict_do_update(
        index_elements=["tenant_id", "day", "kind"],
        set_={name: _TABLE.c[name] + stmt.excluded[name] for name in _COUNTERS},
    )


_TABLE = cast(Table, UsageRollup.__table__)
_COUNTERS = ("invocations", "failures", *_COST_FIELDS)
_UPSERT = {"postgresql": _upsert(pg_insert), "sqlite": _upsert(sqlite_insert)}


@dataclass(frozen=True, slots=True)
class Usage:
    """One finished invocation's contribution to its tenant's rollup."""

    tenant_id: str
    kind: str
    day: date
    failed: bool
    costs: Mapping[str, float | None]


async def record_many(session: AsyncSession, items: Sequence[Usage]) -> None:
    """Add invocations to their rollups: one upsert row per (tenant, day, kind)."""
    rows: dict[tuple[str, date, str], dict[str, Any]] = {}
    for item in items:
        key = (item.tenant_id, item.day, item.kind)
        row = rows.get(key)
        if row is None:
            row = rows[key] = {
                "tenant_id": item.tenant_id,
                "day": item.day,
                "kind": item.kind,
                "invocations": 0,
                "failures": 0,
                **dict.fromkeys(_COST_FIELDS, 0.0),
            }
        row["invocations"] += 1
        row["failures"] += 1 if item.failed else 0
        for name in _COST_FIELDS:
            row[name] += float(item.costs.get(name) or 0.0)
    if rows:
        conn = await session.connection()
        values = list(rows.values())
        await conn.execute(_UPSERT[conn.dialect.name], values[0] if len(values) == 1 else values)


async def record(
    session: AsyncSession,
    *,
    tenant_id: str,
    kind: str,
    day: date,
    failed: bool,
    costs: Mapping[str, float | None],
) -> None:
    """Add one finished invocation to its tenant's rollup for ``day`` (an upsert)."""
    await record_many(session, [Usage(tenant_id, kind, day, failed, costs)])


async def cpu_seconds(session: AsyncSession, *, tenant_id: str, day: date) -> float:
    total = await session.scalar(
        select(func.coalesce(func.sum(UsageRollup.cpu_ms), 0.0)).where(
            UsageRollup.tenant_id == tenant_id, UsageRollup.day == day
        )
    )
    return float(total or 0.0) / 1000.0
