"""The node agent over a transport: it runs only what it claimed, keeps trying to report
what it ran, announces its capacity, and serves its own /healthz and /metrics."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from app.dispatch.inprocess import InProcessTransport
from app.dispatch.transport import Entry
from node.agent.agent import NodeAgent
from node.agent.http import serving
from node.agent.memory import MemoryGuard, available_mb
from node.agent.transport import Delivery
from node.fncall.fake import FakeFnBackend
from node.pools.accounting import IdleCapacity
from node.settings import NodeSettings
from wire.execution import RunSpec
from wire.messages import Finished, Job, PoolUsage, Started


class FlakyTransport(InProcessTransport):
    """Fails the first ``failures`` finishes, as a Redis outage would."""

    def __init__(self, failures: int) -> None:
        super().__init__(dead_after_s=5)
        self.failures = failures
        self.ready_answer = True

    async def finish(self, delivery: Delivery, finished: Finished) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("redis is down")
        await super().finish(delivery, finished)

    async def ready(self) -> bool:
        return self.ready_answer


class IdleFake(FakeFnBackend):
    def stats(self) -> dict[str, int]:
        return {"warm": 3, "busy": 1, "starting": 2}

    def idle_capacity(self) -> dict[str, IdleCapacity]:
        return {
            "fake/fake": IdleCapacity(
                instance_seconds=30.0, memory_mb_seconds=300.0, starts=2, start_cpu_ms=75.0
            )
        }


def settings(tmp_path: Path) -> NodeSettings:
    return NodeSettings(
        dev_mode=True,
        node_id="node-t",
        data_dir=tmp_path,
        runtimes=["fake"],
        node_slots=2,
        heartbeat_seconds=0.1,
        node_dead_after_seconds=1.0,
        node_memory_mb=2048,
        node_port=None,
    )


@pytest.fixture
async def transport() -> FlakyTransport:
    return FlakyTransport(failures=0)


@pytest.fixture
async def agent(tmp_path: Path, transport: FlakyTransport) -> AsyncIterator[NodeAgent]:
    node = NodeAgent(settings(tmp_path), transport, {"fake": IdleFake()}, usage_period_s=0.2)
    await node.start()
    try:
        yield node
    finally:
        await node.close()


def job(n: int, *, claim: str = "c", program: dict[str, object] | None = None) -> Job:
    return Job(
        invocation_id=f"inv_{n}",
        tenant_id="t",
        runtime="fake",
        spec=RunSpec(language="fake", code=json.dumps(program or {"stdout": f"out{n}"})),
        claim=claim,
        reply_to="local",
        enqueued_at=time.time(),
    )


async def events(transport: InProcessTransport, count: int, *, pools: bool = False) -> list[Entry]:
    """The next ``count`` events; pool usage events are skipped unless ``pools``."""
    stream = transport.results()
    got: list[Entry] = []
    try:
        while len(got) < count:
            batch = await asyncio.wait_for(anext(stream), 5)
            got += [e for e in batch if pools or not isinstance(e.event, PoolUsage)]
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    return got


async def test_runs_what_it_claims_and_reports_it(
    agent: NodeAgent, transport: FlakyTransport
) -> None:
    await transport.dispatch(job(1), node_id="node-t", hold_s=60, queue_s=60)
    started, finished = [e.event for e in await events(transport, 2)]
    assert isinstance(started, Started) and started.node_id == "node-t"
    assert isinstance(finished, Finished)
    assert finished.result.run is not None and finished.result.run.stdout == "out1"
    assert (finished.claim, finished.attempt) == ("c", 1)
    backend = agent.backends["fake"]
    assert isinstance(backend, FakeFnBackend) and backend.calls == [("t", "inv_1")]


async def test_a_superseded_hand_out_is_not_run(
    agent: NodeAgent, transport: FlakyTransport
) -> None:
    await transport.dispatch(job(2, claim="old"), node_id="node-t", hold_s=60, queue_s=60)
    # Before the node takes it, the execution is handed out again under a new token.
    await transport.dispatch(job(2, claim="new"), node_id="other", hold_s=60, queue_s=60)
    await asyncio.sleep(0.3)
    backend = agent.backends["fake"]
    assert isinstance(backend, FakeFnBackend) and backend.calls == []
    assert agent.metrics.claims.labels("stale")._value.get() == 1


async def test_a_result_it_cannot_report_is_retried_not_dropped(
    agent: NodeAgent, transport: FlakyTransport
) -> None:
    transport.failures = 3
    await transport.dispatch(job(3), node_id="node-t", hold_s=60, queue_s=60)
    kinds = [type(e.event).__name__ for e in await events(transport, 2)]
    assert kinds == ["Started", "Finished"]
    assert agent.metrics.transport_retries.labels("finish")._value.get() == 3


async def test_it_announces_capacity_and_reports_idle_pools(
    agent: NodeAgent, transport: FlakyTransport
) -> None:
    await transport.dispatch(
        job(4, program={"sleep": 0.5}), node_id="node-t", hold_s=60, queue_s=60
    )
    await asyncio.sleep(0.3)
    (busy,) = await transport.catalogue()
    assert (busy.node_id, busy.incarnation) == ("node-t", agent.incarnation)
    assert (busy.slots, busy.slots_free, busy.memory_mb) == (2, 1, 2048)
    assert busy.memory_free_mb == 2048 - 512
    assert busy.pools == {"fake": {"warm": 3, "busy": 1, "starting": 2}}
    seen = await events(transport, 4, pools=True)
    usage = [e.event for e in seen if isinstance(e.event, PoolUsage)]
    assert usage and usage[0].pool == "fake/fake" and usage[0].idle_instance_seconds == 30.0
    assert usage[0].start_cpu_ms == 75.0


async def test_its_own_healthz_and_metrics(agent: NodeAgent, transport: FlakyTransport) -> None:
    await transport.dispatch(job(5), node_id="node-t", hold_s=60, queue_s=60)
    await events(transport, 2)
    async with serving(agent, "127.0.0.1", 0) as address, httpx.AsyncClient() as http:
        health = await http.get(f"http://{address}/healthz")
        assert health.status_code == 200
        assert health.json()["node_id"] == "node-t"
        metrics = (await http.get(f"http://{address}/metrics")).text
        assert 'corral_node_executions_total{outcome="succeeded",runtime="fake"} 1.0' in metrics
        assert 'corral_node_claims_total{outcome="ok"} 1.0' in metrics
        assert (await http.get(f"http://{address}/readyz")).status_code == 200
        transport.ready_answer = False  # Redis is down: not ready, but alive
        assert (await http.get(f"http://{address}/readyz")).status_code == 503
        assert (await http.get(f"http://{address}/healthz")).status_code == 200


async def test_no_new_work_while_the_host_is_short_of_memory(tmp_path: Path) -> None:
    """The memory guard, not the slot count, holds work back: a Job waits in its queue
    while available memory is under the reserve, and runs once memory comes back."""
    available = [100]
    transport = FlakyTransport(failures=0)
    guard = MemoryGuard(reserve_mb=500, read=lambda: available[0])
    node = NodeAgent(settings(tmp_path), transport, {"fake": IdleFake()}, memory=guard)
    await node.start()
    try:
        await transport.dispatch(job(6), node_id="node-t", hold_s=60, queue_s=60)
        await asyncio.sleep(0.3)
        backend = node.backends["fake"]
        assert isinstance(backend, FakeFnBackend) and backend.calls == []
        assert await transport.waiting("node-t") == 1
        assert node.report().memory_free_mb == 0
        available[0] = 4000
        kinds = [type(e.event).__name__ for e in await events(transport, 2)]
        assert kinds == ["Started", "Finished"] and backend.calls == [("t", "inv_6")]
        assert guard.held_seconds > 0
    finally:
        await node.close()


def test_a_memory_reading_is_reused_for_its_max_age() -> None:
    reads, now = [], [0.0]

    def read() -> int:
        reads.append(now[0])
        return 1000

    guard = MemoryGuard(reserve_mb=500, read=read, max_age_s=0.01, clock=lambda: now[0])
    assert not guard.short() and not guard.short()
    assert reads == [0.0]  # the second check reused the first reading
    now[0] = 0.011
    assert not guard.short()
    assert reads == [0.0, 0.011]


def test_available_memory_is_read_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:   2048000 kB\n")
    assert available_mb(meminfo) == 2000
    assert available_mb() > 0  # this host's


@pytest.mark.slow
async def test_an_idle_connection_outlives_the_clients_own_expiry(agent: NodeAgent) -> None:
    """The node keeps an idle connection longer than a client's pool does (5 s for httpx
    and requests by default), so no request is ever sent on a connection the node is
    closing at that moment (a gateway's burst met that: "Server disconnected")."""
    async with serving(agent, "127.0.0.1", 0) as address:
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        request = f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
        try:
            for turn in range(2):
                writer.write(request)
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
                assert head.startswith(b"HTTP/1.1 200")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                if turn == 0:
                    await asyncio.sleep(6)  # past uvicorn's default keep-alive of 5 s
                    assert not reader.at_eof(), "the node closed an idle connection after 5 s"
        finally:
            writer.close()
