"""Today's CPU-seconds per tenant, read from the usage rollups (the source of truth
across every gateway and node) and cached briefly on the admission path."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker

from app.db import usage


class CpuUsage:
    def __init__(self, sessions: async_sessionmaker[Any], *, cache_seconds: float = 1.0) -> None:
        self._sessions = sessions
        self._cache_s = cache_seconds
        self._cache: dict[str, tuple[float, float]] = {}  # tenant -> (read at, seconds)

    async def used_today(self, tenant_id: str) -> float:
        now = time.monotonic()
        hit = self._cache.get(tenant_id)
        if hit is not None and now - hit[0] < self._cache_s:
            return hit[1]
        async with self._sessions() as session:
            used = await usage.cpu_seconds(
                session, tenant_id=tenant_id, day=datetime.now(UTC).date()
            )
        self._cache[tenant_id] = (now, used)
        return used


def seconds_until_utc_midnight() -> float:
    now = datetime.now(UTC)
    return 86_400.0 - (now.hour * 3600 + now.minute * 60 + now.second + now.microsecond / 1e6)
