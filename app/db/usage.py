"""Usage rollups: per tenant, UTC day and kind, what ran and what it cost."""

from __future__ import annotations

from datetime import date

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.db.models import Invocation, UsageRollup, utcnow

_COST_FIELDS = ("queue_ms", "setup_ms", "exec_ms", "teardown_ms", "cpu_ms")


async def record(session: AsyncSession, *, row: Invocation) -> None:
    """Add one finished invocation to its tenant's rollup for today (an upsert)."""
    values = {
        "tenant_id": row.tenant_id,
        "day": (row.finished_at or utcnow()).date(),
        "kind": row.kind,
        "invocations": 1,
        "failures": 0 if row.status == "succeeded" else 1,
        **{f: float(getattr(row, f) or 0.0) for f in _COST_FIELDS},
    }
    dialect = session.get_bind().dialect.name
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    stmt = insert(UsageRollup).values(**values)
    increments = {
        name: getattr(UsageRollup, name) + getattr(stmt.excluded, name)
        for name in ("invocations", "failures", *_COST_FIELDS)
    }
    await session.execute(
        stmt.on_conflict_do_update(index_elements=["tenant_id", "day", "kind"], set_=increments)
    )


async def cpu_seconds(session: AsyncSession, *, tenant_id: str, day: date) -> float:
    total = await session.scalar(
        select(func.coalesce(func.sum(UsageRollup.cpu_ms), 0.0)).where(
            UsageRollup.tenant_id == tenant_id, UsageRollup.day == day
        )
    )
    return float(total or 0.0) / 1000.0
