"""The in-process transport's liveness: a node's report ages only while the process runs."""

from __future__ import annotations

import time

from app.dispatch.inprocess import InProcessTransport
from tests.app.dispatch.test_transports import report


async def test_a_node_is_not_dead_because_the_loop_was_held_up() -> None:
    wall = [1000.0]
    transport = InProcessTransport(dead_after_s=6.0, clock=lambda: wall[0])
    await transport.announce(report("node-a"))
    wall[0] += 30.0  # nothing ran for 30 s: neither the heartbeat nor any reader
    assert [n.node_id for n in await transport.catalogue()] == ["node-a"]
    assert await transport.dead_nodes() == []


async def test_a_node_whose_heartbeat_stopped_is_dead_on_time() -> None:
    wall = [1000.0]
    transport = InProcessTransport(dead_after_s=6.0, clock=lambda: wall[0])
    await transport.announce(report("node-a"))
    for _ in range(11):  # the loop runs; a reader looks every half second
        wall[0] += 0.5
        assert await transport.dead_nodes() == []
    wall[0] += 1.0
    assert await transport.catalogue() == []
    assert await transport.dead_nodes() == ["node-a"]


async def test_a_real_stall_of_the_loop_does_not_age_the_report() -> None:
    transport = InProcessTransport(dead_after_s=0.4)
    await transport.announce(report("node-a"))
    time.sleep(1.0)  # noqa: ASYNC251 - the loop held up, for real
    assert await transport.dead_nodes() == []
