"""Placement over the catalogue of node reports: warm inventory first, then free room;
overflow when every node is busy; typed refusals."""

from __future__ import annotations

import random
import time

import pytest

from app.dispatch.inprocess import InProcessTransport
from app.errors import NoCapacity, UnsupportedRuntime
from app.placement.best_of_k import BestOfK
from app.placement.catalogue import Catalogue
from wire.execution import RunSpec
from wire.messages import Job, NodeReport, pool_key


def node(node_id: str, *, free: int = 4, warm: dict[str, int] | None = None) -> NodeReport:
    now = time.time()
    return NodeReport(
        node_id=node_id,
        incarnation="i",
        runtimes={"nsjail": ["python", "bash"], "wasm": ["wasm-python"]},
        slots=4,
        slots_free=free,
        memory_mb=4096,
        memory_free_mb=4096,
        warm=warm or {},
        started_at=now,
        reported_at=now,
    )


async def placer(*reports: NodeReport, k: int = 3, max_queued: int = 10) -> BestOfK:
    transport = InProcessTransport(dead_after_s=60)
    for report in reports:
        await transport.announce(report)
    return BestOfK(
        Catalogue(transport, refresh_s=60), k=k, max_queued=max_queued, rng=random.Random(7)
    )


async def test_a_node_with_a_warm_worker_for_the_tenant_wins() -> None:
    bound = pool_key("nsjail", "python", "ten_a")
    spare = pool_key("nsjail", "python")
    p = await placer(node("n1"), node("n2", warm={spare: 1}), node("n3", warm={bound: 1}))
    assert (await p.place("python", "ten_a")).node_id == "n3"
    assert (await p.place("python", "ten_b")).node_id == "n2"  # a spare beats an empty node


async def test_without_warm_inventory_the_freest_node_wins_and_placements_count() -> None:
    p = await placer(node("n1", free=1), node("n2", free=3))
    placed = [(await p.place("bash", "t")).node_id for _ in range(4)]
    assert placed == ["n2", "n2", "n1", "n2"]  # the local count keeps the burst spread
    overflow = await p.place("bash", "t")
    assert (overflow.runtime, overflow.node_id) == ("nsjail", None)


async def test_every_node_busy_overflows_until_the_queue_is_full() -> None:
    p = await placer(node("n1", free=0), max_queued=2)
    assert (await p.place("wasm-python", "t")).node_id is None
    assert (await p.place("wasm-python", "t")).node_id is None
    with pytest.raises(NoCapacity) as refused:
        await p.place("wasm-python", "t")
    assert refused.value.code == "no_capacity"
    assert refused.value.details == {"runtime": "wasm", "waiting": 2, "nodes": 1}


async def test_the_backlog_counts_what_waits_on_the_overflow_stream() -> None:
    transport = InProcessTransport(dead_after_s=60)
    await transport.announce(node("n1", free=0))
    job = Job(
        invocation_id="inv_1",
        tenant_id="t",
        runtime="nsjail",
        spec=RunSpec(language="python", code=""),
        claim="c",
        reply_to="local",
        enqueued_at=time.time(),
    )
    await transport.dispatch(job, node_id=None, hold_s=1, queue_s=1)
    p = BestOfK(Catalogue(transport, refresh_s=60), k=2, max_queued=1)
    with pytest.raises(NoCapacity):
        await p.place("python", "t")


async def test_typed_refusals() -> None:
    with pytest.raises(NoCapacity, match="no node agent is alive"):
        await (await placer()).place("python", "t")
    with pytest.raises(UnsupportedRuntime, match="no node runs language 'cobol'") as refused:
        await (await placer(node("n1"))).place("cobol", "t")
    assert refused.value.status == 400 and "bash, python, wasm-python" in refused.value.message


async def test_an_empty_catalogue_is_read_again_so_the_first_node_counts_at_once() -> None:
    transport = InProcessTransport(dead_after_s=60)
    catalogue = Catalogue(transport, refresh_s=60)
    assert await catalogue.nodes() == []  # read before any node reported (a reconciler pass)
    await transport.announce(node("n1"))
    assert [n.node_id for n in await catalogue.nodes()] == ["n1"]  # not the cached emptiness
    await transport.announce(node("n2"))
    assert [n.node_id for n in await catalogue.nodes()] == ["n1"]  # a filled copy is cached


async def test_a_placement_counts_until_a_report_made_after_its_job_landed() -> None:
    """The row's commit sits between a placement and its Job reaching the node's stream:
    a report made in between (however long after the placement) has not seen the Job,
    so the slot stays counted until a report made after the Job landed."""
    wall = [1000.0]
    transport = InProcessTransport(dead_after_s=600)
    p = BestOfK(Catalogue(transport, refresh_s=0, wall=lambda: wall[0]), k=1, max_queued=10)

    async def report(at: float, free: int) -> None:
        await transport.announce(node("n1", free=free).model_copy(update={"reported_at": at}))

    await report(1000.0, free=1)
    first = await p.place("bash", "t")
    assert first.node_id == "n1"
    wall[0] = 1002.0  # a slow commit: the node reports again, without the Job
    await report(1002.0, free=1)
    assert (await p.place("bash", "t")).node_id is None  # still counted: overflow
    first.landed()  # the Job reaches the node's stream at 1002
    await report(1002.2, free=1)  # within the margin: the report may have missed it
    assert (await p.place("bash", "t")).node_id is None
    await report(1003.0, free=1)  # a report that counted it (its slot is free again)
    assert (await p.place("bash", "t")).node_id == "n1"
