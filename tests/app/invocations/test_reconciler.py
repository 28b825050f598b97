"""The reconciler's verdicts, one situation each, against a real database and transport
(SQLite with the in-process transport; PostgreSQL with Redis)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError
from sqlalchemy.ext.asyncio import async_sessionmaker

from app.db import invocations as inv
from app.db import tenants
from app.db.engine import make_engine, make_sessionmaker
from app.db.migrate import upgrade
from app.db.models import Invocation
from app.db.transactions import transactions_for
from app.db.writer import BatchWriter
from app.dispatch.inprocess import InProcessTransport
from app.dispatch.redis import RedisGatewayTransport
from app.dispatch.transport import GatewayTransport
from app.failpoints import Failpoints
from app.invocations.reconciler import FORGET_AFTER_S, NEVER_STARTED_EXTRA, Policy, Reconciler
from app.invocations.recorder import Recorder
from app.invocations.service import Timing
from app.invocations.waiters import Waiters
from app.metrics import Metrics
from app.quotas.spec import QuotaLimits
from app.settings import Settings
from node.agent.redis import RedisNodeTransport
from node.agent.transport import Claim, Delivery, NodeTransport
from wire.execution import RunLimits, RunSpec
from wire.messages import Job, NodeReport, Started


@dataclass
class World:
    sessions: async_sessionmaker[Any]
    writer: BatchWriter
    gateway: GatewayTransport
    node: NodeTransport
    tenant_id: str
    clock: list[float]

    def reconciler(self, *, max_attempts: int = 2, stuck_grace_s: float = 30.0) -> Reconciler:
        timing = Timing(wait_grace_s=1.0, hold_s=120.0, queue_s=600.0)
        return Reconciler(
            sessions=self.sessions,
            writer=self.writer,
            transport=self.gateway,
            recorder=Recorder(
                transport=self.gateway,
                writer=self.writer,
                waiters=Waiters(),
                metrics=Metrics(),
                failpoints=Failpoints({}),
            ),
            metrics=Metrics(),
            policy=Policy(
                grace_s=0.0,
                stuck_grace_s=stuck_grace_s,
                max_attempts=max_attempts,
                timing=timing,
            ),
            clock=lambda: self.clock[0],
        )

    def job(self, n: int) -> Job:
        return Job(
            invocation_id=f"inv_{n}",
            tenant_id=self.tenant_id,
            runtime="fake",
            spec=RunSpec(language="fake", code="{}", limits=RunLimits(run_timeout_s=5)),
            claim=f"c{n}",
            reply_to=self.gateway.gateway_id,
            enqueued_at=time.time(),
        )

    async def create(self, n: int, *, dispatch_to: str | bool | None = False) -> Job:
        """A committed row with its Job; dispatched to a node (or overflow: None) if asked."""
        job = self.job(n)
        await self.writer.write(
            inv.Create(
                invocation_id=job.invocation_id,
                tenant_id=self.tenant_id,
                kind="run",
                runtime="fake",
                language="fake",
                request={},
                claim=job.claim,
                job=job.model_dump_json(),
            )
        )
        if dispatch_to is not False:
            node = dispatch_to if isinstance(dispatch_to, str) else None
            await self.gateway.dispatch(job, node_id=node, hold_s=120, queue_s=600)
        return job

    async def claim(self, job: Job, node_id: str, incarnation: str = "i1") -> None:
        """``node_id`` takes and claims ``job`` (and its Started is recorded)."""
        stream = self.node.deliveries(node_id, ["fake"], lambda: 8)
        try:
            while True:
                delivery: Delivery = await anext(stream)
                if delivery.job.invocation_id == job.invocation_id:
                    break
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        start = Started(
            invocation_id=job.invocation_id,
            claim=job.claim,
            node_id=node_id,
            started_at=time.time(),
        )
        assert await self.node.claim(delivery, start, incarnation=incarnation) is Claim.OK
        await self.writer.write(
            inv.MarkRunning(
                job.invocation_id,
                job.claim,
                node_id=node_id,
                started_at=inv.epoch(start.started_at),
            )
        )

    async def alive(self, node_id: str, incarnation: str = "i1") -> None:
        now = time.time()
        await self.node.announce(
            NodeReport(
                node_id=node_id,
                incarnation=incarnation,
                runtimes={"fake": ["fake"]},
                slots=4,
                slots_free=4,
                memory_mb=1024,
                memory_free_mb=1024,
                started_at=now - 60,
                reported_at=now,
            )
        )

    async def row(self, n: int) -> Invocation:
        async with self.sessions() as session:
            found = await session.get(Invocation, f"inv_{n}")
            assert found is not None
            return found


@pytest.fixture(
    params=["embedded", pytest.param("cluster", marks=[pytest.mark.postgres, pytest.mark.redis])]
)
def backing(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    if request.param == "embedded":
        return {"db": f"sqlite+aiosqlite:///{tmp_path}/r.db"}
    db = Settings(dev_mode=True, database_url=request.getfixturevalue("postgres_url"))
    return {"db": db.resolved_database_url, "redis": request.getfixturevalue("redis_url")}


@pytest.fixture
async def world(backing: dict[str, str]) -> AsyncIterator[World]:
    engine = make_engine(backing["db"])
    await upgrade(engine)
    sessions = make_sessionmaker(engine)
    writer = BatchWriter(transactions_for(backing["db"], sessions))
    await writer.start()
    redis = Redis.from_url(backing["redis"], decode_responses=True) if "redis" in backing else None
    gateway: GatewayTransport
    node: NodeTransport
    if redis is None:
        gateway = node = InProcessTransport(dead_after_s=30)
    else:
        gateway = RedisGatewayTransport(redis, dead_after_s=30, poll_s=0.1)
        node = RedisNodeTransport(redis, dead_after_s=30, poll_s=0.1)
    async with sessions.begin() as session:
        tenant, _k, _p = await tenants.create_tenant(session, name="r", quota=QuotaLimits())
    try:
        yield World(sessions, writer, gateway, node, tenant.id, [time.time()])
    finally:
        await writer.close()
        if redis is not None:
            await redis.aclose()
        await engine.dispose()


async def test_a_job_never_sent_is_sent_under_a_new_claim(world: World) -> None:
    await world.create(1)  # committed; the gateway died before dispatching
    done = await world.reconciler().reconcile()
    assert done.reissued == ["inv_1"] and done.failed == []
    row = await world.row(1)
    assert (row.status, row.attempts) == ("queued", 2)
    assert row.claim != "c1"
    marker = (await world.gateway.markers(["inv_1"]))["inv_1"]
    assert marker.claim == row.claim and marker.placed_on is None
    # ... and a node takes it from the overflow stream.
    await world.alive("node-a")
    reissued = Job.model_validate_json(row.job or "").model_copy(update={"claim": row.claim})
    await world.claim(reissued, "node-a")


async def test_work_on_a_live_node_or_waiting_for_one_is_left_alone(world: World) -> None:
    await world.alive("node-a")
    running = await world.create(1, dispatch_to="node-a")
    await world.claim(running, "node-a")
    await world.create(2, dispatch_to=None)  # waiting on the overflow stream
    await world.create(3, dispatch_to="node-a")  # placed on a live node, not yet taken
    done = await world.reconciler().reconcile()
    assert (done.judged, done.reissued, done.failed) == (3, [], [])


async def test_work_a_dead_node_held_is_handed_out_again_then_failed_as_lost(world: World) -> None:
    job = await world.create(1, dispatch_to="node-x")
    await world.claim(job, "node-x")  # node-x never reports: it is dead
    done = await world.reconciler(max_attempts=2).reconcile()
    assert done.reissued == ["inv_1"]
    row = await world.row(1)
    assert (row.status, row.attempts, row.node_id) == ("queued", 2, None)

    again = Job.model_validate_json(row.job or "").model_copy(
        update={"claim": row.claim, "attempt": 2}
    )
    await world.claim(again, "node-y")  # and dies too
    done = await world.reconciler(max_attempts=2).reconcile()
    assert done.failed == ["inv_1"]
    row = await world.row(1)
    assert row.status == "errored" and row.error is not None
    assert row.error.startswith("lost: node node-y died running it")
    assert row.job is None


async def test_a_restarted_node_does_not_vouch_for_its_previous_incarnation(world: World) -> None:
    job = await world.create(1, dispatch_to="node-a")
    await world.claim(job, "node-a", incarnation="before")
    await world.alive("node-a", incarnation="after")  # same id, new process
    done = await world.reconciler().reconcile()
    assert done.reissued == ["inv_1"]


async def test_work_placed_on_a_node_that_died_before_taking_it(world: World) -> None:
    await world.create(1, dispatch_to="node-gone")
    done = await world.reconciler(max_attempts=1).reconcile()
    assert done.reissued == ["inv_1"]  # it never started: no attempt was spent running it


async def test_stuck_work_on_a_live_node_is_handed_out_again(world: World) -> None:
    await world.alive("node-a")
    job = await world.create(1, dispatch_to="node-a")
    await world.claim(job, "node-a")
    world.clock[0] = time.time() + job.deadline_seconds + 31
    await world.alive("node-a")
    done = await world.reconciler(stuck_grace_s=30).reconcile()
    assert done.reissued == ["inv_1"]


async def test_a_running_row_whose_marker_vanished_waits_for_its_live_node(world: World) -> None:
    """Redis lost the marker, but the node that started it still runs in the same process:
    its result may still come, until the limits and the grace run out."""
    await world.alive("node-a")
    job = await world.create(1, dispatch_to="node-a")
    await world.claim(job, "node-a")
    await forget_marker(world, "inv_1")
    assert (await world.reconciler().reconcile()).reissued == []
    world.clock[0] = time.time() + job.deadline_seconds + 31
    assert (await world.reconciler(stuck_grace_s=30).reconcile()).reissued == ["inv_1"]


async def test_never_started_work_is_not_handed_out_forever(world: World) -> None:
    await world.create(1)
    reconciler = world.reconciler(max_attempts=1)
    for _ in range(1 + NEVER_STARTED_EXTRA - 1):
        assert (await reconciler.reconcile()).reissued == ["inv_1"]
        await forget_marker(world, "inv_1")  # and the hand-out is lost again
    done = await reconciler.reconcile()
    assert done.failed == ["inv_1"]
    row = await world.row(1)
    assert row.attempts == 1 + NEVER_STARTED_EXTRA
    assert row.error == "lost: its hand-out never reached a node; not run again"


async def test_a_node_that_missed_one_report_long_after_an_earlier_gap_is_not_forgotten(
    world: World,
) -> None:
    """Only a node dead without a break for FORGET_AFTER_S is forgotten: one seen dead
    once, then reporting again, starts afresh. Forgetting deletes the node's stream,
    so a live node would lose the Jobs placed on it."""
    reconciler = world.reconciler()
    await world.alive("node-a")
    await miss_reports(world, "node-a")
    await reconciler.reconcile()  # seen dead ...
    await world.alive("node-a")
    await reconciler.reconcile()  # ... and alive again
    world.clock[0] += FORGET_AFTER_S + 1
    await world.gateway.dispatch(world.job(1), node_id="node-a", hold_s=120, queue_s=600)
    await miss_reports(world, "node-a")  # one report late, long after the first gap
    await reconciler.reconcile()
    assert await world.node.waiting("node-a") == 1, "the live node's stream was deleted"
    # a node dead without a break that long is forgotten
    world.clock[0] += FORGET_AFTER_S + 1
    await reconciler.reconcile()
    assert await world.node.waiting("node-a") == 0
    assert "node-a" not in await world.gateway.dead_nodes()


@pytest.mark.parametrize(
    "backing",
    [pytest.param("cluster", marks=[pytest.mark.postgres, pytest.mark.redis])],
    indirect=True,  # embedded mode has one gateway, never dead
)
async def test_a_gateway_that_missed_one_beat_long_after_an_earlier_gap_is_not_forgotten(
    world: World,
) -> None:
    """The same for gateways: forgetting one deletes its results stream, where nodes put
    the results its callers wait for."""
    assert isinstance(world.gateway, RedisGatewayTransport)
    from wire import keys

    redis = world.gateway._redis  # type: ignore[attr-defined]
    other = RedisGatewayTransport(redis, dead_after_s=30)
    reconciler = world.reconciler()

    async def beat_missed() -> None:
        await redis.delete(keys.gateway(other.gateway_id))

    with contextlib.suppress(ResponseError):  # the recorders' group, as a gateway makes it
        await redis.xgroup_create(keys.EVENTS, keys.RECORDER_GROUP, id="0", mkstream=True)
    await other.keep_alive()
    await redis.xadd(keys.results(other.gateway_id), {"event": "{}"})
    await beat_missed()
    await reconciler.reconcile()  # seen dead ...
    await other.keep_alive()
    await reconciler.reconcile()  # ... and alive again
    world.clock[0] += FORGET_AFTER_S + 1
    await beat_missed()  # one beat late, long after the first gap
    await reconciler.reconcile()
    assert await redis.exists(keys.results(other.gateway_id)), "its results stream was deleted"
    world.clock[0] += FORGET_AFTER_S + 1
    await reconciler.reconcile()
    assert not await redis.exists(keys.results(other.gateway_id))


async def miss_reports(world: World, node_id: str) -> None:
    """``node_id``'s last report expires now, as if it had stopped reporting."""
    if isinstance(world.node, InProcessTransport):
        report, _expiry = world.node._reports[node_id]  # type: ignore[attr-defined]
        world.node._reports[node_id] = (report, float("-inf"))  # type: ignore[attr-defined]
    else:
        from wire import keys

        await world.node._redis.delete(keys.node(node_id))  # type: ignore[attr-defined]


async def forget_marker(world: World, invocation_id: str) -> None:
    if isinstance(world.gateway, InProcessTransport):
        world.gateway._markers.pop(invocation_id)  # type: ignore[attr-defined]
    else:
        from wire import keys

        await world.gateway._redis.delete(keys.inflight(invocation_id))  # type: ignore[attr-defined]
