"""Retention: what the database keeps, and for how long.

The elected reconciler runs ``sweep`` every ``retention_seconds``. It deletes, a bounded
batch per statement so no transaction grows with the backlog, blobs older than the blob
retention (answers then show those parts' previews and name them ``expired``), final
invocations older than the invocation retention (with their blobs), and usage events
older than the usage-event retention that the hourly rollups already count (the rollups
keep their sums; an event not rolled up yet is never deleted), and dead letters
(``app.db.dead_letters``) older than the invocation retention. Open invocations are never
touched here: they are the reconciler's to finish.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db import blobs, dead_letters, invocations, usage

log = logging.getLogger(__name__)

#: Rows deleted per statement (and transaction).
BATCH = 1000
#: Statements per kind of row in one sweep: the rest waits for the next sweep.
MAX_BATCHES = 20


@dataclass(frozen=True, slots=True)
class Retention:
    blobs: timedelta
    invocations: timedelta
    usage_events: timedelta


@dataclass
class Swept:
    blobs: int = 0
    invocations: int = 0
    usage_events: int = 0
    dead_letters: int = 0


Deleter = Callable[..., Awaitable[int]]


async def sweep(sessions: async_sessionmaker[Any], retention: Retention, now: datetime) -> Swept:
    """Delete what has outlived its retention; how much of each."""
    swept = Swept()
    swept.invocations = await _drain(
        sessions, invocations.delete_finished, now - retention.invocations
    )
    swept.blobs = await _drain(sessions, blobs.delete_older, now - retention.blobs)
    swept.usage_events = await _drain(sessions, usage.delete_rolled, now - retention.usage_events)
    swept.dead_letters = await _drain(
        sessions, dead_letters.delete_older, now - retention.invocations
    )
    if swept.blobs or swept.invocations or swept.usage_events:
        log.info(
            "retention: deleted %d blobs, %d invocations, %d usage events",
            swept.blobs,
            swept.invocations,
            swept.usage_events,
        )
    return swept


async def _drain(sessions: async_sessionmaker[Any], delete: Deleter, before: datetime) -> int:
    total = 0
    for _ in range(MAX_BATCHES):
        session: AsyncSession
        async with sessions.begin() as session:
            deleted = await delete(session, before=before, limit=BATCH)
        total += deleted
        if deleted < BATCH:
            break
    return total
