"""The per-tenant totals quotas are judged against: today's CPU-seconds (from the usage
rollups and events, plus what its live sandboxes used that no event holds yet) and the
bytes it stores (large outputs kept, from the blobs, and the snapshots it has not
deleted). Both are read from the database, the source of truth across every gateway
and node, and cached briefly on the admission path, so a tenant may overshoot by what it
starts within ``cache_seconds`` (and a sandbox's CPU shows once its node's reading
reached the record: ``app.sandboxes.sync``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select, union_all
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db import usage
from app.db.models import Blob, Snapshot
from common.singleflight import SingleFlight


async def stored_bytes(session: AsyncSession, tenant_id: str) -> int:
    """Bytes the tenant stores against ``max_storage_mb``: its large outputs kept and its
    snapshots not deleted, in one statement."""
    parts = union_all(
        select(Blob.size.label("size")).where(Blob.tenant_id == tenant_id),
        select(Snapshot.size_bytes.label("size")).where(
            Snapshot.tenant_id == tenant_id, Snapshot.deleted_at.is_(None)
        ),
    ).subquery()
    total = await session.scalar(select(func.coalesce(func.sum(parts.c.size), 0)))
    return int(total or 0)


class Readings:
    def __init__(self, sessions: async_sessionmaker[Any], *, cache_seconds: float = 1.0) -> None:
        self._sessions = sessions
        self._cache_s = cache_seconds
        self._cache: dict[tuple[str, str], tuple[float, float]] = {}  # -> (read at, value)
        self._reads: SingleFlight[tuple[str, str], float] = SingleFlight("reading")

    async def cpu_seconds_today(self, tenant_id: str) -> float:
        """CPU-seconds the tenant used on the current UTC day."""

        async def read(session: AsyncSession) -> float:
            today = datetime.now(UTC).date()
            return await usage.cpu_seconds(
                session, tenant_id=tenant_id, day=today, live_sandboxes=True
            )

        return await self._cached("cpu", tenant_id, read)

    async def stored_bytes(self, tenant_id: str) -> float:
        """Bytes the tenant stores: large outputs kept and snapshots (``stored_bytes``)."""

        async def read(session: AsyncSession) -> float:
            return float(await stored_bytes(session, tenant_id))

        return await self._cached("storage", tenant_id, read)

    async def _cached(
        self, what: str, tenant_id: str, read: Callable[[AsyncSession], Awaitable[float]]
    ) -> float:
        key = (what, tenant_id)
        hit = self._cache.get(key)
        if hit is not None and time.monotonic() - hit[0] < self._cache_s:
            return hit[1]
        # Callers that miss together share one read (an entry that expires under load
        # would otherwise be read once per call in flight).
        return await self._reads.do(key, lambda: self._read(key, read))

    async def _read(
        self, key: tuple[str, str], read: Callable[[AsyncSession], Awaitable[float]]
    ) -> float:
        read_at = time.monotonic()
        async with self._sessions() as session:
            value = await read(session)
        self._cache[key] = (read_at, value)
        return value


def seconds_until_utc_midnight() -> float:
    now = datetime.now(UTC)
    return 86_400.0 - (now.hour * 3600 + now.minute * 60 + now.second + now.microsecond / 1e6)
