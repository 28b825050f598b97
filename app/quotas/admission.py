"""Admission control: a request runs only inside its tenant's quotas.

In order: the daily CPU budget, sandboxes' CPU included (else 429
``cpu_quota_exhausted``); the storage kept for large outputs and snapshots (else 429
``storage_quota_exhausted``, until the blob retention frees some or snapshots are
deleted); a token from the
executions-per-second bucket, waiting for it if it is due within the admission wait;
a concurrency slot, waiting in a bounded per-tenant queue up to the admission wait
(RL clients score a 429 as a failed reward, so queueing is the default). Only past
that does the caller get a 429 with ``Retry-After`` and ``RateLimit-*``. Every delay and
refusal is made visible (``app.quotas.throttles``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from app.errors import (
    ConcurrencyLimited,
    CpuQuotaExhausted,
    RateLimited,
    StorageQuotaExhausted,
)
from app.quotas.counters import QuotaCounters
from app.quotas.readings import Readings, seconds_until_utc_midnight
from app.quotas.spec import QuotaLimits
from app.quotas.throttles import Outcome, Throttles
from wire.ids import new_id

log = logging.getLogger(__name__)


async def _forgiving(release: Coroutine[Any, Any, None], whose: str) -> None:
    """Give a slot or a queue place back; if the counters cannot be reached, the lease
    expires on its own, and the request (whose work may be done) is not failed for it.

    The release runs in an eager task: one that needs no I/O (the in-process counters)
    is over before the task is returned, with no loop iteration in between; one that
    waits (Redis) goes on in its task even if the caller is cancelled meanwhile."""
    try:
        await asyncio.shield(asyncio.eager_task_factory(asyncio.get_running_loop(), release))
    except Exception as exc:
        log.warning("%s: releasing an admission lease failed (%r); it will expire", whose, exc)


MIB = 1024 * 1024
#: Storage frees as blobs outlive their retention: when to ask again.
STORAGE_RETRY_AFTER_S = 60.0
#: A lease outlives its execution by this much before another request may take it.
LEASE_GRACE_S = 30.0


class Admission:
    def __init__(
        self,
        counters: QuotaCounters,
        readings: Readings,
        *,
        queue_seconds: float,
        queue_depth: int,
        throttles: Throttles | None = None,
    ) -> None:
        self.counters = counters
        self._throttles = throttles
        self._readings = readings
        self._queue_s = queue_seconds
        self._depth = queue_depth

    @asynccontextmanager
    async def admit(
        self, tenant_id: str, quota: QuotaLimits, *, wall_seconds: float
    ) -> AsyncIterator[float]:
        """Hold one concurrency slot for the body; yields the seconds spent waiting."""
        started = time.monotonic()
        if await self._readings.cpu_seconds_today(tenant_id) >= quota.cpu_seconds_per_day:
            await self._note(tenant_id, "cpu_seconds_per_day", quota.cpu_seconds_per_day)
            raise CpuQuotaExhausted(
                retry_after=seconds_until_utc_midnight(),
                limit=quota.cpu_seconds_per_day,
                details={"quota": "cpu_seconds_per_day"},
            )
        if await self._readings.stored_bytes(tenant_id) >= quota.max_storage_mb * MIB:
            await self._note(tenant_id, "max_storage_mb", quota.max_storage_mb)
            raise StorageQuotaExhausted(
                retry_after=STORAGE_RETRY_AFTER_S,
                limit=quota.max_storage_mb,
                details={"quota": "max_storage_mb"},
            )
        wait = await self.counters.reserve_token(
            tenant_id,
            rate=quota.executions_per_second,
            burst=quota.burst,
            max_wait=self._queue_s,
        )
        if wait is None:
            await self._note(tenant_id, "executions_per_second", quota.executions_per_second)
            raise RateLimited(
                retry_after=max(1.0, 1.0 / quota.executions_per_second),
                limit=quota.executions_per_second,
                details={"quota": "executions_per_second"},
            )
        if wait > 0:
            await self._note(
                tenant_id, "executions_per_second", quota.executions_per_second, waited_s=wait
            )
            await asyncio.sleep(wait)
        lease_id = new_id("lease")
        await self._acquire(tenant_id, quota, lease_id, wall_seconds + LEASE_GRACE_S, started)
        try:
            yield time.monotonic() - started
        finally:
            await _forgiving(
                self.counters.release_slot(tenant_id, lease_id=lease_id), f"tenant {tenant_id}"
            )

    async def _note(
        self, tenant_id: str, quota: str, limit: float, *, waited_s: float | None = None
    ) -> None:
        """Make a throttle visible (``app.quotas.throttles``): refused unless it waited."""
        if self._throttles is not None:
            outcome: Outcome = "refused" if waited_s is None else "delayed"
            await self._throttles.note(
                tenant_id, quota, outcome, limit=limit, waited_s=waited_s or 0.0
            )

    async def _acquire(
        self, tenant_id: str, quota: QuotaLimits, lease_id: str, ttl: float, started: float
    ) -> None:
        limit = quota.max_concurrent_executions
        if await self.counters.try_acquire_slot(tenant_id, limit=limit, lease_id=lease_id, ttl=ttl):
            return
        entered = await self.counters.enter_queue(
            tenant_id, depth=self._depth, entry_id=lease_id, ttl=self._queue_s + LEASE_GRACE_S
        )
        if not entered:
            await self._note(tenant_id, "max_concurrent_executions", limit)
            raise ConcurrencyLimited(
                "the tenant's admission queue is full",
                retry_after=1.0,
                limit=limit,
                details={"quota": "max_concurrent_executions"},
            )
        queued = time.monotonic()
        try:
            deadline = started + self._queue_s
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    log.info("tenant %s: admission wait ran out", tenant_id)
                    await self._note(tenant_id, "max_concurrent_executions", limit)
                    raise ConcurrencyLimited(
                        retry_after=1.0,
                        limit=limit,
                        details={"quota": "max_concurrent_executions"},
                    )
                await self.counters.wait_for_slot(tenant_id, remaining)
                if await self.counters.try_acquire_slot(
                    tenant_id, limit=limit, lease_id=lease_id, ttl=ttl
                ):
                    await self._note(
                        tenant_id,
                        "max_concurrent_executions",
                        limit,
                        waited_s=time.monotonic() - queued,
                    )
                    return
        finally:
            await _forgiving(
                self.counters.leave_queue(tenant_id, entry_id=lease_id), f"tenant {tenant_id}"
            )
