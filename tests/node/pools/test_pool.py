"""The warm-pool framework against a fake worker factory: sizing, merged cold starts, the
reaper, eviction, idle accounting, one-shot workers, back-off and close().

Time that matters is a ``ManualClock``: the pool measures rates, start times, idle time
and back-off with it, so nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio

from node.pools import Bounds, Pool, PoolClosed, PoolConfig, PoolExhausted
from node.pools.fake import FakeFactory, FakeWorker, ManualClock
from node.pools.sizing import ArrivalRate, Sizing, target

MakePool = Callable[..., Pool[FakeWorker]]


@pytest_asyncio.fixture
async def make_pool() -> AsyncIterator[MakePool]:
    """``make_pool(factory, clock=None, **PoolConfig fields)``; closed after the test."""
    pools: list[Pool[FakeWorker]] = []

    def make(
        factory: FakeFactory, clock: ManualClock | None = None, **config: Any
    ) -> Pool[FakeWorker]:
        pool = Pool(factory, PoolConfig(**config), name="test", clock=clock or ManualClock())
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        await pool.close()


async def settle() -> None:
    """Let every ready task and callback run (no time passes on the manual clock)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.005)):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


# --- sizing -----------------------------------------------------------------------------


def test_target_formula_and_clamps() -> None:
    bounds = Bounds(min=1, max=5)
    kw: dict[str, Any] = {"headroom": 0.5, "floor_rate": 0.1, "bounds": bounds}
    assert target(10.0, 0.2, **kw) == 3  # ceil(10 * 0.2 * 1.5)
    assert target(20.0, 0.1, **kw) == 3  # exactly 3.0 stays 3
    assert target(100.0, 0.2, **kw) == 5  # clamped by max
    assert target(0.05, 0.2, **kw) == 1  # below the floor: no demand, the minimum
    assert target(10.0, None, **kw) == 1  # no start time measured yet
    assert target(0.5, 0.2, headroom=0.5, floor_rate=0.1, bounds=Bounds(0, 4)) == 1
    with pytest.raises(ValueError):
        Bounds(min=3, max=2)


def test_arrival_rate_is_an_exponentially_weighted_rate() -> None:
    rate = ArrivalRate(window_s=2.0)
    now = 0.0
    for _ in range(2000):  # 10 per second for 200 s: many windows
        now += 0.1
        rate.add(now)
    assert rate.value(now) == pytest.approx(10.0, rel=0.05)
    assert rate.value(now + 2.0) == pytest.approx(rate.value(now) / math.e)
    assert rate.value(now + 100.0) < 1e-9


async def test_target_follows_arrival_rate_and_start_time(make_pool: MakePool) -> None:
    clock = ManualClock()
    factory = FakeFactory(clock=clock, start_s=0.25)
    pool = make_pool(factory, clock, demand_window_s=2.0, idle_timeout_s=10.0)
    pool.declare("k", Bounds(min=1, max=5))
    await pool.start()  # one start, measured at 0.25 s
    assert pool.target("k") == 1
    factory.gate.clear()  # refill starts stay in flight: the measured start time stays

    async def arrivals(per_second: float, seconds: float) -> None:
        for _ in range(int(per_second * seconds)):
            clock.advance(1 / per_second)
            worker = await pool.acquire("k")
            pool.release(worker)

    await arrivals(10, 30)
    assert pool.target("k") == 4  # ceil(10/s * 0.25 s * 1.5)
    await arrivals(50, 10)
    assert pool.target("k") == 5  # 19, clamped by max
    clock.advance(60)
    assert pool.target("k") == 1  # nobody asks: back to the minimum

    # a slower start raises the target at the same rate
    sizing = Sizing(window_s=2.0)
    for i in range(400):
        sizing.arrived(i * 0.1)
    sizing.started(0.4)
    fast = sizing.target(40.0, Bounds(0, 10), headroom=0.5, floor_rate=0.1, fallback_start_s=None)
    sizing.started(2.0)
    slow = sizing.target(40.0, Bounds(0, 10), headroom=0.5, floor_rate=0.1, fallback_start_s=None)
    assert (fast, slow) == (6, 10)


async def test_refill_brings_a_key_to_its_target(make_pool: MakePool) -> None:
    clock = ManualClock()
    factory = FakeFactory(clock=clock, start_s=0.5)  # every start moves the clock 0.5 s
    pool = make_pool(factory, clock, demand_window_s=10.0, start_concurrency=1)
    pool.declare("k", Bounds(min=1, max=6))
    await pool.start()
    for _ in range(300):  # a burst: ~28/s, ceil(28 * 0.5 * 1.5) = 21, clamped to 6
        clock.advance(0.005)
        pool.release(await pool.acquire("k"))
    assert pool.target("k") == 6
    await wait_for(lambda: pool.stats()["warm"] >= 6)
    await settle()
    assert pool.target("k") == 6
    assert pool.stats() == {"warm": 6, "busy": 0, "starting": 0}
    assert len(factory.started) == 6


# --- merged cold starts -----------------------------------------------------------------


async def test_concurrent_acquires_share_starts(make_pool: MakePool) -> None:
    factory = FakeFactory()
    pool = make_pool(factory)
    await pool.start()
    factory.gate.clear()
    tasks = [asyncio.create_task(pool.acquire("k")) for _ in range(5)]
    await settle()
    assert len(factory.attempts) == 5  # at most one start per waiter
    assert pool.stats()["starting"] == 5
    factory.gate.set()
    workers = await asyncio.gather(*tasks)
    assert len({w.id for w in workers}) == 5
    assert len(factory.attempts) == 5
    assert pool.idle_capacity()["k"].cold_starts == 5


async def test_releases_serve_waiters_before_new_starts(make_pool: MakePool) -> None:
    factory = FakeFactory()
    pool = make_pool(factory)
    pool.declare("k", Bounds(min=2, max=2))
    await pool.start()
    w1, w2 = await pool.acquire("k"), await pool.acquire("k")
    factory.gate.clear()
    attempts = len(factory.attempts)

    a = asyncio.create_task(pool.acquire("k"))
    await settle()
    assert len(factory.attempts) == attempts + 1
    pool.release(w1)  # goes to the waiting a; its start goes on
    assert await a is w1
    b = asyncio.create_task(pool.acquire("k"))
    await settle()
    assert len(factory.attempts) == attempts + 1  # b waits for the start in flight
    c = asyncio.create_task(pool.acquire("k"))
    await settle()
    assert len(factory.attempts) == attempts + 2  # c outnumbers the starts: one more
    pool.release(w2)
    assert await b is w2
    factory.gate.set()
    fresh = await c
    assert fresh not in (w1, w2)
    await settle()
    # three cold acquires, two starts; the spare one went to idle
    assert len(factory.attempts) == attempts + 2
    assert pool.stats() == {"warm": 1, "busy": 3, "starting": 0}


async def test_a_cancelled_waiters_worker_goes_to_the_next(make_pool: MakePool) -> None:
    factory = FakeFactory()
    pool = make_pool(factory, start_concurrency=1)
    await pool.start()
    factory.gate.clear()
    a = asyncio.create_task(pool.acquire("k"))
    b = asyncio.create_task(pool.acquire("k"))
    await settle()
    assert len(factory.attempts) == 2
    a.cancel()
    await settle()
    assert a.cancelled()
    factory.gate.set()
    got = await b
    await settle()
    assert pool.stats() == {"warm": 1, "busy": 1, "starting": 0}  # a's start went idle
    assert {w.id for w in factory.live} == {w.id for w in pool.workers()}
    assert got in pool.workers()


async def test_a_waiter_cancelled_after_the_hand_over(make_pool: MakePool) -> None:
    factory = FakeFactory()
    pool = make_pool(factory)
    pool.declare("k", Bounds(min=1, max=1))
    await pool.start()
    held = await pool.acquire("k")
    factory.gate.clear()
    a = asyncio.create_task(pool.acquire("k"))
    await settle()
    b = asyncio.create_task(pool.acquire("k"))
    await settle()
    pool.release(held)  # handed to a ...
    a.cancel()  # ... which gives up before it runs
    assert await b is held  # so b gets it
    with pytest.raises(asyncio.CancelledError):
        await a
    factory.gate.set()
    await wait_for(lambda: pool.stats()["starting"] == 0)
    assert pool.stats()["busy"] == 1
    assert not held.stopped


async def test_acquire_times_out_when_full(make_pool: MakePool) -> None:
    factory = FakeFactory()
    pool = make_pool(factory, max_workers=1, acquire_timeout_s=0.05)
    await pool.start()
    held = await pool.acquire("a")
    with pytest.raises(PoolExhausted, match="no b worker"):
        await pool.acquire("b")
    assert len(factory.attempts) == 1
    pool.release(held)


# --- bounded starts ---------------------------------------------------------------------


async def test_a_burst_of_one_key_starts_within_the_bounds(make_pool: MakePool) -> None:
    factory = FakeFactory()
    pool = make_pool(factory, max_workers=64, max_starting=3, max_starting_per_key=2)
    await pool.start()
    factory.gate.clear()
    burst = [asyncio.create_task(pool.acquire("a")) for _ in range(40)]
    others = [asyncio.create_task(pool.acquire(key)) for key in ("b", "c") for _ in range(10)]
    await settle()
    assert factory.in_flight == {"a": 2, "b": 1}  # per key 2, 3 over all; c waits its turn
    factory.gate.set()
    workers = await asyncio.gather(*burst, *others)
    for worker in workers:
        pool.release(worker)
    assert max(factory.most_in_flight.values()) == 2
    assert factory.most_in_flight_total == 3
    assert {w.key for w in workers} == {"a", "b", "c"}


async def test_a_keys_blocked_growth_does_not_hold_another_keys_calls(
    make_pool: MakePool,
) -> None:
    factory = FakeFactory()
    factory.gates["a"] = asyncio.Event()  # every start of key a hangs
    pool = make_pool(factory, max_workers=16, max_starting=4, max_starting_per_key=2)
    await pool.start()

    async def call(key: str) -> FakeWorker:
        worker = await pool.acquire(key)
        pool.release(worker)
        return worker

    burst = [asyncio.create_task(call("a")) for _ in range(100)]
    await settle()
    assert factory.in_flight["a"] == 2
    other = await asyncio.wait_for(call("b"), timeout=5)  # a hang guard only
    assert other.key == "b" and not any(task.done() for task in burst)
    factory.gates["a"].set()
    assert {worker.key for worker in await asyncio.gather(*burst)} == {"a"}
    assert factory.most_in_flight["a"] == 2


async def test_the_next_start_goes_to_the_key_with_the_fewest_workers(
    make_pool: MakePool,
) -> None:
    factory = FakeFactory()
    pool = make_pool(factory, max_starting=1)
    await pool.start()
    held = [await pool.acquire("big") for _ in range(3)]
    factory.gate.clear()
    big = [asyncio.create_task(pool.acquire("big")) for _ in range(5)]
    await settle()
    assert factory.attempts[-1:] == ["big"] and pool.stats()["starting"] == 1
    small = asyncio.create_task(pool.acquire("small"))
    await settle()
    factory.gate.set()
    await small
    # the start in flight for "big" finished first; the next one went to "small" (no
    # workers) although "big" had waited longer
    assert factory.attempts[3:5] == ["big", "small"]
    for worker in [*held, *await asyncio.gather(*big), small.result()]:
        pool.release(worker)


async def test_background_starts_leave_a_start_to_callers(make_pool: MakePool) -> None:
    factory = FakeFactory()
    pool = make_pool(factory, max_starting=2, start_concurrency=2)
    pool.declare("spare", Bounds(min=4, max=4))
    factory.gate.clear()
    warming = asyncio.create_task(pool.start())
    await settle()
    assert factory.in_flight == {"spare": 1}  # the refill takes one of the two
    caller = asyncio.create_task(pool.acquire("k"))
    await settle()
    assert factory.in_flight == {"spare": 1, "k": 1}
    factory.gate.set()
    pool.release(await caller)
    await warming


# --- reaper, eviction -------------------------------------------------------------------


async def test_reaper_stops_surplus_idle_workers_and_keeps_the_minimum(
    make_pool: MakePool,
) -> None:
    clock = ManualClock()
    factory = FakeFactory()
    pool = make_pool(factory, clock, idle_timeout_s=10.0, demand_window_s=1.0)
    pool.declare("k", Bounds(min=1, max=4))
    await pool.start()
    workers = await asyncio.gather(*(pool.acquire("k") for _ in range(3)))
    for worker in workers:
        clock.advance(1.0)
        pool.release(worker)
    assert pool.stats()["warm"] == 3
    clock.advance(5.0)
    pool.reap()
    assert pool.stats()["warm"] == 3  # surplus, but not idle for long enough
    clock.advance(6.0)
    pool.reap()
    assert pool.stats()["warm"] == 1
    await settle()
    assert {w.id for w in factory.stopped} == {workers[0].id, workers[1].id}
    assert pool.workers() == [workers[2]]  # the most recently used one stays
    clock.advance(1000.0)
    pool.reap()
    assert pool.stats()["warm"] == 1  # the minimum


async def test_reaper_recycles_dead_and_old_workers(make_pool: MakePool) -> None:
    clock = ManualClock()
    factory = FakeFactory()
    pool = make_pool(factory, clock, max_age_s=100.0)
    pool.declare("k", Bounds(min=2, max=2))
    await pool.start()
    first, second = pool.workers()
    first.healthy = False
    pool.reap()
    await settle()
    assert first.stopped and not second.stopped
    await wait_for(lambda: pool.stats()["warm"] == 2)  # refilled
    clock.advance(100.0)
    pool.reap()
    await settle()
    assert second.stopped


async def test_a_full_pool_evicts_the_lru_idle_worker_of_another_key(
    make_pool: MakePool,
) -> None:
    clock = ManualClock()
    factory = FakeFactory()
    pool = make_pool(factory, clock, max_workers=3, default_bounds=Bounds(0, 0))
    await pool.start()
    a1, a2, b1 = await pool.acquire("a"), await pool.acquire("a"), await pool.acquire("b")
    for worker in (a2, a1, b1):  # a2 is the least recently used
        clock.advance(1.0)
        pool.release(worker)
    got = await pool.acquire("c")
    await settle()
    assert got.key == "c"
    assert factory.stopped == [a2]
    assert len(pool.workers()) == 3
    assert pool.inventory() == {"a": 1, "b": 1}


async def test_a_full_pool_waits_for_a_release_then_evicts(make_pool: MakePool) -> None:
    factory = FakeFactory()
    pool = make_pool(factory, max_workers=1, default_bounds=Bounds(0, 0))
    await pool.start()
    held = await pool.acquire("a")
    waiting = asyncio.create_task(pool.acquire("b"))
    await settle()
    assert not waiting.done() and len(factory.attempts) == 1  # no room, nothing to evict
    pool.release(held)
    got = await waiting
    await settle()
    assert got.key == "b" and held.stopped
    assert len(pool.workers()) == 1


# --- spares -----------------------------------------------------------------------------


async def test_a_spare_is_adopted_by_one_key_only(make_pool: MakePool) -> None:
    factory = FakeFactory()
    pool = make_pool(factory)
    pool.declare("rt/py", Bounds(min=1, max=1))
    await pool.start()
    [spare] = pool.workers()
    mine = await pool.acquire("rt/py/t1", spare="rt/py")
    assert mine is spare and spare.key == "rt/py/t1"
    assert factory.adopted == [(spare.id, "rt/py/t1")]
    pool.release(mine)
    await wait_for(lambda: pool.inventory() == {"rt/py": 1, "rt/py/t1": 1})
    other = await pool.acquire("rt/py/t2", spare="rt/py")
    assert other is not spare and other.key == "rt/py/t2"
    again = await pool.acquire("rt/py/t1", spare="rt/py")
    assert again is spare
    pool.release(other)
    pool.release(again)


async def test_a_spare_that_becomes_ready_goes_to_a_waiter(make_pool: MakePool) -> None:
    factory = FakeFactory()
    pool = make_pool(factory, max_workers=2)
    pool.declare("rt/py", Bounds(min=1, max=1))
    await pool.start()
    first = await pool.acquire("rt/py/t1", spare="rt/py")
    factory.gate.clear()
    await settle()
    assert pool.stats()["starting"] == 1  # the spare's replacement; the pool is full
    waiting = asyncio.create_task(pool.acquire("rt/py/t2", spare="rt/py"))
    await settle()
    assert len(factory.attempts) == 2  # no room for a start of its own
    factory.gate.set()
    second = await waiting
    assert second.key == "rt/py/t2" and (second.id, "rt/py/t2") in factory.adopted
    assert len(factory.attempts) == 2 and not factory.stopped
    pool.release(first)
    pool.release(second)


# --- accounting -------------------------------------------------------------------------


async def test_idle_capacity_integrates_idle_workers_and_memory(make_pool: MakePool) -> None:
    clock = ManualClock()
    factory = FakeFactory(memory_mb=10.0, start_cpu_ms=40.0)
    pool = make_pool(factory, clock)
    pool.declare("k", Bounds(min=2, max=2))
    await pool.start()
    assert pool.inventory() == {"k": 2}
    clock.advance(10.0)
    first = pool.idle_capacity()["k"]
    assert (first.instance_seconds, first.memory_mb_seconds) == (20.0, 200.0)
    assert (first.starts, first.cold_starts, first.start_cpu_ms) == (2, 0, 80.0)

    worker = await pool.acquire("k")
    clock.advance(5.0)
    second = pool.idle_capacity()["k"]
    assert (second.instance_seconds, second.memory_mb_seconds) == (5.0, 50.0)
    assert second.starts == 0
    pool.release(worker)
    assert pool.idle_capacity() == {}  # nothing accrued since: left out

    cold = await pool.acquire("other")
    clock.advance(3.0)
    third = pool.idle_capacity()
    assert third["other"].starts == third["other"].cold_starts == 1
    assert third["other"].start_cpu_ms == 40.0  # a cold start's CPU is counted too
    assert third["k"].instance_seconds == 6.0
    pool.release(cold)


# --- one-shot workers -------------------------------------------------------------------


async def test_one_shot_workers_are_never_handed_out_twice(make_pool: MakePool) -> None:
    factory = FakeFactory(one_shot=True)
    pool = make_pool(factory, refill_delay_s=0.01)
    pool.declare("k", Bounds(min=2, max=4))
    await pool.start()
    handed: list[str] = []

    async def call(i: int) -> None:
        worker = await pool.acquire("k")
        handed.append(worker.id)
        try:
            await asyncio.sleep(0.001 * (i % 3))
        finally:
            pool.release(worker)

    tasks = [asyncio.create_task(call(i)) for i in range(60)]
    await asyncio.sleep(0)
    for task in tasks[::7]:
        task.cancel()  # some give up while they wait
    await asyncio.gather(*tasks, return_exceptions=True)
    assert len(handed) == len(set(handed)) >= 60 - len(tasks[::7])
    await settle()
    stopped = {w.id for w in factory.stopped}
    assert set(handed) <= stopped  # every worker that served was stopped after its call
    await wait_for(lambda: pool.stats()["warm"] >= 2)
    assert not {w.id for w in pool.workers()} & set(handed)


# --- failures, close --------------------------------------------------------------------


async def test_failing_starts_back_off(make_pool: MakePool) -> None:
    clock = ManualClock()
    factory = FakeFactory()
    factory.fail_with = RuntimeError("broken interpreter")
    pool = make_pool(factory, clock, backoff_s=0.02, max_backoff_s=1.0)
    pool.declare("k", Bounds(min=1, max=1))
    with pytest.raises(RuntimeError, match="broken interpreter"):
        await pool.start()
    assert len(factory.attempts) == 1
    await asyncio.sleep(0.1)  # real time passes, the pool's clock does not
    assert len(factory.attempts) == 1
    clock.advance(0.02)
    await wait_for(lambda: len(factory.attempts) == 2)
    clock.advance(0.02)  # the next delay is 0.04
    await asyncio.sleep(0.1)
    assert len(factory.attempts) == 2
    clock.advance(0.02)
    await wait_for(lambda: len(factory.attempts) == 3)
    # a caller that waits for a failing start gets its error, and causes one start
    with pytest.raises(RuntimeError, match="broken interpreter"):
        await pool.acquire("k")
    assert len(factory.attempts) == 4
    factory.fail_with = None
    clock.advance(1.0)
    await wait_for(lambda: pool.stats()["warm"] == 1)


async def test_release_recycles_worn_and_unusable_workers(make_pool: MakePool) -> None:
    factory = FakeFactory()
    pool = make_pool(factory, max_uses=2)
    pool.declare("k", Bounds(min=1, max=1))
    await pool.start()
    worker = await pool.acquire("k")
    pool.release(worker)
    assert await pool.acquire("k") is worker
    pool.release(worker)  # second use: worn out
    await settle()
    assert worker.stopped
    fresh = await pool.acquire("k")
    pool.release(fresh, reusable=False, reason="tampered")
    await settle()
    assert fresh.stopped
    other = await pool.acquire("k")
    factory.checks_fail.add(other.id)
    pool.release(other)
    again = await pool.acquire("k")  # other failed its check: recycled, not handed out
    assert again is not other and other.stopped
    pool.release(again)


async def test_close_stops_idle_busy_and_starting_workers(make_pool: MakePool) -> None:
    factory = FakeFactory()
    pool = make_pool(factory)
    pool.declare("k", Bounds(min=2, max=2))
    await pool.start()
    busy = await pool.acquire("k")
    await wait_for(lambda: pool.stats()["warm"] == 1)
    factory.gate.clear()
    waiting = asyncio.create_task(pool.acquire("other"))
    await settle()
    assert pool.stats() == {"warm": 1, "busy": 1, "starting": 1}
    await pool.close()
    with pytest.raises(PoolClosed):
        await waiting
    assert busy.stopped
    assert factory.live == []
    assert pool.stats() == {"warm": 0, "busy": 0, "starting": 0}
    pool.release(busy)  # a late release is harmless
    await pool.close()  # idempotent
    with pytest.raises(PoolClosed):
        await pool.acquire("k")
