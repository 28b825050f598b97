"""Sandbox records through the service, writers racing: a refresh never writes, and a
sync that read a live row before a concurrent destroy cannot store it afterwards (both
stacks, fake backend)."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from app.db.models import Sandbox
from app.sandboxes.nodes import NodeClient
from tests.app.routes.test_sandboxes import create
from tests.app.sandboxes.conftest import run, services_of
from wire.sandboxes import SandboxInventory, SandboxState, SandboxStatus


def _row(client: TestClient, sandbox_id: str) -> Sandbox:
    async def read() -> Sandbox:
        async with services_of(client).sessions() as session:
            row = await session.get(Sandbox, sandbox_id)
        assert row is not None
        return row

    return run(client, read)


def test_a_get_that_read_a_live_sandbox_before_its_destroy_stores_nothing(
    sandbox_client: TestClient, tenant: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, headers = sandbox_client, tenant["headers"]
    sbx = create(client, headers)
    one = f"/v1/sandboxes/{sbx['id']}"
    before = _row(client, sbx["id"])
    status_of = NodeClient.status

    async def destroyed_meanwhile(node: NodeClient, sandbox_id: str) -> SandboxStatus:
        status = await status_of(node, sandbox_id)  # the node's word while it ran
        await services_of(client).sandboxes.destroy(tenant["id"], sandbox_id)
        return status

    monkeypatch.setattr(NodeClient, "status", destroyed_meanwhile)
    shown = client.get(one, headers=headers)
    assert shown.status_code == 200 and shown.json()["state"] == "running"
    row = _row(client, sbx["id"])
    assert (row.state, row.reason) == ("stopped", "destroyed")
    assert row.version == before.version + 1  # the destroy's transition, and nothing else


def test_a_sync_that_read_a_live_sandbox_before_its_destroy_cannot_revive_it(
    sandbox_client: TestClient, tenant: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, headers = sandbox_client, tenant["headers"]
    sbx = create(client, headers)
    paused = client.post(f"/v1/sandboxes/{sbx['id']}/pause", headers=headers)
    assert paused.json()["state"] == "paused"
    inventory_of = NodeClient.inventory

    async def resumed_then_destroyed(node: NodeClient) -> SandboxInventory:
        """The node's inventory taken once the sandbox was resumed; then it is
        destroyed before the sync stores what it found."""
        taken = await inventory_of(node)
        for status in taken.sandboxes:
            if status.sandbox_id == sbx["id"]:
                status.state = SandboxState.RUNNING
        await services_of(client).sandboxes.destroy(tenant["id"], sbx["id"])
        return taken

    monkeypatch.setattr(NodeClient, "inventory", resumed_then_destroyed)
    run(client, services_of(client).sandboxes.sync)
    row = _row(client, sbx["id"])
    assert (row.state, row.reason) == ("stopped", "destroyed")
