"""How a revocation on one gateway reaches the key caches of the others.

A gateway that revokes a key, or disables or changes a tenant, evicts that tenant from
its own cache at once (``app.auth.cache``) and then, in a cluster, **announces** it:
``INCR`` of one Redis counter (``wire.keys.AUTH_EPOCH``), after its database commit.
Every gateway **checks** the counter before trusting a cached entry, at most once per
``every_s`` (one ``GET``, shared by the requests that arrive meanwhile); when it has
moved, the whole cache is dropped and the next request of each key reads the database,
which already holds the change. So a revoked key is refused on every gateway within
``every_s`` (``auth_revocation_check_seconds``), however long entries otherwise live.

Because the counter moves only after the commit, a check that sees it move comes after
the commit: a look-up that read the key before the change and is stored afterwards is
dropped at the next check, or not stored at all (``KeyCache.generation``).

If Redis cannot be read, the cache is dropped (the database decides every request until
it can be read again). Embedded (one gateway process), there is nobody to tell.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

from redis.asyncio import Redis

from app.auth.cache import KeyCache
from common.singleflight import SingleFlight
from wire import keys

log = logging.getLogger(__name__)


class Revocations(ABC):
    @abstractmethod
    async def announce(self) -> None:
        """Tell every gateway that a key or tenant changed (after the commit)."""

    @abstractmethod
    async def check(self, cache: KeyCache) -> None:
        """Drop ``cache`` if another gateway announced a change since the last check."""


class LocalRevocations(Revocations):
    """One gateway process: its own evictions are all there is."""

    async def announce(self) -> None:
        return None

    async def check(self, cache: KeyCache) -> None:
        return None


class RedisRevocations(Revocations):
    def __init__(
        self, redis: Redis, *, every_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._redis = redis
        self._every_s = every_s
        self._clock = clock
        self._seen: object = None
        self._checked_at = float("-inf")
        self._reads: SingleFlight[str, None] = SingleFlight("auth-epoch")

    async def announce(self) -> None:
        try:
            await self._redis.incr(keys.AUTH_EPOCH)
        except Exception as exc:  # other gateways drop the key when its entry expires
            log.warning("auth: could not announce a revocation to other gateways: %r", exc)

    async def check(self, cache: KeyCache) -> None:
        if self._clock() - self._checked_at < self._every_s:
            return
        await self._reads.do("epoch", lambda: self._read(cache))

    async def _read(self, cache: KeyCache) -> None:
        started = self._clock()
        try:
            epoch = await self._redis.get(keys.AUTH_EPOCH)
        except Exception as exc:
            log.warning("auth: revocations cannot be read (%r): keys are read afresh", exc)
            cache.clear()
            self._seen = None
            self._checked_at = started
            return
        if epoch != self._seen:
            cache.clear()
            self._seen = epoch
        self._checked_at = started
