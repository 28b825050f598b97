"""Usage events of sandboxes while they live: intervals recorded from the records, once
each, up to a sandbox's end, counted by the rollups and the daily CPU reading."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select, update
from starlette.testclient import TestClient

from app.db import usage
from app.db.models import Sandbox, UsageEvent, UsageRollup
from app.sandboxes import metering
from tests.app.api.v1.test_sandboxes import create
from tests.app.sandboxes.conftest import run, services_of


def _meter(client: TestClient, now: datetime) -> int:
    sessions = services_of(client).sessions
    return run(client, lambda: metering.meter(sessions, now=now, every_s=0.0))


def _row(client: TestClient, sandbox_id: str) -> Sandbox:
    async def read() -> Sandbox:
        async with services_of(client).sessions() as session:
            row = await session.get(Sandbox, sandbox_id)
        assert row is not None
        return row

    return run(client, read)


def _events(client: TestClient, sandbox_id: str) -> list[UsageEvent]:
    async def read() -> list[UsageEvent]:
        query = (
            select(UsageEvent)
            .where(UsageEvent.subject == "sandbox", UsageEvent.subject_id.like(f"{sandbox_id}@%"))
            .order_by(UsageEvent.occurred_at)
        )
        async with services_of(client).sessions() as session:
            return list((await session.scalars(query)).all())

    return run(client, read)


def _contiguous(events: list[UsageEvent], started: datetime) -> None:
    """Each interval starts where the one before ended (none overlap, none is missing)."""
    at = started
    for event in events:
        start_ms = int(event.subject_id.rsplit("@", 1)[1])
        assert start_ms == round(at.timestamp() * 1000)
        assert event.occurred_at == at + timedelta(seconds=event.instance_seconds)
        at = event.occurred_at


def test_a_live_sandbox_is_metered_in_intervals_that_add_up_and_do_not_overlap(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    client = sandbox_client
    sbx = create(client, tenant["headers"], memory_mb=256)
    row = _row(client, sbx["id"])
    started = row.started_at
    assert started is not None and row.metered_until is None
    assert _meter(client, started + timedelta(seconds=30)) == 1
    assert _meter(client, started + timedelta(seconds=75)) == 1
    assert _meter(client, started + timedelta(seconds=75)) == 0  # a pass repeated

    events = _events(client, sbx["id"])
    assert [e.instance_seconds for e in events] == [30.0, 45.0]
    _contiguous(events, started)
    assert [e.memory_mb_seconds for e in events] == [256 * 30.0, 256 * 45.0]
    phases = (row.image_ms or 0) + (row.setup_ms or 0) + (row.start_ms or 0)
    assert [e.setup_ms for e in events] == [pytest.approx(phases), 0.0]  # the create's, once
    assert {(e.kind, e.tenant_id, e.runtime, e.node_id, e.status) for e in events} == {
        ("sandbox", tenant["id"], "fake", sbx["node_id"], "running")
    }
    assert _row(client, sbx["id"]).metered_until == started + timedelta(seconds=75)


def test_passes_racing_over_one_interval_store_it_once(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    client = sandbox_client
    sbx = create(client, tenant["headers"])
    now = _row(client, sbx["id"]).started_at + timedelta(seconds=20)  # type: ignore[operator]
    sessions = services_of(client).sessions

    async def race() -> list[int]:
        passes = (metering.meter(sessions, now=now, every_s=0.0) for _ in range(3))
        return list(await asyncio.gather(*passes))

    assert sum(run(client, race)) == 1
    assert [e.instance_seconds for e in _events(client, sbx["id"])] == [20.0]


def test_a_destroyed_sandbox_is_metered_up_to_its_end_and_no_further(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    client, headers = sandbox_client, tenant["headers"]
    sbx = create(client, headers)
    started = _row(client, sbx["id"]).started_at - timedelta(seconds=100)  # type: ignore[operator]

    async def older() -> None:  # as if it had started 100 s earlier
        async with services_of(client).sessions.begin() as session:
            await session.execute(
                update(Sandbox).where(Sandbox.id == sbx["id"]).values(started_at=started)
            )

    run(client, older)
    assert _meter(client, started + timedelta(seconds=40)) == 1
    gone = client.delete(f"/v1/sandboxes/{sbx['id']}", headers=headers).json()
    assert gone["state"] == "stopping" and gone["ended_at"]  # acknowledged: ended now
    run(client, services_of(client).sandboxes.drain)  # the teardown
    assert _row(client, sbx["id"]).state == "stopped"  # its last interval recorded then
    ended = _row(client, sbx["id"]).ended_at
    assert ended is not None and ended == datetime.fromisoformat(gone["ended_at"])
    assert _meter(client, ended + timedelta(hours=1)) == 0

    events = _events(client, sbx["id"])
    assert len(events) == 2 and events[-1].occurred_at == ended
    assert events[-1].status == "stopped"
    _contiguous(events, started)
    assert sum(e.instance_seconds for e in events) == pytest.approx(
        (ended - started).total_seconds()
    )


def test_a_destroy_ends_the_charge_when_it_is_acknowledged_however_long_its_teardown(
    sandbox_client: TestClient, tenant: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, headers = sandbox_client, tenant["headers"]
    sbx = create(client, headers)
    sandboxes = services_of(client).sandboxes
    monkeypatch.setattr(
        sandboxes.teardowns, "spawn", lambda work, name: work.close()
    )  # not torn down
    gone = client.delete(f"/v1/sandboxes/{sbx['id']}", headers=headers).json()
    ended = datetime.fromisoformat(gone["ended_at"])
    # a pass much later (this one, or the leader's own that came first: either stores it)
    _meter(client, ended + timedelta(hours=1))
    assert _meter(client, ended + timedelta(hours=2)) == 0
    row = _row(client, sbx["id"])
    assert (row.state, row.metered_until) == ("stopping", ended)
    events = _events(client, sbx["id"])
    _contiguous(events, row.started_at)  # type: ignore[arg-type]
    assert events[-1].occurred_at == ended
    assert [e.occurred_at for e in events].count(ended) == 1  # charged up to it, once


def test_a_paused_sandbox_is_metered_for_the_memory_it_holds(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    client, headers = sandbox_client, tenant["headers"]
    sbx = create(client, headers, memory_mb=128)
    client.post(f"/v1/sandboxes/{sbx['id']}/pause", headers=headers)
    assert _meter(client, _row(client, sbx["id"]).started_at + timedelta(seconds=10)) == 1  # type: ignore[operator]
    [event] = _events(client, sbx["id"])
    assert event.status == "paused" and event.memory_mb_seconds == 128 * 10.0


def test_sandbox_usage_is_rolled_up_and_counts_toward_the_daily_cpu(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    client, headers = sandbox_client, tenant["headers"]
    sbx = create(client, headers)
    cpu_ms = client.get(f"/v1/sandboxes/{sbx['id']}", headers=headers).json()["cpu_ms"]
    assert cpu_ms  # the fake backend reads some CPU time (the GET shows it, stores nothing)
    assert _row(client, sbx["id"]).cpu_ms is None
    run(client, services_of(client).sandboxes.sync)  # stores the node's reading
    assert _row(client, sbx["id"]).cpu_ms == cpu_ms
    started = _row(client, sbx["id"]).started_at
    assert started is not None
    assert _meter(client, started + timedelta(seconds=10)) == 1
    assert _meter(client, started + timedelta(seconds=20)) == 1  # no CPU read since
    assert [e.cpu_ms for e in _events(client, sbx["id"])] == [cpu_ms, 0.0]
    sessions = services_of(client).sessions

    async def rolled() -> tuple[list[UsageRollup], float]:
        while True:
            async with sessions.begin() as session:
                if await usage.roll_up(session) == 0:
                    break
        async with sessions() as session:
            rows = await session.scalars(
                select(UsageRollup).where(
                    UsageRollup.tenant_id == tenant["id"], UsageRollup.kind == "sandbox"
                )
            )
            day = (started + timedelta(seconds=20)).date()
            return list(rows.all()), await usage.cpu_seconds(
                session, tenant_id=tenant["id"], day=day
            )

    rollups, cpu_seconds = run(client, rolled)
    assert sum(r.instance_seconds for r in rollups) == 20.0
    assert sum(r.events for r in rollups) == 2
    assert cpu_seconds == cpu_ms / 1000
