"""The overview's pools by backend: the nodes' own reports of their workers by state
(warm, busy, starting), summed over nodes; pools counted per key."""

from __future__ import annotations

import time
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.api.console import overview
from wire.messages import NodeReport


def report(node_id: str, **fields: Any) -> NodeReport:
    now = time.time()
    base: dict[str, Any] = {
        "node_id": node_id,
        "incarnation": "i",
        "runtimes": {"nsjail": ["python"]},
        "slots": 8,
        "slots_free": 6,
        "memory_mb": 4096,
        "memory_free_mb": 2048,
        "started_at": now,
        "reported_at": now,
    }
    return NodeReport(**(base | fields))


def test_pools_by_backend_add_up_the_nodes_reports(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    services = client.app.state.services  # type: ignore[attr-defined]
    nodes = [
        report(
            "a",
            warm={"nsjail/python": 2, "nsjail/python/t1": 1, "sandbox/crun/d1": 4},
            pools={
                "nsjail": {"warm": 3, "busy": 2, "starting": 1},
                "sandboxes": {"warm": 4, "busy": 7, "starting": 2},
            },
            sandbox_backends=["crun"],
        ),
        report("b", warm={"nsjail/python": 1}, pools={"nsjail": {"warm": 1, "busy": 0}}),
    ]

    async def catalogue() -> list[NodeReport]:
        return nodes

    monkeypatch.setattr(services.catalogue, "nodes", catalogue)
    figures = client.portal.call(overview.snapshot, services, None)  # type: ignore[union-attr]
    assert figures["backends"] == {
        "nsjail": {"warm": 4, "busy": 2, "starting": 1, "pools": 3},
        "sandboxes": {"warm": 4, "busy": 7, "starting": 2, "pools": 1},
    }
    assert [n["busy"] for n in figures["nodes"]] == [2, 2]
