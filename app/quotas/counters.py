"""Shared quota counters: a token bucket, concurrency leases and a waiting count.

``QuotaCounters`` is the seam; ``MemoryCounters`` serves one process (the embedded
default), ``app.quotas.redis_counters.RedisCounters`` a cluster of gateways.

The token bucket lets its balance go negative down to ``rate * max_wait``: taking a
token returns how long the caller must wait for it to be due (a reservation), or None
when even that would exceed ``max_wait``. A tenant has one bucket per ``Bucket``: its
executions (``executions_per_second``) and its sandbox calls
(``sandbox_calls_per_second``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

#: which of a tenant's token buckets
Bucket = Literal["executions", "sandbox_calls"]


class QuotaCounters(ABC):
    @abstractmethod
    async def reserve_token(
        self,
        tenant_id: str,
        *,
        rate: float,
        burst: int,
        max_wait: float,
        bucket: Bucket = "executions",
    ) -> float | None:
        """Seconds until the reserved token is due, or None (over the limit)."""

    @abstractmethod
    async def try_acquire_slot(
        self, tenant_id: str, *, limit: int, lease_id: str, ttl: float
    ) -> bool: ...

    @abstractmethod
    async def release_slot(self, tenant_id: str, *, lease_id: str) -> None: ...

    @abstractmethod
    async def wait_for_slot(self, tenant_id: str, timeout: float) -> None:
        """Return when a slot may have come free, or after ``timeout``."""

    @abstractmethod
    async def enter_queue(self, tenant_id: str, *, depth: int, entry_id: str, ttl: float) -> bool:
        """Join the tenant's admission queue unless ``depth`` are waiting. The entry
        expires after ``ttl`` so a crashed gateway cannot fill the queue forever."""

    @abstractmethod
    async def leave_queue(self, tenant_id: str, *, entry_id: str) -> None: ...

    @abstractmethod
    async def waiting(self) -> int:
        """Requests waiting in admission queues, across tenants (a gauge)."""

    @abstractmethod
    async def count_throttle(self, tenant_id: str, quota: str, outcome: str) -> None:
        """One request of ``tenant_id`` delayed or refused by ``quota``
        (``app.quotas.throttles``)."""

    @abstractmethod
    async def throttles(self, tenant_id: str) -> dict[str, int]:
        """How often each quota delayed or refused the tenant (``"<quota>:<outcome>"``),
        as every gateway counted it."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        pass


@dataclass
class _Bucket:
    tokens: float
    stamp: float


def _take(bucket: _Bucket, now: float, *, rate: float, burst: int, max_wait: float) -> float | None:
    bucket.tokens = min(float(burst), bucket.tokens + (now - bucket.stamp) * rate)
    bucket.stamp = now
    if bucket.tokens - 1 < -rate * max_wait:
        return None
    bucket.tokens -= 1
    return max(0.0, -bucket.tokens / rate)


@dataclass
class _TenantState:
    leases: dict[str, float] = field(default_factory=dict)  # lease id -> expiry
    waiting: dict[str, float] = field(default_factory=dict)  # queue entry -> expiry
    freed: asyncio.Event = field(default_factory=asyncio.Event)


class MemoryCounters(QuotaCounters):
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[tuple[Bucket, str], _Bucket] = {}
        self._tenants: dict[str, _TenantState] = {}
        self._throttles: dict[str, dict[str, int]] = {}

    def _state(self, tenant_id: str) -> _TenantState:
        return self._tenants.setdefault(tenant_id, _TenantState())

    async def reserve_token(
        self,
        tenant_id: str,
        *,
        rate: float,
        burst: int,
        max_wait: float,
        bucket: Bucket = "executions",
    ) -> float | None:
        now = self._clock()
        tokens = self._buckets.setdefault((bucket, tenant_id), _Bucket(float(burst), now))
        return _take(tokens, now, rate=rate, burst=burst, max_wait=max_wait)

    async def try_acquire_slot(
        self, tenant_id: str, *, limit: int, lease_id: str, ttl: float
    ) -> bool:
        state = self._state(tenant_id)
        now = self._clock()
        for expired in [k for k, exp in state.leases.items() if exp <= now]:
            del state.leases[expired]
        if len(state.leases) >= limit:
            return False
        state.leases[lease_id] = now + ttl
        return True

    async def release_slot(self, tenant_id: str, *, lease_id: str) -> None:
        state = self._state(tenant_id)
        if state.leases.pop(lease_id, None) is not None:
            state.freed.set()

    async def wait_for_slot(self, tenant_id: str, timeout: float) -> None:
        state = self._state(tenant_id)
        state.freed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(state.freed.wait(), timeout)

    async def enter_queue(self, tenant_id: str, *, depth: int, entry_id: str, ttl: float) -> bool:
        state = self._state(tenant_id)
        now = self._clock()
        for expired in [k for k, exp in state.waiting.items() if exp <= now]:
            del state.waiting[expired]
        if len(state.waiting) >= depth:
            return False
        state.waiting[entry_id] = now + ttl
        return True

    async def leave_queue(self, tenant_id: str, *, entry_id: str) -> None:
        self._state(tenant_id).waiting.pop(entry_id, None)

    async def waiting(self) -> int:
        return sum(len(s.waiting) for s in self._tenants.values())

    async def count_throttle(self, tenant_id: str, quota: str, outcome: str) -> None:
        counts = self._throttles.setdefault(tenant_id, {})
        counts[f"{quota}:{outcome}"] = counts.get(f"{quota}:{outcome}", 0) + 1

    async def throttles(self, tenant_id: str) -> dict[str, int]:
        return dict(self._throttles.get(tenant_id, {}))

    def active(self, tenant_id: str) -> int:
        return len(self._state(tenant_id).leases)
