"""Both dispatchers honour the same contract; Redis Streams also survives dead nodes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from app.dispatch import keys
from app.dispatch.base import Delivery, Dispatcher, NodeInfo
from app.dispatch.inprocess import InProcessDispatcher
from app.dispatch.messages import Completion, Job
from app.dispatch.redis_streams import RedisStreamsDispatcher
from runtimes.models import RunSpec

NODE_A = NodeInfo("node-a", {"fake": ["fake"]}, 1)
NODE_B = NodeInfo("node-b", {"fake": ["fake"]}, 1)


def job(n: int, reply_to: str) -> Job:
    return Job(
        invocation_id=f"inv_{n}",
        tenant_id="ten_1",
        runtime="fake",
        spec=RunSpec(language="fake", code="{}"),
        reply_to=reply_to,
        enqueued_at=time.time(),
    )


@pytest.fixture(params=["inprocess", pytest.param("redis", marks=pytest.mark.redis)])
async def dispatcher(request: pytest.FixtureRequest) -> AsyncIterator[Dispatcher]:
    if request.param == "inprocess":
        d: Dispatcher = InProcessDispatcher()
        await d.start()
        yield d
        await d.close()
        return
    redis = Redis.from_url(request.getfixturevalue("redis_url"), decode_responses=True)
    d = RedisStreamsDispatcher(redis, runtimes=["fake"], node_dead_after_s=0.5, poll_s=0.1)
    await d.start()
    try:
        yield d
    finally:
        await d.close()
        await redis.aclose()


async def next_delivery(d: Dispatcher, node: NodeInfo) -> Delivery:
    gen = d.deliveries(node)
    try:
        return await asyncio.wait_for(anext(gen), 5)
    finally:
        await gen.aclose()  # type: ignore[attr-defined]


async def test_submit_deliver_ack_complete(dispatcher: Dispatcher) -> None:
    await dispatcher.register(NODE_A)
    submitted = job(1, dispatcher.gateway_id)
    await dispatcher.submit(submitted)
    delivery = await next_delivery(dispatcher, NODE_A)
    assert delivery.job == submitted
    assert delivery.attempt == 1
    await dispatcher.ack(NODE_A.node_id, delivery)
    waiter = asyncio.create_task(dispatcher.wait("inv_1", 5))
    await dispatcher.complete(delivery.job, Completion(invocation_id="inv_1", status="succeeded"))
    completion = await waiter
    assert completion is not None and completion.status == "succeeded"
    assert await dispatcher.queue_depth() == 0


async def test_wait_times_out_without_completion(dispatcher: Dispatcher) -> None:
    await dispatcher.submit(job(2, dispatcher.gateway_id))
    assert await dispatcher.wait("inv_2", 0.2) is None


async def test_live_nodes_come_and_go(dispatcher: Dispatcher) -> None:
    await dispatcher.register(NODE_A)
    await dispatcher.register(NODE_B)
    assert {n.node_id for n in await dispatcher.live_nodes()} == {"node-a", "node-b"}
    assert (await dispatcher.live_nodes())[0].runtimes == {"fake": ["fake"]}
    await dispatcher.unregister("node-a")
    assert [n.node_id for n in await dispatcher.live_nodes()] == ["node-b"]


async def test_jobs_are_delivered_once_each(dispatcher: Dispatcher) -> None:
    await dispatcher.register(NODE_A)
    await dispatcher.register(NODE_B)
    for n in range(6):
        await dispatcher.submit(job(n, dispatcher.gateway_id))
    seen: list[str] = []
    gens = [dispatcher.deliveries(NODE_A), dispatcher.deliveries(NODE_B)]
    try:
        for i in range(6):
            delivery = await asyncio.wait_for(anext(gens[i % 2]), 5)
            seen.append(delivery.job.invocation_id)
            await dispatcher.ack(("node-a", "node-b")[i % 2], delivery)
    finally:
        for gen in gens:
            await gen.aclose()  # type: ignore[attr-defined]
    assert sorted(seen) == [f"inv_{n}" for n in range(6)]


@pytest.mark.redis
async def test_pending_work_of_a_dead_node_is_reclaimed_with_its_attempt(redis_url: str) -> None:
    redis = Redis.from_url(redis_url, decode_responses=True)
    gw = RedisStreamsDispatcher(redis, runtimes=["fake"], node_dead_after_s=0.3, poll_s=0.1)
    try:
        await gw.register(NODE_A)
        await gw.submit(job(7, gw.gateway_id))
        held = await next_delivery(gw, NODE_A)  # node A takes it, then "dies": never acks
        assert held.attempt == 1
        await gw.register(NODE_B)
        await asyncio.sleep(0.4)  # node A's liveness key expires
        await gw.register(NODE_B)
        taken = await next_delivery(gw, NODE_B)
        assert taken.job.invocation_id == "inv_7"
        assert taken.attempt == 2
        await gw.ack("node-b", taken)
        assert await redis.xlen(keys.jobs("fake")) == 0
        pending = await redis.xpending(keys.jobs("fake"), keys.NODE_GROUP)
        assert pending["pending"] == 0
    finally:
        await redis.aclose()


@pytest.mark.redis
async def test_work_of_a_live_node_is_not_taken(redis_url: str) -> None:
    redis = Redis.from_url(redis_url, decode_responses=True)
    gw = RedisStreamsDispatcher(redis, runtimes=["fake"], node_dead_after_s=5, poll_s=0.1)
    try:
        await gw.register(NODE_A)
        await gw.register(NODE_B)
        await gw.submit(job(8, gw.gateway_id))
        await next_delivery(gw, NODE_A)
        gen = gw.deliveries(NODE_B)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(gen), 0.5)
        await gen.aclose()  # type: ignore[attr-defined]
    finally:
        await redis.aclose()


@pytest.mark.redis
async def test_two_live_nodes_race_for_a_dead_nodes_entry_and_one_wins(redis_url: str) -> None:
    redis = Redis.from_url(redis_url, decode_responses=True)
    gw = RedisStreamsDispatcher(redis, runtimes=["fake"], node_dead_after_s=0.3, poll_s=0.1)
    node_c = NodeInfo("node-c", {"fake": ["fake"]}, 1)
    try:
        await gw.register(NODE_A)
        await gw.submit(job(9, gw.gateway_id))
        await next_delivery(gw, NODE_A)
        await asyncio.sleep(0.4)  # node A is dead; B and C stay alive by heartbeats

        async def heartbeat() -> None:
            while True:
                for node in (NODE_B, node_c):
                    await gw.register(node)
                await asyncio.sleep(0.05)

        beating = asyncio.create_task(heartbeat())
        await asyncio.sleep(0.01)

        async def first(node: NodeInfo) -> Any:
            gen = gw.deliveries(node)
            try:
                return await asyncio.wait_for(anext(gen), 0.8)
            except TimeoutError:
                return None
            finally:
                await gen.aclose()  # type: ignore[attr-defined]

        results = await asyncio.gather(first(NODE_B), first(node_c))
        beating.cancel()
        winners = [r for r in results if r is not None]
        assert len(winners) == 1
        assert winners[0].job.invocation_id == "inv_9"
    finally:
        await redis.aclose()


@pytest.mark.redis
async def test_a_malformed_entry_is_dropped_not_looped_on(redis_url: str) -> None:
    redis = Redis.from_url(redis_url, decode_responses=True)
    gw = RedisStreamsDispatcher(redis, runtimes=["fake"], node_dead_after_s=5, poll_s=0.1)
    try:
        await gw.register(NODE_A)
        await gw.submit(job(10, gw.gateway_id))  # creates the group
        gen = gw.deliveries(NODE_A)
        first = await asyncio.wait_for(anext(gen), 5)
        await gw.ack("node-a", first)
        await redis.xadd(keys.jobs("fake"), {"job": "{not json"})
        await gw.submit(job(11, gw.gateway_id))
        second = await asyncio.wait_for(anext(gen), 5)
        assert second.job.invocation_id == "inv_11"
        await gen.aclose()  # type: ignore[attr-defined]
    finally:
        await redis.aclose()


@pytest.mark.redis
async def test_dispatch_survives_redis_losing_its_keys(redis_url: str) -> None:
    """Redis restarted without persistence: streams and group are made again, on both
    sides, and work flows (instead of NOGROUP forever)."""
    redis = Redis.from_url(redis_url, decode_responses=True)
    gw = RedisStreamsDispatcher(redis, runtimes=["fake"], node_dead_after_s=5, poll_s=0.1)
    try:
        await gw.register(NODE_A)
        await gw.submit(job(20, gw.gateway_id))
        gen = gw.deliveries(NODE_A)
        first = await asyncio.wait_for(anext(gen), 5)
        await gw.ack("node-a", first)
        await redis.flushdb()
        await gw.register(NODE_A)
        await gw.submit(job(21, gw.gateway_id))
        second = await asyncio.wait_for(anext(gen), 5)
        assert second.job.invocation_id == "inv_21"
        await gen.aclose()  # type: ignore[attr-defined]
    finally:
        await redis.aclose()
