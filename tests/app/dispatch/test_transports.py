"""Both transports keep one contract: a Job placed on a node or an overflow stream, a claim
that succeeds once per token, node events on the gateway's results stream, settled only
when asked. Redis also keeps its promises across restarts of nodes, gateways and Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from redis.asyncio import Redis

from app.dispatch.inprocess import InProcessTransport
from app.dispatch.redis import RedisGatewayTransport
from app.dispatch.transport import Entry, GatewayTransport
from node.agent.redis import RedisNodeTransport
from node.agent.transport import Claim, Delivery, NodeTransport
from wire import keys
from wire.execution import RunResult, RunSpec
from wire.messages import DeliveryRef, Finished, Job, NodeReport, Started


@dataclass
class Pair:
    gateway: GatewayTransport
    node: Callable[[], NodeTransport]  #: a node's transport (a new one per node process)
    kind: str


@pytest.fixture(params=["inprocess", pytest.param("redis", marks=pytest.mark.redis)])
async def pair(request: pytest.FixtureRequest) -> AsyncIterator[Pair]:
    if request.param == "inprocess":
        transport = InProcessTransport(dead_after_s=0.5)
        yield Pair(transport, lambda: transport, "inprocess")
        return
    redis = Redis.from_url(request.getfixturevalue("redis_url"), decode_responses=True)
    gateway = RedisGatewayTransport(redis, dead_after_s=0.5, poll_s=0.1)
    try:
        yield Pair(
            gateway, lambda: RedisNodeTransport(redis, dead_after_s=0.5, poll_s=0.1), "redis"
        )
    finally:
        await gateway.close()
        await redis.aclose()


def job(n: int, reply_to: str, *, claim: str = "c1", attempt: int = 1) -> Job:
    return Job(
        invocation_id=f"inv_{n}",
        tenant_id="ten_1",
        runtime="fake",
        spec=RunSpec(language="fake", code="{}"),
        claim=claim,
        attempt=attempt,
        reply_to=reply_to,
        enqueued_at=time.time(),
    )


def report(node_id: str, incarnation: str = "i1") -> NodeReport:
    now = time.time()
    return NodeReport(
        node_id=node_id,
        incarnation=incarnation,
        runtimes={"fake": ["fake"]},
        slots=2,
        slots_free=2,
        memory_mb=1024,
        memory_free_mb=1024,
        started_at=now,
        reported_at=now,
    )


async def take(node: NodeTransport, node_id: str, count: int = 1) -> list[Delivery]:
    stream = node.deliveries(node_id, ["fake"], lambda: count)
    try:
        return [await asyncio.wait_for(anext(stream), 5) for _ in range(count)]
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


async def nothing_for(node: NodeTransport, node_id: str, seconds: float = 0.3) -> bool:
    stream = node.deliveries(node_id, ["fake"], lambda: 1)
    try:
        await asyncio.wait_for(anext(stream), seconds)
    except TimeoutError:
        return True
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    return False


async def read(gateway: GatewayTransport, count: int) -> list[Entry]:
    got: list[Entry] = []
    stream = gateway.results()
    try:
        while len(got) < count:
            got += await asyncio.wait_for(anext(stream), 5)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    return got


def started(node_id: str, j: Job) -> Started:
    return Started(
        invocation_id=j.invocation_id, claim=j.claim, node_id=node_id, started_at=time.time()
    )


def finished(node_id: str, delivery: Delivery) -> Finished:
    j = delivery.job
    return Finished(
        invocation_id=j.invocation_id,
        claim=j.claim,
        attempt=j.attempt,
        node_id=node_id,
        started_at=time.time(),
        finished_at=time.time(),
        queue_ms=1.0,
        result=RunResult(),
        delivery=delivery.ref,
    )


async def test_dispatch_claim_report_settle(pair: Pair) -> None:
    gw, node = pair.gateway, pair.node()
    sent = job(1, gw.gateway_id)
    await gw.dispatch(sent, node_id=None, hold_s=60, queue_s=60)
    (marker,) = (await gw.markers(["inv_1", "inv_x"])).values()
    assert (marker.claim, marker.placed_on, marker.claimed_by) == ("c1", None, None)

    (delivery,) = await take(node, "node-a")
    assert delivery.job == sent
    assert await node.claim(delivery, started("node-a", sent), incarnation="i1") is Claim.OK
    assert (await gw.markers(["inv_1"]))["inv_1"].claimed_by == "node-a"
    await node.finish(delivery, finished("node-a", delivery))

    events = await read(gw, 2)
    assert [type(e.event).__name__ for e in events] == ["Started", "Finished"]
    assert await gw.markers(["inv_1"]) != {}  # nothing is settled until the recorder says so
    await gw.settle(events)
    assert await gw.markers(["inv_1"]) == {}
    if pair.kind == "redis":
        redis: Any = gw._redis  # type: ignore[attr-defined]
        assert await redis.xlen(keys.results(gw.gateway_id)) == 0  # read and trimmed
        assert await redis.xlen(keys.jobs("fake", "ten_1")) == 0


async def test_a_token_is_claimed_once_and_only_while_current(pair: Pair) -> None:
    gw, node = pair.gateway, pair.node()
    first = job(2, gw.gateway_id, claim="old")
    await gw.dispatch(first, node_id=None, hold_s=60, queue_s=60)
    (delivery,) = await take(node, "node-a")
    assert await node.claim(delivery, started("node-a", first), incarnation="i1") is Claim.OK
    # The same call again (its reply was lost): still its claim. Another node, a restarted
    # one, or a duplicate delivery of the same Job (a retried XADD): taken.
    assert await node.claim(delivery, started("node-a", first), incarnation="i1") is Claim.OK
    assert await node.claim(delivery, started("node-b", first), incarnation="i9") is Claim.TAKEN
    assert await node.claim(delivery, started("node-a", first), incarnation="i2") is Claim.TAKEN
    duplicate = Delivery(job=first, ref=DeliveryRef(stream=delivery.ref.stream, entry_id="9-9"))
    assert await node.claim(duplicate, started("node-a", first), incarnation="i1") is Claim.TAKEN
    # Handed out again: the old token is stale, the new one free.
    second = job(2, gw.gateway_id, claim="new", attempt=2)
    await gw.dispatch(second, node_id=None, hold_s=60, queue_s=60)
    assert await node.claim(delivery, started("node-a", first), incarnation="i1") is Claim.STALE
    (again,) = await take(node, "node-b")
    assert again.job.claim == "new"
    assert await node.claim(again, started("node-b", second), incarnation="i9") is Claim.OK
    # A late Finished of the old token settles its entries but not the new claim's marker.
    await node.finish(delivery, finished("node-a", delivery))
    events = await read(gw, 3)
    late = [e for e in events if isinstance(e.event, Finished)]
    await gw.settle(late)
    assert (await gw.markers(["inv_2"]))["inv_2"].claim == "new"
    # No marker at all: settled already, or lost.
    unknown = Delivery(job=job(3, gw.gateway_id), ref=again.ref)
    assert await node.claim(unknown, started("node-b", unknown.job), incarnation="i9") is Claim.GONE


async def test_placed_work_goes_to_its_node_overflow_to_any(pair: Pair) -> None:
    gw, node = pair.gateway, pair.node()
    await gw.dispatch(job(4, gw.gateway_id), node_id="node-b", hold_s=60, queue_s=60)
    assert await nothing_for(node, "node-a")
    (placed,) = await take(node, "node-b")
    assert placed.job.invocation_id == "inv_4"
    assert (await gw.markers(["inv_4"]))["inv_4"].placed_on == "node-b"
    await gw.dispatch(job(5, gw.gateway_id), node_id=None, hold_s=60, queue_s=60)
    assert (await gw.backlog(["fake"]))["fake"] == 1
    (overflow,) = await take(node, "node-a")
    assert overflow.job.invocation_id == "inv_5"


async def test_a_tenant_that_queues_behind_a_backlog_is_taken_next(pair: Pair) -> None:
    """Overflow is taken one tenant after another in a ring of tenants: one that queues
    while a node works through another's backlog is the next one taken, wherever its
    name falls in the ring (``ten_a`` sorts before ``ten_b``)."""
    gw, node = pair.gateway, pair.node()
    for n in range(3):
        busy = job(10 + n, gw.gateway_id).model_copy(update={"tenant_id": "ten_b"})
        await gw.dispatch(busy, node_id=None, hold_s=60, queue_s=60)
    stream = node.deliveries("node-a", ["fake"], lambda: 1)
    try:
        first = await asyncio.wait_for(anext(stream), 5)
        assert first.job.tenant_id == "ten_b"
        quiet = job(20, gw.gateway_id).model_copy(update={"tenant_id": "ten_a"})
        await gw.dispatch(quiet, node_id=None, hold_s=60, queue_s=60)
        await asyncio.sleep(0.3)  # past the node's refresh of the set of tenants
        second = await asyncio.wait_for(anext(stream), 5)
        assert second.job.invocation_id == "inv_20"
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


async def test_catalogue_and_dead_nodes(pair: Pair) -> None:
    gw, node = pair.gateway, pair.node()
    await node.announce(report("node-a"))
    await node.announce(report("node-b"))
    assert sorted(r.node_id for r in await gw.catalogue()) == ["node-a", "node-b"]
    await node.withdraw("node-b")
    assert [r.node_id for r in await gw.catalogue()] == ["node-a"]
    for _ in range(6):  # node-a stops reporting; the gateway goes on reading
        await asyncio.sleep(0.1)
        await gw.catalogue()
    await asyncio.sleep(0.05)
    assert await gw.catalogue() == []
    assert await gw.dead_nodes() == ["node-a"]
    await gw.forget_node("node-a", ["fake"])
    assert await gw.dead_nodes() == []


@pytest.mark.redis
async def test_a_restarted_node_takes_back_what_it_had_read(redis_url: str) -> None:
    redis = Redis.from_url(redis_url, decode_responses=True)
    gw = RedisGatewayTransport(redis, dead_after_s=0.5, poll_s=0.1)
    try:
        await gw.dispatch(job(6, gw.gateway_id), node_id="node-a", hold_s=60, queue_s=60)
        before = RedisNodeTransport(redis, dead_after_s=0.5, poll_s=0.1)
        (read_once,) = await take(before, "node-a")  # read, then the process dies
        after = RedisNodeTransport(redis, dead_after_s=0.5, poll_s=0.1)
        (again,) = await take(after, "node-a")
        assert again.ref == read_once.ref
    finally:
        await redis.aclose()


@pytest.mark.redis
async def test_a_dead_gateways_results_are_adopted(redis_url: str) -> None:
    redis = Redis.from_url(redis_url, decode_responses=True)
    dead = RedisGatewayTransport(redis, dead_after_s=0.3, poll_s=0.1)
    alive = RedisGatewayTransport(redis, dead_after_s=0.3, poll_s=0.1)
    node = RedisNodeTransport(redis, dead_after_s=0.3, poll_s=0.1)
    try:
        await dead.keep_alive()
        for n in (7, 8):
            await dead.dispatch(job(n, dead.gateway_id), node_id=None, hold_s=60, queue_s=60)
        deliveries = await take(node, "node-a", 2)
        for d in deliveries:
            assert await node.claim(d, started("node-a", d.job), incarnation="i") is Claim.OK
        await read(dead, 1)  # the dead gateway read something and never settled it
        for d in deliveries:
            await node.finish(d, finished("node-a", d))
        await asyncio.sleep(0.4)
        assert await alive.dead_gateways() == [dead.gateway_id]
        adopted: list[Entry] = []
        while batch := await alive.adopt(dead.gateway_id):
            adopted += batch
            await alive.settle(batch)
        assert sorted(type(e.event).__name__ for e in adopted) == [
            "Finished",
            "Finished",
            "Started",
            "Started",
        ]
        assert await alive.markers(["inv_7", "inv_8"]) == {}
        await alive.forget_gateway(dead.gateway_id)
        assert await alive.dead_gateways() == []
    finally:
        await redis.aclose()


@pytest.mark.redis
async def test_work_flows_again_after_redis_loses_everything(redis_url: str) -> None:
    redis = Redis.from_url(redis_url, decode_responses=True)
    gw = RedisGatewayTransport(redis, dead_after_s=0.5, poll_s=0.1)
    node = RedisNodeTransport(redis, dead_after_s=0.5, poll_s=0.1)
    try:
        await gw.dispatch(job(9, gw.gateway_id), node_id="node-a", hold_s=60, queue_s=60)
        await take(node, "node-a")
        await read_nothing(gw)
        # restarted without persistence: everything of this test's database, the one the
        # transports use (FLUSHALL emptied every database: those of the other xdist workers)
        await redis.flushdb()
        await gw.dispatch(job(10, gw.gateway_id), node_id="node-a", hold_s=60, queue_s=60)
        (delivery,) = await take(node, "node-a")
        assert delivery.job.invocation_id == "inv_10"
        assert await node.claim(delivery, started("node-a", delivery.job), incarnation="i") is (
            Claim.OK
        )
        await redis.flushdb()
        await node.finish(delivery, finished("node-a", delivery))  # recreates the stream
        (entry,) = await read(gw, 1)
        assert isinstance(entry.event, Finished)
    finally:
        await redis.aclose()


async def read_nothing(gw: GatewayTransport) -> None:
    """Open the results stream (making its group) and find nothing on it."""
    stream = gw.results()
    try:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(stream), 0.3)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


@pytest.mark.redis
async def test_a_delivery_whose_reply_was_lost_is_found_again(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis delivered an entry to the node but the reply never reached it (a read that
    failed and was retried): the entry sits in the node's pending list; the node's sweep
    finds it instead of leaving the execution unclaimed forever."""
    import node.agent.redis as node_redis

    monkeypatch.setattr(node_redis, "SWEEP_S", 0.1)
    monkeypatch.setattr(node_redis, "SWEEP_IDLE_MS", 100)
    redis = Redis.from_url(redis_url, decode_responses=True)
    gw = RedisGatewayTransport(redis, dead_after_s=0.5, poll_s=0.1)
    node = RedisNodeTransport(redis, dead_after_s=0.5, poll_s=0.1)
    stream = node.deliveries("node-a", ["fake"], lambda: 1)
    try:
        await gw.dispatch(job(11, gw.gateway_id), node_id="node-a", hold_s=60, queue_s=60)
        first = await asyncio.wait_for(anext(stream), 5)
        await gw.dispatch(job(12, gw.gateway_id), node_id="node-a", hold_s=60, queue_s=60)
        # The lost reply: Redis hands the entry to node-a, and node-a never sees it.
        await redis.xreadgroup(keys.NODE_GROUP, "node-a", {keys.jobs_for_node("node-a"): ">"})
        found = await asyncio.wait_for(anext(stream), 5)
        assert (first.job.invocation_id, found.job.invocation_id) == ("inv_11", "inv_12")
        with pytest.raises(TimeoutError):  # and the one it has is not handed to it twice
            await asyncio.wait_for(anext(stream), 0.5)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
        await redis.aclose()


@pytest.mark.redis
async def test_what_a_dead_node_read_and_never_claimed_is_put_back(redis_url: str) -> None:
    """Overflow Jobs wait for any node; one that a node read and died before claiming
    would wait in that node's pending list forever: the reconciler puts it back."""
    redis = Redis.from_url(redis_url, decode_responses=True)
    gw = RedisGatewayTransport(redis, dead_after_s=0.5, poll_s=0.1)
    node = RedisNodeTransport(redis, dead_after_s=0.5, poll_s=0.1)
    try:
        await node.announce(report("node-a"))
        for n, claim in ((13, "c"), (14, "c")):
            await gw.dispatch(
                job(n, gw.gateway_id, claim=claim), node_id=None, hold_s=60, queue_s=60
            )
        read = await take(node, "node-a", 2)
        claimed = next(d for d in read if d.job.invocation_id == "inv_14")
        assert (
            await node.claim(claimed, started("node-a", claimed.job), incarnation="i") is Claim.OK
        )
        await asyncio.sleep(0.6)  # node-a dies holding both
        assert await gw.dead_nodes() == ["node-a"]
        assert await gw.release("node-a", ["fake"]) == 1  # the claimed one is the reconciler's
        (again,) = await take(node, "node-b")
        assert again.job.invocation_id == "inv_13"
        assert await node.claim(again, started("node-b", again.job), incarnation="j") is Claim.OK
        assert await gw.release("node-a", ["fake"]) == 0
    finally:
        await redis.aclose()
