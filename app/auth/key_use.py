"""When each API key was last used (``api_keys.last_used_at``), for its owner to see which
keys still serve and which can go.

A request's key is noted in memory (a dict write: nothing on the request's path), and
each gateway stores what it noted once a ``period_s``, in one statement for all its keys,
moving a key's time only forward. So the figure is at most a period late, a key used on
any gateway of a cluster counts, and the database sees one write a period per gateway,
not one per request.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from sqlalchemy import bindparam, or_, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db.models import ApiKey

log = logging.getLogger(__name__)

PERIOD_S = 60.0

_TOUCH = (
    update(ApiKey)
    .where(
        ApiKey.id == bindparam("b_id"),
        or_(ApiKey.last_used_at.is_(None), ApiKey.last_used_at < bindparam("b_at")),
    )
    .values(last_used_at=bindparam("b_at"))
)


class KeyUse:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions
        self._seen: dict[str, datetime] = {}

    def note(self, key_id: str) -> None:
        """``key_id`` was used now."""
        self._seen[key_id] = datetime.now(UTC)

    async def flush(self) -> int:
        """Store what was noted since the last flush; how many keys."""
        seen, self._seen = self._seen, {}
        if not seen:
            return 0
        try:
            async with self._sessions.begin() as session:
                conn = await session.connection()
                await conn.execute(_TOUCH, [{"b_id": k, "b_at": at} for k, at in seen.items()])
        except Exception:
            for key_id, at in seen.items():  # kept for the next flush, unless newer is noted
                self._seen.setdefault(key_id, at)
            raise
        return len(seen)

    async def run(self, period_s: float = PERIOD_S) -> None:
        """Flush every ``period_s`` until cancelled (the lifespan's task)."""
        while True:
            await asyncio.sleep(period_s)
            try:
                await self.flush()
            except Exception as exc:
                log.warning("api keys' last use not stored yet: %r", exc)
