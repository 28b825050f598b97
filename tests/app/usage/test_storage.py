"""``app.usage.storage``: what each tenant keeps stored (large outputs, function
artifacts, live snapshots) sampled into usage events, each for the interval since the
tenant's last one, and priced per GB-month in the report."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import async_sessionmaker

from app.db import tenants
from app.db.models import Blob, FunctionArtifact, Snapshot, UsageEvent
from app.db.writer import BatchWriter
from app.quotas.spec import QuotaLimits
from app.usage import report, storage
from app.usage.prices import GB, MONTH_S, Prices
from tests.app.db.test_invocations import create, database_url, sessions, tenant_id, writer

__all__ = ["database_url", "sessions", "tenant_id", "writer"]

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def snapshot(tenant_id: str, id: str, size: int, deleted_at: datetime | None = None) -> Snapshot:
    return Snapshot(
        id=id,
        tenant_id=tenant_id,
        sandbox_id="sbx_1",
        node_id="n1",
        backend="crun",
        image="python",
        image_digest="sha256:" + "0" * 64,
        size_bytes=size,
        deleted_at=deleted_at,
    )


async def stored_events(sessions: async_sessionmaker[Any]) -> list[UsageEvent]:
    async with sessions() as session:
        query = select(UsageEvent).where(UsageEvent.subject == "storage").order_by(UsageEvent.id)
        return list((await session.scalars(query)).all())


async def test_each_tenants_storage_is_metered_for_the_time_since_its_last_event(
    sessions: async_sessionmaker[Any], writer: BatchWriter, tenant_id: str
) -> None:
    await writer.write(create(tenant_id))
    async with sessions.begin() as session:
        idle, _key, _plain = await tenants.create_tenant(session, name="idle", quota=QuotaLimits())
        session.add_all(
            [
                Blob(
                    id="blob_1",
                    tenant_id=tenant_id,
                    invocation_id="inv_1",
                    name="run.stdout",
                    size=300_000_000,
                    content=b"x" * 1000,  # the size is what the row says it kept
                    created_at=NOW,
                ),
                FunctionArtifact(
                    tenant_id=tenant_id, content_hash="a" * 64, size_bytes=5000, content=b"y"
                ),
                snapshot(tenant_id, "snap_1", 700_000_000),
                snapshot(tenant_id, "snap_2", 9_000_000_000, deleted_at=NOW),  # not stored
            ]
        )
    async with sessions() as session:
        assert await storage.stored_bytes(session) == {tenant_id: 1_000_005_000}

    assert await storage.meter(sessions, now=NOW, every_s=300) == 1
    [first] = await stored_events(sessions)
    assert (first.tenant_id, first.kind) == (tenant_id, "storage")  # the idle tenant: none
    assert first.stored_gb_seconds == pytest.approx(1_000_005_000 / GB * 300)
    # a pass before the interval is due stores nothing; a later one the time since
    assert await storage.meter(sessions, now=NOW + timedelta(seconds=100), every_s=300) == 0
    assert await storage.meter(sessions, now=NOW + timedelta(seconds=900), every_s=300) == 1
    second = (await stored_events(sessions))[1]
    assert second.stored_gb_seconds == pytest.approx(1_000_005_000 / GB * 900)
    assert idle.id not in {e.tenant_id for e in await stored_events(sessions)}

    prices = Prices()
    async with sessions() as session:
        [line] = await report.report(
            session,
            start=NOW - timedelta(hours=1),
            end=NOW + timedelta(hours=1),
            group_by=["kind"],
            prices=prices,
            tenant_id=tenant_id,
        )
    row = report.as_row(line)
    gb_seconds = 1_000_005_000 / GB * 1200
    assert row["stored_gb_hours"] == pytest.approx(gb_seconds / 3600)
    assert row["cost_storage"] == pytest.approx(gb_seconds / MONTH_S * prices.gb_month_stored)
    assert row["cost"] == pytest.approx(row["cost_storage"])
