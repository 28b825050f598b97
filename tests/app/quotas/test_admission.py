"""Admission control (app/quotas/admission.py) over both counter implementations.

Shared behaviour is parametrized over ``MemoryCounters`` and ``RedisCounters`` (real
Redis). Assertions are about order and outcome; the few waits are short and their
bounds one-sided or generous, so a loaded machine cannot make them flake.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from app.db import tenants, usage
from app.db.engine import make_engine, make_sessionmaker
from app.db.migrate import upgrade
from app.db.models import UsageEvent
from app.errors import (
    ConcurrencyLimited,
    CpuQuotaExhausted,
    RateLimited,
    StorageQuotaExhausted,
)
from app.quotas.admission import LEASE_GRACE_S, Admission
from app.quotas.counters import MemoryCounters, QuotaCounters
from app.quotas.readings import Readings
from app.quotas.redis_counters import RedisCounters
from app.quotas.spec import QuotaLimits
from wire import keys

TENANT = "ten_test"

QUOTA = QuotaLimits(
    max_concurrent_executions=1,
    max_concurrent_sandboxes=1,
    executions_per_second=1000.0,
    burst=1000,
    cpu_seconds_per_day=100.0,
    max_memory_mb=512,
    max_wall_seconds=10.0,
    max_sandbox_lifetime_seconds=60,
)


def quota(**overrides: Any) -> QuotaLimits:
    return QUOTA.model_copy(update=overrides)


class FakeReadings:
    """Stands in for Readings: today's CPU-seconds and the bytes stored per tenant, set by
    the test."""

    def __init__(self) -> None:
        self.used: dict[str, float] = {}
        self.stored: dict[str, float] = {}

    async def cpu_seconds_today(self, tenant_id: str) -> float:
        return self.used.get(tenant_id, 0.0)

    async def stored_bytes(self, tenant_id: str) -> float:
        return self.stored.get(tenant_id, 0.0)


@dataclass
class Harness:
    name: str
    counters: QuotaCounters
    #: Leases held right now for a tenant, read from the counters' own storage.
    active: Callable[[str], Awaitable[int]]
    #: Let ``seconds`` pass as far as lease expiry and token refill are concerned.
    advance: Callable[[float], Awaitable[None]]
    readings: FakeReadings

    def admission(self, *, queue_seconds: float = 30.0, queue_depth: int = 16) -> Admission:
        return Admission(
            self.counters,
            self.readings,  # type: ignore[arg-type]
            queue_seconds=queue_seconds,
            queue_depth=queue_depth,
        )


class ShiftedClock:
    """time.monotonic plus an offset the test can move forward."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def backend(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    """Which counters, and the Redis URL (a sync fixture: ``redis_url`` flushes with a
    blocking client)."""
    if request.param == "memory":
        return "memory", None
    return "redis", request.getfixturevalue("redis_url")


@pytest.fixture
async def harness(backend: tuple[str, str | None]) -> AsyncIterator[Harness]:
    name, url = backend
    if url is None:
        clock = ShiftedClock()
        memory = MemoryCounters(clock=clock)

        async def memory_active(tenant_id: str) -> int:
            # Count live leases only, as try_acquire_slot would see them.
            now = clock()
            return sum(1 for exp in memory._state(tenant_id).leases.values() if exp > now)

        async def shift(seconds: float) -> None:
            clock.offset += seconds

        yield Harness(name, memory, memory_active, shift, FakeReadings())
        return

    redis = Redis.from_url(url, decode_responses=True)
    try:

        async def redis_active(tenant_id: str) -> int:
            return int(await redis.zcount(keys.quota_slots(tenant_id), f"({time.time()}", "+inf"))

        async def sleep(seconds: float) -> None:
            await asyncio.sleep(seconds)

        counters = RedisCounters(redis)
        yield Harness(name, counters, redis_active, sleep, FakeReadings())
        await counters.close()
    finally:
        await redis.aclose()


async def until(predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """Poll until ``predicate()`` holds (a bound for a hung test, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.005)


class Holder:
    """A task that holds one admission slot until told to leave."""

    def __init__(self, admission: Admission, q: QuotaLimits, name: str, log: list[str]) -> None:
        self.entered = asyncio.Event()
        self.leave = asyncio.Event()
        self._name = name
        self._log = log
        self.task = asyncio.create_task(self._run(admission, q))

    async def _run(self, admission: Admission, q: QuotaLimits) -> float:
        async with admission.admit(TENANT, q, wall_seconds=5.0) as waited:
            self._log.append(f"{self._name} in")
            self.entered.set()
            await self.leave.wait()
            self._log.append(f"{self._name} out")
            return waited


async def waiting_is(harness: Harness, n: int) -> None:
    async def check() -> bool:
        return await harness.counters.waiting() == n

    await until(check)


# --- concurrency ------------------------------------------------------------------------


async def test_limit_n_admits_n_and_the_next_waits_for_a_free_slot(harness: Harness) -> None:
    admission = harness.admission()
    q = quota(max_concurrent_executions=2)
    log: list[str] = []
    first, second = Holder(admission, q, "a", log), Holder(admission, q, "b", log)
    await asyncio.wait_for(asyncio.gather(first.entered.wait(), second.entered.wait()), 10)
    assert await harness.active(TENANT) == 2

    third = Holder(admission, q, "c", log)
    await waiting_is(harness, 1)
    assert not third.entered.is_set()
    assert sorted(log) == ["a in", "b in"]

    first.leave.set()
    await asyncio.wait_for(third.entered.wait(), 10)
    assert log[2:] == ["a out", "c in"]
    assert await harness.counters.waiting() == 0
    assert await harness.active(TENANT) == 2

    second.leave.set()
    third.leave.set()
    await asyncio.gather(first.task, second.task, third.task)
    assert await harness.active(TENANT) == 0


async def test_tenants_do_not_share_slots(harness: Harness) -> None:
    admission = harness.admission(queue_seconds=0)
    q = quota(max_concurrent_executions=1)
    async with (
        admission.admit("ten_a", q, wall_seconds=1.0),
        admission.admit("ten_b", q, wall_seconds=1.0),
    ):
        assert await harness.active("ten_a") == 1
        assert await harness.active("ten_b") == 1


async def test_waiting_past_queue_seconds_is_concurrency_limited(harness: Harness) -> None:
    admission = harness.admission(queue_seconds=0.2)
    q = quota(max_concurrent_executions=1)
    holder = Holder(admission, q, "a", [])
    await asyncio.wait_for(holder.entered.wait(), 10)

    with pytest.raises(ConcurrencyLimited) as info:
        async with admission.admit(TENANT, q, wall_seconds=1.0):
            pytest.fail("admitted over the concurrency limit")
    assert info.value.retry_after > 0
    assert int(info.value.headers()["Retry-After"]) >= 1
    assert await harness.counters.waiting() == 0  # it left the queue
    assert await harness.active(TENANT) == 1  # and took no lease

    holder.leave.set()
    await holder.task


async def test_a_full_queue_is_refused_at_once(harness: Harness) -> None:
    # queue_seconds is long: only the depth bound can refuse the third request.
    admission = harness.admission(queue_seconds=30, queue_depth=1)
    q = quota(max_concurrent_executions=1)
    holder = Holder(admission, q, "a", [])
    await asyncio.wait_for(holder.entered.wait(), 10)
    queued = Holder(admission, q, "b", [])
    await waiting_is(harness, 1)

    with pytest.raises(ConcurrencyLimited, match="queue is full") as info:
        async with admission.admit(TENANT, q, wall_seconds=1.0):
            pytest.fail("admitted over the concurrency limit")
    assert info.value.retry_after > 0
    assert await harness.counters.waiting() == 1  # the refused one never counted

    holder.leave.set()
    await asyncio.wait_for(queued.entered.wait(), 10)
    queued.leave.set()
    await asyncio.gather(holder.task, queued.task)


async def test_queue_depth_zero_never_queues(harness: Harness) -> None:
    admission = harness.admission(queue_seconds=30, queue_depth=0)
    q = quota(max_concurrent_executions=1)
    async with admission.admit(TENANT, q, wall_seconds=1.0):
        with pytest.raises(ConcurrencyLimited, match="queue is full"):
            async with admission.admit(TENANT, q, wall_seconds=1.0):
                pytest.fail("admitted over the concurrency limit")


# --- release on every exit --------------------------------------------------------------


async def test_slot_is_released_when_the_body_raises(harness: Harness) -> None:
    admission = harness.admission(queue_seconds=0)
    q = quota(max_concurrent_executions=1)
    with pytest.raises(RuntimeError, match="boom"):
        async with admission.admit(TENANT, q, wall_seconds=1.0):
            assert await harness.active(TENANT) == 1
            raise RuntimeError("boom")
    assert await harness.active(TENANT) == 0
    async with admission.admit(TENANT, q, wall_seconds=1.0):  # queue_seconds=0: no waiting
        assert await harness.active(TENANT) == 1


async def test_slot_is_released_when_the_body_is_cancelled(harness: Harness) -> None:
    admission = harness.admission(queue_seconds=0)
    q = quota(max_concurrent_executions=1)
    holder = Holder(admission, q, "a", [])
    await asyncio.wait_for(holder.entered.wait(), 10)
    assert await harness.active(TENANT) == 1

    holder.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder.task
    assert await harness.active(TENANT) == 0
    async with admission.admit(TENANT, q, wall_seconds=1.0):
        pass


async def test_cancelled_while_queued_leaves_the_queue_and_holds_nothing(
    harness: Harness,
) -> None:
    admission = harness.admission(queue_seconds=30)
    q = quota(max_concurrent_executions=1)
    holder = Holder(admission, q, "a", [])
    await asyncio.wait_for(holder.entered.wait(), 10)
    queued = Holder(admission, q, "b", [])
    await waiting_is(harness, 1)

    queued.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued.task
    assert not queued.entered.is_set()
    assert await harness.counters.waiting() == 0
    assert await harness.active(TENANT) == 1

    holder.leave.set()
    await holder.task
    assert await harness.active(TENANT) == 0


# --- leases expire ----------------------------------------------------------------------


async def test_a_lease_expires_after_its_ttl(harness: Harness) -> None:
    """A gateway that crashed holding a lease does not hold the slot forever."""
    c = harness.counters
    assert await c.try_acquire_slot(TENANT, limit=1, lease_id="crashed", ttl=0.3)
    assert not await c.try_acquire_slot(TENANT, limit=1, lease_id="next", ttl=30)
    await harness.advance(0.5)
    assert await c.try_acquire_slot(TENANT, limit=1, lease_id="next", ttl=30)
    assert await harness.active(TENANT) == 1
    await c.release_slot(TENANT, lease_id="next")
    assert await harness.active(TENANT) == 0


async def test_a_short_lease_does_not_cut_a_longer_one_short(harness: Harness) -> None:
    """Leases with different TTLs (different wall limits) each live their own TTL."""
    c = harness.counters
    assert await c.try_acquire_slot(TENANT, limit=2, lease_id="long", ttl=60)
    assert await c.try_acquire_slot(TENANT, limit=2, lease_id="short", ttl=0.3)
    await harness.advance(0.5)
    # "short" has expired, "long" has not: exactly one slot is free.
    assert await c.try_acquire_slot(TENANT, limit=2, lease_id="c", ttl=60)
    assert not await c.try_acquire_slot(TENANT, limit=2, lease_id="d", ttl=60)


async def test_releasing_an_unknown_lease_is_harmless(harness: Harness) -> None:
    c = harness.counters
    assert await c.try_acquire_slot(TENANT, limit=1, lease_id="a", ttl=30)
    await c.release_slot(TENANT, lease_id="never-acquired")
    await c.release_slot(TENANT, lease_id="a")
    await c.release_slot(TENANT, lease_id="a")
    assert await harness.active(TENANT) == 0


REDIS_ONLY = pytest.mark.parametrize(
    "backend", [pytest.param("redis", marks=pytest.mark.redis)], indirect=True
)
MEMORY_ONLY = pytest.mark.parametrize("backend", ["memory"], indirect=True)


@REDIS_ONLY
async def test_a_crashed_gateways_lease_expires_and_a_queued_request_gets_in(
    harness: Harness,
) -> None:
    """Another gateway took a lease and died: once its TTL passes, waiters get the slot."""
    admission = harness.admission(queue_seconds=30)
    q = quota(max_concurrent_executions=1)
    assert await harness.counters.try_acquire_slot(TENANT, limit=1, lease_id="dead", ttl=0.3)
    log: list[str] = []
    queued = Holder(admission, q, "b", log)
    await waiting_is(harness, 1)
    await asyncio.wait_for(queued.entered.wait(), 10)
    queued.leave.set()
    await queued.task
    assert log == ["b in", "b out"]


@MEMORY_ONLY
async def test_lease_ttl_is_the_wall_time_plus_grace(harness: Harness) -> None:
    admission = harness.admission(queue_seconds=0)
    q = quota(max_concurrent_executions=1)
    async with admission.admit(TENANT, q, wall_seconds=5.0):
        await harness.advance(5.0 + LEASE_GRACE_S - 1.0)
        assert await harness.active(TENANT) == 1
        await harness.advance(2.0)
        assert await harness.active(TENANT) == 0  # a runaway body loses its lease
        async with admission.admit(TENANT, q, wall_seconds=5.0):
            assert await harness.active(TENANT) == 1


@REDIS_ONLY
async def test_redis_lease_expiry_is_the_wall_time_plus_grace(
    harness: Harness, backend: tuple[str, str | None]
) -> None:
    admission = harness.admission(queue_seconds=0)
    q = quota(max_concurrent_executions=1)
    redis = Redis.from_url(backend[1] or "", decode_responses=True)
    try:
        before = time.time()
        async with admission.admit(TENANT, q, wall_seconds=5.0):
            after = time.time()
            leases = await redis.zrange(keys.quota_slots(TENANT), 0, -1, withscores=True)
            ttl_ms = await redis.pttl(keys.quota_slots(TENANT))
        assert len(leases) == 1
        expiry = leases[0][1]
        assert before + 5.0 + LEASE_GRACE_S <= expiry <= after + 5.0 + LEASE_GRACE_S
        assert 0 < ttl_ms <= (5.0 + LEASE_GRACE_S) * 1000 + 1000
    finally:
        await redis.aclose()


# --- token bucket -----------------------------------------------------------------------


async def test_bucket_burst_then_reservations_then_refusal(harness: Harness) -> None:
    # rate 1/s: the few ms between calls refill a negligible fraction of a token.
    c = harness.counters
    waits = [await c.reserve_token(TENANT, rate=1.0, burst=2, max_wait=2.5) for _ in range(5)]
    assert waits[:2] == [0.0, 0.0]
    assert waits[2] == pytest.approx(1.0, abs=0.2)
    assert waits[3] == pytest.approx(2.0, abs=0.2)
    assert waits[4] is None  # would be due in ~3 s > max_wait


async def test_bucket_refills_at_its_rate_up_to_burst(harness: Harness) -> None:
    c = harness.counters

    async def take() -> float | None:
        return await c.reserve_token(TENANT, rate=4.0, burst=2, max_wait=0)

    assert [await take() for _ in range(3)] == [0.0, 0.0, None]
    await harness.advance(0.6)  # 2.4 tokens' worth, capped at the burst of two
    assert [await take() for _ in range(3)] == [0.0, 0.0, None]


async def test_admission_burst_passes_then_waits_for_its_reservation(harness: Harness) -> None:
    admission = harness.admission(queue_seconds=5)
    q = quota(executions_per_second=2.0, burst=2, max_concurrent_executions=10)
    waited = []
    for _ in range(3):
        async with admission.admit(TENANT, q, wall_seconds=1.0) as w:
            waited.append(w)
    # The burst is immediate; the third waits for its token, due 1/rate = 0.5 s later.
    assert max(waited[:2]) < waited[2]
    assert waited[2] >= 0.3


async def test_admission_over_max_wait_is_rate_limited(harness: Harness) -> None:
    admission = harness.admission(queue_seconds=1.0)
    q = quota(executions_per_second=0.1, burst=2, max_concurrent_executions=10)
    for _ in range(2):
        async with admission.admit(TENANT, q, wall_seconds=1.0):
            pass
    with pytest.raises(RateLimited) as info:
        async with admission.admit(TENANT, q, wall_seconds=1.0):
            pytest.fail("admitted over the rate limit")
    assert info.value.retry_after == pytest.approx(10.0)  # 1 / rate
    assert info.value.headers()["Retry-After"] == "10"
    assert await harness.active(TENANT) == 0  # refused before taking a slot


async def test_rate_limited_retry_after_is_at_least_a_second(harness: Harness) -> None:
    admission = harness.admission(queue_seconds=0)
    q = quota(executions_per_second=2.0, burst=1, max_concurrent_executions=10)
    async with admission.admit(TENANT, q, wall_seconds=1.0):
        pass
    with pytest.raises(RateLimited) as info:
        async with admission.admit(TENANT, q, wall_seconds=1.0):
            pass
    assert info.value.retry_after == 1.0


async def test_memory_bucket_exact_with_a_fake_clock() -> None:
    now = [100.0]
    c = MemoryCounters(clock=lambda: now[0])
    reserve = [await c.reserve_token(TENANT, rate=4.0, burst=3, max_wait=1.0) for _ in range(8)]
    # 3 from the burst, then one every 0.25 s up to max_wait (4 more), then refused.
    assert reserve == [0.0, 0.0, 0.0, 0.25, 0.5, 0.75, 1.0, None]
    now[0] += 0.5  # two tokens come due: the next reservation is 0.5 s out
    assert await c.reserve_token(TENANT, rate=4.0, burst=3, max_wait=1.0) == 0.75


# --- CPU budget -------------------------------------------------------------------------


def _seconds_to_utc_midnight() -> float:
    now = datetime.now(UTC)
    return 86_400.0 - (now.hour * 3600 + now.minute * 60 + now.second + now.microsecond / 1e6)


async def test_cpu_budget_exhausted(harness: Harness) -> None:
    admission = harness.admission()
    q = quota(cpu_seconds_per_day=10.0, burst=2, executions_per_second=0.01)
    harness.readings.used[TENANT] = 9.99
    async with admission.admit(TENANT, q, wall_seconds=1.0):
        pass

    harness.readings.used[TENANT] = 10.0
    with pytest.raises(CpuQuotaExhausted) as info:
        async with admission.admit(TENANT, q, wall_seconds=1.0):
            pytest.fail("admitted over the CPU budget")
    assert info.value.retry_after == pytest.approx(_seconds_to_utc_midnight(), abs=5)
    assert 0 < info.value.retry_after <= 86_400
    assert await harness.active(TENANT) == 0
    # Checked before the bucket: the refusal spent none of the two tokens.
    assert await harness.counters.reserve_token(TENANT, rate=0.01, burst=2, max_wait=0) == 0.0
    harness.readings.used["other"] = 0.0
    async with admission.admit("other", q, wall_seconds=1.0):
        pass


async def test_storage_quota_refuses_new_work_once_used_up(harness: Harness) -> None:
    admission = harness.admission()
    q = quota(max_storage_mb=2, burst=2, executions_per_second=0.01)
    harness.readings.stored[TENANT] = 2 * 1024 * 1024 - 1
    async with admission.admit(TENANT, q, wall_seconds=1.0):
        pass

    harness.readings.stored[TENANT] = 2 * 1024 * 1024
    with pytest.raises(StorageQuotaExhausted) as info:
        async with admission.admit(TENANT, q, wall_seconds=1.0):
            pytest.fail("admitted over the storage quota")
    assert info.value.code == "storage_quota_exhausted"
    assert info.value.retry_after >= 1
    assert await harness.active(TENANT) == 0
    # Checked before the bucket: the refusal spent no token.
    assert await harness.counters.reserve_token(TENANT, rate=0.01, burst=2, max_wait=0) == 0.0


async def test_cpu_budget_read_from_rollups_and_events_not_rolled_up(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path}/cpu.db")
    try:
        await upgrade(engine)
        sessions = make_sessionmaker(engine)
        async with sessions.begin() as session:
            tenant, _key, _plain = await tenants.create_tenant(session, name="cpu", quota=QUOTA)
        now = datetime.now(UTC)
        yesterday = now - timedelta(days=1)
        for n, (cpu_ms, when) in enumerate([(1500.0, now), (400.0, yesterday), (1000.0, now)]):
            async with sessions.begin() as session:
                session.add(
                    UsageEvent(
                        occurred_at=when,
                        tenant_id=tenant.id,
                        subject="invocation",
                        subject_id=f"inv_{n}",
                        kind="run",
                        cpu_ms=cpu_ms,
                    )
                )
            if n == 1:  # the first two are rolled up, the last is not yet
                async with sessions.begin() as session:
                    assert await usage.roll_up(session) == 2

        cpu = Readings(sessions, cache_seconds=0)
        assert await cpu.cpu_seconds_today(tenant.id) == pytest.approx(2.5)
        assert await cpu.cpu_seconds_today("ten_nobody") == 0.0

        admission = Admission(MemoryCounters(), cpu, queue_seconds=1, queue_depth=1)
        async with admission.admit(tenant.id, quota(cpu_seconds_per_day=2.6), wall_seconds=1):
            pass
        with pytest.raises(CpuQuotaExhausted):
            async with admission.admit(tenant.id, quota(cpu_seconds_per_day=2.5), wall_seconds=1):
                pass
    finally:
        await engine.dispose()


async def test_a_crashed_gateways_queue_entries_expire(harness: Harness) -> None:
    """Entries that never leave (their gateway died) stop counting against the depth."""
    c = harness.counters
    assert await c.enter_queue(TENANT, depth=1, entry_id="orphan", ttl=0.2)
    assert not await c.enter_queue(TENANT, depth=1, entry_id="next", ttl=5)
    await asyncio.sleep(0.3)
    assert await c.enter_queue(TENANT, depth=1, entry_id="next", ttl=5)
    await c.leave_queue(TENANT, entry_id="next")


async def test_readings_missed_together_are_read_once() -> None:
    """An entry that expires under load is read once, not once per call in flight."""
    opened: list[int] = []

    class Sessions:
        def __call__(self) -> Any:
            opened.append(1)
            return contextlib.nullcontext(None)

    readings = Readings(Sessions(), cache_seconds=60)  # type: ignore[arg-type]

    async def slow(_: Any) -> float:
        await asyncio.sleep(0.05)
        return 7.0

    got = await asyncio.gather(*(readings._cached("cpu", "t", slow) for _ in range(20)))
    assert got == [7.0] * 20 and len(opened) == 1


async def test_a_release_that_waits_finishes_when_its_caller_is_cancelled() -> None:
    """The slot's release runs in a task of its own (an eager one): a caller cancelled
    while the counters are slow to answer does not cut the release short."""

    class SlowRelease(MemoryCounters):
        def __init__(self) -> None:
            super().__init__()
            self.releasing = asyncio.Event()
            self.go = asyncio.Event()

        async def release_slot(self, tenant_id: str, *, lease_id: str) -> None:
            self.releasing.set()
            await self.go.wait()
            await super().release_slot(tenant_id, lease_id=lease_id)

    counters = SlowRelease()
    admission = Admission(counters, FakeReadings(), queue_seconds=0, queue_depth=1)  # type: ignore[arg-type]

    async def call() -> None:
        async with admission.admit(TENANT, quota(), wall_seconds=1.0):
            pass

    task = asyncio.create_task(call())
    await asyncio.wait_for(counters.releasing.wait(), 10)
    assert counters.active(TENANT) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    counters.go.set()
    await until(lambda: _returns(counters.active(TENANT) == 0))


async def _returns(value: bool) -> bool:
    return value
