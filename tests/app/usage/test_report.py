"""``app.usage.report`` on a real database while the roll-up runs: every report counts
each event once, whatever was rolled up by the moment it read."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker

from app.db import usage
from app.db.models import UsageEvent
from app.usage import report
from app.usage.prices import Prices
from tests.app.db.test_invocations import database_url, sessions, tenant_id

__all__ = ["database_url", "sessions", "tenant_id"]

EVENTS = 300


async def test_a_report_taken_while_events_roll_up_counts_each_once(
    sessions: async_sessionmaker[Any], tenant_id: str
) -> None:
    now = datetime.now(UTC)
    async with sessions.begin() as session:
        session.add_all(
            UsageEvent(
                occurred_at=now,
                tenant_id=tenant_id,
                subject="invocation",
                subject_id=f"inv_{i}",
                kind="run",
                runtime="nsjail",
                language="python",
                cpu_ms=10.0,
            )
            for i in range(EVENTS)
        )

    async def roll() -> None:
        while True:
            async with sessions.begin() as session:
                if not await usage.roll_up(session, batch=5):
                    return
            await asyncio.sleep(0)

    async def read() -> list[tuple[int, float]]:
        seen = []
        while not rolling.done():
            async with sessions() as session:
                lines = await report.report(
                    session,
                    start=now - timedelta(hours=1),
                    end=now + timedelta(hours=1),
                    group_by=["tenant"],
                    prices=Prices(),
                    tenant_id=tenant_id,
                )
            seen.append((sum(x.events for x in lines), sum(x.sums["cpu_ms"] for x in lines)))
        return seen

    rolling = asyncio.create_task(roll())
    seen = await read()
    await rolling
    assert len(seen) > 3, "the reads did not overlap the roll-up"
    assert set(seen) == {(EVENTS, EVENTS * 10.0)}
