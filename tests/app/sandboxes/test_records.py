"""Sandbox records through the service, writers racing: a refresh never writes; a sync
that read a live row before a concurrent destroy cannot store it afterwards; a destroy
or a create whose gateway died midway is finished by sync; the tenant's totals take each
sandbox off once, however it ends (both stacks, fake backend)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select
from starlette.testclient import TestClient

from app.db import sandboxes as sandbox_rows
from app.db.models import Sandbox
from app.errors import ConcurrencyLimited
from app.sandboxes import sync
from app.sandboxes.admission import Ask, Held
from app.sandboxes.nodes import NodeClient
from app.schemas.sandboxes import CreateSandbox
from tests.app.api.v1.test_sandboxes import create
from tests.app.sandboxes.conftest import run, services_of
from tests.app.sandboxes.test_quotas import principal, quota
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
    run(client, services_of(client).sandboxes.drain)  # the destroy's teardown
    row = _row(client, sbx["id"])
    assert (row.state, row.reason) == ("stopped", "destroyed")
    assert row.version == before.version + 2  # the destroy's two moves, and nothing else


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
    run(client, services_of(client).sandboxes.drain)
    row = _row(client, sbx["id"])
    assert (row.state, row.reason) == ("stopped", "destroyed")


def _held_by_node(client: TestClient) -> set[str]:
    node = services_of(client).node
    assert node is not None
    held = node.sandboxes.inventory()  # type: ignore[union-attr]
    return {s.sandbox_id for s in held if s.state is not SandboxState.STOPPED}


def test_a_destroy_whose_teardown_died_with_its_gateway_is_finished_by_sync(
    sandbox_client: TestClient, tenant: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, headers = sandbox_client, tenant["headers"]
    sbx = create(client, headers)
    sandboxes = services_of(client).sandboxes
    monkeypatch.setattr(sandboxes.teardowns, "spawn", lambda work, name: work.close())  # it died
    gone = client.delete(f"/v1/sandboxes/{sbx['id']}", headers=headers).json()
    assert gone["state"] == "stopping" and sbx["id"] in _held_by_node(client)
    monkeypatch.setattr(sync, "STOP_GRACE", timedelta(0))
    run(client, sandboxes.sync)
    assert sbx["id"] not in _held_by_node(client)
    row = _row(client, sbx["id"])
    assert (row.state, row.reason) == ("stopped", "destroyed") and row.ended_at is not None


def test_a_sandbox_a_node_made_for_a_create_that_was_never_recorded_is_destroyed(
    sandbox_client: TestClient, tenant: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway died between the node's answer and its commit: nothing recorded it.
    Within ``ORPHAN_GRACE`` it is a create whose row is still to come; then it goes."""
    client, headers = sandbox_client, tenant["headers"]
    kept = create(client, headers)
    sandboxes = services_of(client).sandboxes
    who = principal(client, tenant)

    async def unrecorded() -> None:
        async def fail(*_: Any) -> None:
            raise RuntimeError("the gateway died here")

        monkeypatch.setattr(sandboxes.creates, "record", fail)
        monkeypatch.setattr(sandboxes.teardowns, "spawn", lambda work, name: work.close())
        with pytest.raises(RuntimeError, match="the gateway died here"):
            await sandboxes.create(who, CreateSandbox(backend="fake"))

    run(client, unrecorded)
    orphans = _held_by_node(client) - {kept["id"]}
    assert len(orphans) == 1
    run(client, sandboxes.sync)
    assert _held_by_node(client) - {kept["id"]} == orphans  # its row may still come
    monkeypatch.setattr(sync, "ORPHAN_GRACE", timedelta(0))
    run(client, sandboxes.sync)
    assert _held_by_node(client) == {kept["id"]}
    assert _row(client, kept["id"]).state == "running"


def _totals_and_live_rows(client: TestClient, tenant_id: str) -> tuple[Held, Held]:
    """The tenant's ``sandbox_totals`` and the same sums over its live rows."""

    async def read() -> tuple[Held, Held]:
        async with services_of(client).sessions() as session:
            totals = await sandbox_rows.held(session, tenant_id)
            specs = await session.scalars(
                select(Sandbox.spec).where(
                    Sandbox.tenant_id == tenant_id, Sandbox.state.in_(sandbox_rows.LIVE)
                )
            )
            return totals, Held.of(Ask.of(spec or {}) for spec in specs)

    return run(client, read)


def test_the_totals_take_each_sandbox_off_once_whichever_way_it_ends(
    sandbox_client: TestClient, tenant: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Destroyed (torn down at once, or by sync after its gateway died), lost (its node
    forgot it), expired on its node: each leaves the totals once, however many writers
    race to record its end; the totals always equal the sums over the live rows."""
    client, headers = sandbox_client, tenant["headers"]
    sandboxes = services_of(client).sandboxes
    node = services_of(client).node
    assert node is not None and node.sandboxes is not None
    quota(client, tenant, max_concurrent_sandboxes=5)
    made = [create(client, headers, memory_mb=64 * (n + 1))["id"] for n in range(5)]
    totals, live = _totals_and_live_rows(client, tenant["id"])
    assert totals == live and live.count == 5

    client.delete(f"/v1/sandboxes/{made[0]}", headers=headers)  # torn down off the path
    run(client, sandboxes.drain)
    with monkeypatch.context() as dead:  # acknowledged by a gateway that died
        dead.setattr(sandboxes.teardowns, "spawn", lambda work, name: work.close())
        client.delete(f"/v1/sandboxes/{made[1]}", headers=headers)
    run(client, lambda: node.sandboxes.destroy(made[2], reason="expired"))  # type: ignore[union-attr]
    run(client, lambda: node.sandboxes.destroy(made[3]))  # type: ignore[union-attr]
    node.sandboxes._entries.pop(made[3], None)  # type: ignore[union-attr]  # forgotten: lost
    assert _totals_and_live_rows(client, tenant["id"])[0].count == 3  # the destroys freed theirs

    monkeypatch.setattr(sync, "STOP_GRACE", timedelta(0))
    for _ in range(3):  # passes repeated, and a destroy raced by them
        client.delete(f"/v1/sandboxes/{made[1]}", headers=headers)
        run(client, sandboxes.sync)
        run(client, sandboxes.drain)
    ended = {sandbox_id: _row(client, sandbox_id) for sandbox_id in made[:4]}
    assert {i: (r.state, r.reason) for i, r in ended.items()} == {
        made[0]: ("stopped", "destroyed"),
        made[1]: ("stopped", "destroyed"),
        made[2]: ("stopped", "expired"),
        made[3]: ("stopped", "lost"),
    }
    totals, live = _totals_and_live_rows(client, tenant["id"])
    assert totals == live and (live.count, live.memory_mb) == (1, 64 * 5)


def test_a_create_refused_after_its_node_made_the_sandbox_leaves_nothing(
    sandbox_client: TestClient, tenant: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another gateway took the last room while the node made it: the commit refuses
    it, and the sandbox the node made is destroyed; no row, nothing in the totals."""
    client, headers = sandbox_client, tenant["headers"]
    kept = create(client, headers)
    sandboxes = services_of(client).sandboxes
    who = principal(client, tenant)
    before = _totals_and_live_rows(client, tenant["id"])[0]

    async def refused() -> None:
        async def taken(*_: Any) -> None:
            raise ConcurrencyLimited("taken meanwhile", retry_after=1)

        monkeypatch.setattr(sandboxes.creates, "record", taken)
        with pytest.raises(ConcurrencyLimited):
            await sandboxes.create(who, CreateSandbox(backend="fake"))
        await sandboxes.drain()

    run(client, refused)
    assert _held_by_node(client) == {kept["id"]}
    assert _totals_and_live_rows(client, tenant["id"])[0] == before
