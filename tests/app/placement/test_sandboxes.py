"""Where a sandbox goes: only to a node with room for its memory and CPU; refused for
good when no node could ever hold it, for now when none has room."""

from __future__ import annotations

import random
import time

import pytest

from app.errors import BackendNotOffered, NoCapacity, SandboxTooLarge
from app.placement.sandboxes import check, choose
from wire.messages import NodeReport


def node(
    node_id: str,
    *,
    memory: int | None = 8192,
    memory_free: int = 8192,
    cpu: float | None = 8.0,
    cpu_free: float = 8.0,
    room: int = 100,
    sandboxes: int = 0,
) -> NodeReport:
    now = time.time()
    return NodeReport(
        node_id=node_id,
        incarnation="i",
        address=f"{node_id}:1",
        runtimes={},
        slots=4,
        slots_free=4,
        memory_mb=4096,
        memory_free_mb=4096,
        sandboxes=sandboxes,
        sandbox_backends=["crun"],
        sandbox_room=room,
        sandbox_memory_mb=memory,
        sandbox_memory_free_mb=memory_free,
        sandbox_cpu=cpu,
        sandbox_cpu_free=cpu_free,
        started_at=now,
        reported_at=now,
    )


def test_only_a_node_with_room_for_the_ask_is_chosen() -> None:
    full = node("full", memory_free=256)
    busy_cpu = node("busy-cpu", cpu_free=0.5)
    roomy = node("roomy", memory_free=2048, sandboxes=40)
    for seed in range(20):
        chosen = choose(
            [full, busy_cpu, roomy], "crun", memory_mb=1024, cpu=1.0, rng=random.Random(seed)
        )
        assert chosen.node_id == "roomy"


def test_of_two_with_room_the_one_with_fewer_sandboxes_wins() -> None:
    nodes = [node("many", sandboxes=9), node("few", sandboxes=1)]
    assert choose(nodes, "crun", memory_mb=512, cpu=1.0).node_id == "few"


def test_an_ask_no_node_could_hold_is_refused_for_good() -> None:
    nodes = [node("a", memory=4096), node("b", memory=8192, cpu=2.0)]
    with pytest.raises(SandboxTooLarge) as memory:
        choose(nodes, "crun", memory_mb=262_144, cpu=1.0)
    assert memory.value.status == 422 and memory.value.code == "sandbox_too_large"
    assert memory.value.details == {"quota": None, "largest": {"memory_mb": 8192, "cpu": 8.0}}
    with pytest.raises(SandboxTooLarge):
        choose(nodes, "crun", memory_mb=512, cpu=64.0)


def test_an_ask_that_fits_a_node_but_not_its_room_now_is_told_to_retry() -> None:
    nodes = [node("a", memory_free=100), node("b", room=0)]
    with pytest.raises(NoCapacity) as busy:
        choose(nodes, "crun", memory_mb=512, cpu=1.0)
    assert busy.value.status == 503 and busy.value.headers() == {"Retry-After": "1"}
    with pytest.raises(NoCapacity):
        choose([], "crun", memory_mb=512, cpu=1.0)


def test_a_node_that_reports_no_sandbox_capacity_takes_any_size() -> None:
    old = node("old", memory=None, cpu=None, memory_free=0, cpu_free=0.0)
    assert choose([old], "crun", memory_mb=262_144, cpu=64.0).node_id == "old"


def test_a_snapshots_node_is_checked_alone() -> None:
    check(node("s"), memory_mb=1024, cpu=1.0)
    with pytest.raises(NoCapacity):
        check(node("s", memory_free=512), memory_mb=1024, cpu=1.0)
    with pytest.raises(SandboxTooLarge):
        check(node("s", memory=512), memory_mb=1024, cpu=1.0)


def test_a_backend_no_node_offers_is_refused_naming_those_on_offer() -> None:
    with pytest.raises(BackendNotOffered) as refused:
        choose([node("a"), node("b")], "microvm", memory_mb=512, cpu=1.0)
    assert refused.value.status == 422 and refused.value.code == "backend_not_offered"
    assert refused.value.details == {"backend": "microvm", "offered": ["crun"]}
    # no node up at all: that may change in a moment
    with pytest.raises(NoCapacity):
        choose([], "microvm", memory_mb=512, cpu=1.0)
