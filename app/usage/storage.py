"""What tenants keep stored, metered into usage events: their large outputs (``blobs``),
function artifacts (``function_artifacts``, one per distinct content) and sandbox
snapshots not deleted (``snapshots.size_bytes``).

A pass (the elected leader's, with the reconciler's) reads each tenant's stored bytes and
appends one event per tenant that stores anything, for the interval since the tenant's
previous storage event (``every_s`` for its first one), once that interval is at least
``every_s`` long: subject and kind ``storage``, subject id ``<tenant>@<end, epoch ms>``,
``stored_gb_seconds`` the bytes (in GB of 10^9) times the interval. The amount is a
sample: what is stored at the pass counts for the whole interval since the last one, so
a report is as exact as ``every_s`` is short against what it covers. The interval starts
where the last event ended (read from the events), so a new leader goes on where the
last one stopped and a pass right after another finds nothing due.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import Table, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import Blob, FunctionArtifact, Snapshot, UsageEvent
from app.usage.prices import GB

log = logging.getLogger(__name__)

SUBJECT = KIND = "storage"

_EVENTS = cast(Table, UsageEvent.__table__)


async def stored_bytes(session: AsyncSession) -> dict[str, int]:
    """Each tenant's stored bytes (tenants storing nothing are left out)."""
    totals: dict[str, int] = defaultdict(int)
    for query in (
        select(Blob.tenant_id, func.sum(Blob.size)).group_by(Blob.tenant_id),
        select(FunctionArtifact.tenant_id, func.sum(FunctionArtifact.size_bytes)).group_by(
            FunctionArtifact.tenant_id
        ),
        select(Snapshot.tenant_id, func.sum(Snapshot.size_bytes))
        .where(Snapshot.deleted_at.is_(None))
        .group_by(Snapshot.tenant_id),
    ):
        for tenant_id, size in (await session.execute(query)).all():
            totals[tenant_id] += int(size or 0)
    return {tenant: size for tenant, size in totals.items() if size > 0}


async def _last_metered(session: AsyncSession) -> dict[str, datetime]:
    found = await session.execute(
        select(_EVENTS.c.tenant_id, func.max(_EVENTS.c.occurred_at))
        .where(_EVENTS.c.subject == SUBJECT)
        .group_by(_EVENTS.c.tenant_id)
    )
    return {tenant: _aware(moment) for tenant, moment in found.all() if tenant is not None}


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _event(tenant_id: str, size: int, start: datetime, end: datetime) -> dict[str, Any]:
    return {
        "occurred_at": end,
        "tenant_id": tenant_id,
        "subject": SUBJECT,
        "subject_id": f"{tenant_id}@{round(end.timestamp() * 1000)}",
        "kind": KIND,
        "runtime": None,
        "stored_gb_seconds": size / GB * (end - start).total_seconds(),
        "rolled": False,
    }


async def meter(
    sessions: async_sessionmaker[AsyncSession], *, now: datetime, every_s: float
) -> int:
    """Append the storage events due at ``now``; how many."""
    async with sessions.begin() as session:
        sizes = await stored_bytes(session)
        if not sizes:
            return 0
        last = await _last_metered(session)
        events = []
        for tenant_id, size in sorted(sizes.items()):
            start = last.get(tenant_id)
            if start is None:
                start = now - timedelta(seconds=every_s)
            if (now - start).total_seconds() < every_s:
                continue
            events.append(_event(tenant_id, size, start, now))
        if events:
            conn = await session.connection()
            insert_ = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
            await conn.execute(
                insert_(_EVENTS).on_conflict_do_nothing(index_elements=["subject", "subject_id"]),
                events,
            )
            log.debug("storage: metered %d tenants up to %s", len(events), now.isoformat())
    return len(events)
