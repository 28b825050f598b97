"""A tenant's sandbox quotas through ``/v1/sandboxes`` (fake backend, both stacks): sizes,
totals (race-free and without over-refusing a burst), the node's capacity, the daily CPU
budget, snapshots against the storage quota, and the rate of sandbox calls."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from starlette.testclient import TestClient

from app.auth.principal import Principal
from app.db.models import Sandbox, Snapshot
from app.schemas.sandboxes import CreateSandbox
from tests.app.api.v1.test_sandboxes import create
from tests.app.sandboxes.conftest import run, services_of
from tests.conftest import ADMIN

MIB = 1 << 20


def quota(client: TestClient, tenant: dict[str, Any], **limits: Any) -> None:
    patched = client.patch(f"/v1/tenants/{tenant['id']}", json={"quota": limits}, headers=ADMIN)
    assert patched.status_code == 200, patched.text


def refused(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code, error
    if status in (429, 503):
        assert int(response.headers["Retry-After"]) >= 1
    return error


def rows(client: TestClient, tenant_id: str) -> list[Sandbox]:
    sessions = services_of(client).sessions

    async def read() -> list[Sandbox]:
        async with sessions() as session:
            found = await session.scalars(select(Sandbox).where(Sandbox.tenant_id == tenant_id))
            return list(found.all())

    return run(client, read)


def principal(client: TestClient, tenant: dict[str, Any]) -> Principal:
    key = tenant["headers"]["Authorization"].removeprefix("Bearer ")
    return run(client, lambda: services_of(client).authenticator.tenant_for(key))


def test_a_sandbox_past_the_tenants_size_quota_is_refused_and_nothing_is_made(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    client, headers = sandbox_client, tenant["headers"]
    create(client, headers)["id"]  # the node is up
    before = len(rows(client, tenant["id"]))
    huge = {"backend": "fake", "memory_mb": 262_144, "disk_mb": 1_048_576, "cpu": 64}
    error = refused(
        client.post("/v1/sandboxes", json=huge, headers=headers), 422, "sandbox_too_large"
    )
    assert error["details"]["quota"] == "max_sandbox_memory_mb"
    assert "max_sandbox_memory_mb" in error["message"]
    for field, value, quota_field in (
        ("cpu", 4.5, "max_sandbox_cpu"),
        ("disk_mb", 16_385, "max_sandbox_disk_mb"),
    ):
        too_big = client.post(
            "/v1/sandboxes", json={"backend": "fake", field: value}, headers=headers
        )
        assert refused(too_big, 422, "sandbox_too_large")["details"]["quota"] == quota_field
    assert len(rows(client, tenant["id"])) == before  # not even a stopped record

    # the admin lets the tenant ask that much: now no node can hold it
    quota(client, tenant, max_sandbox_memory_mb=262_144, max_sandboxes_memory_mb=300_000)
    error = refused(
        client.post(
            "/v1/sandboxes", json={"backend": "fake", "memory_mb": 262_144}, headers=headers
        ),
        422,
        "sandbox_too_large",
    )
    assert error["details"]["quota"] is None and error["details"]["largest"]["memory_mb"] > 0
    assert len(rows(client, tenant["id"])) == before


def test_the_live_sandboxes_totals_hold_and_name_their_quota(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    client, headers = sandbox_client, tenant["headers"]
    quota(client, tenant, max_concurrent_sandboxes=8, max_sandboxes_memory_mb=1024)
    first = create(client, headers, memory_mb=512)
    create(client, headers, memory_mb=512)
    third = client.post("/v1/sandboxes", json={"backend": "fake", "memory_mb": 32}, headers=headers)
    error = refused(third, 429, "sandbox_quota_exhausted")
    assert error["details"] == {
        "quota": "max_sandboxes_memory_mb",
        "limit": 1024,
        "held": 1024,
        "asked": 32,
    }
    client.delete(f"/v1/sandboxes/{first['id']}", headers=headers)
    create(client, headers, memory_mb=512)
    quota(client, tenant, max_sandboxes_memory_mb=100_000, max_sandboxes_cpu=2.5)
    cpu = client.post("/v1/sandboxes", json={"backend": "fake", "cpu": 0.75}, headers=headers)
    assert refused(cpu, 429, "sandbox_quota_exhausted")["details"]["quota"] == "max_sandboxes_cpu"


@pytest.mark.parametrize("limit", ["count", "memory"])
def test_a_burst_gets_exactly_the_room_that_is_left(
    sandbox_client: TestClient, tenant: dict[str, Any], limit: str
) -> None:
    """Eight creates at once with two places left: two are made, six refused (never more
    made, and none refused while there was room), and the refused leave no record."""
    client, headers = sandbox_client, tenant["headers"]
    if limit == "count":
        quota(client, tenant, max_concurrent_sandboxes=3)
    else:
        quota(client, tenant, max_concurrent_sandboxes=100, max_sandboxes_memory_mb=3 * 512)
    create(client, headers, memory_mb=512)
    who = principal(client, tenant)
    sandboxes = services_of(client).sandboxes
    body = CreateSandbox(backend="fake", memory_mb=512)

    async def burst() -> list[Any]:
        return await asyncio.gather(
            *(sandboxes.create(who, body) for _ in range(8)), return_exceptions=True
        )

    outcomes = run(client, burst)
    made = [o for o in outcomes if isinstance(o, Sandbox)]
    codes = sorted({getattr(o, "code", repr(o)) for o in outcomes if not isinstance(o, Sandbox)})
    assert len(made) == 2, outcomes
    assert codes == ["concurrency_limited" if limit == "count" else "sandbox_quota_exhausted"]
    assert len([r for r in rows(client, tenant["id"]) if r.state == "running"]) == 3
    assert len(rows(client, tenant["id"])) == 3


def test_sandbox_cpu_counts_toward_the_daily_quota_and_stops_new_work(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    """The fake backend reads 1 ms of CPU for a sandbox: with a budget of 1 ms, a sandbox
    whose reading reached its record has used the tenant's day."""
    client, headers = sandbox_client, tenant["headers"]
    quota(client, tenant, cpu_seconds_per_day=0.001)
    sbx = create(client, headers)
    one = f"/v1/sandboxes/{sbx['id']}"
    assert client.get(one, headers=headers).json()["cpu_ms"] == 1.0  # not metered yet
    deadline = time.monotonic() + 10
    while True:  # the quota's reading is cached for a second
        ran = client.post(f"{one}/exec", json={"cmd": ["true"]}, headers=headers)
        if ran.status_code != 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    error = refused(ran, 429, "cpu_quota_exhausted")
    assert error["details"]["quota"] == "cpu_seconds_per_day"
    assert int(ran.headers["Retry-After"]) <= 86_400
    streamed = client.post(f"{one}/exec", json={"cmd": ["true"], "stream": True}, headers=headers)
    refused(streamed, 429, "cpu_quota_exhausted")
    refused(
        client.post("/v1/sandboxes", json={"backend": "fake"}, headers=headers),
        429,
        "cpu_quota_exhausted",
    )
    refused(
        client.post(f"{one}/fork", json={"count": 1}, headers=headers), 429, "cpu_quota_exhausted"
    )
    assert client.post(f"{one}/pause", headers=headers).status_code == 200
    refused(client.post(f"{one}/resume", headers=headers), 429, "cpu_quota_exhausted")
    program = {"language": "fake", "code": json.dumps({})}
    refused(client.post("/v1/run", json=program, headers=headers), 429, "cpu_quota_exhausted")
    quota(client, tenant, cpu_seconds_per_day=86_400)
    assert client.post(f"{one}/resume", headers=headers).status_code == 200


def test_the_cpu_a_node_read_reaches_the_record_without_a_client_asking(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    client, headers = sandbox_client, tenant["headers"]
    sbx = create(client, headers)
    services = services_of(client)
    assert services.node is not None and services.node.sandboxes is not None
    manager = services.node.sandboxes

    async def read_and_sync() -> None:
        await manager.read_usage()  # the node's reaper, every USAGE_EVERY_S
        await services.sandboxes.sync()  # the leader's sandboxes job, every sandbox_sync_seconds

    run(client, read_and_sync)
    [row] = [r for r in rows(client, tenant["id"]) if r.id == sbx["id"]]
    assert row.cpu_ms == 1.0


def snapshots(client: TestClient, tenant_id: str) -> list[Snapshot]:
    sessions = services_of(client).sessions

    async def read() -> list[Snapshot]:
        async with sessions() as session:
            found = await session.scalars(select(Snapshot).where(Snapshot.tenant_id == tenant_id))
            return list(found.all())

    return run(client, read)


def test_snapshots_are_capped_and_count_against_the_storage_quota(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    client, headers = sandbox_client, tenant["headers"]
    quota(client, tenant, max_snapshots=2)
    sbx = create(client, headers)
    one = f"/v1/sandboxes/{sbx['id']}"
    first = client.post(f"{one}/snapshot", headers=headers)
    assert first.status_code == 201
    assert client.post(f"{one}/snapshot", headers=headers).status_code == 201
    error = refused(
        client.post(f"{one}/snapshot", headers=headers), 429, "snapshot_quota_exhausted"
    )
    assert error["details"]["quota"] == "max_snapshots"
    refused(
        client.post(f"{one}/fork", json={"count": 1}, headers=headers),
        429,
        "snapshot_quota_exhausted",
    )
    assert len(snapshots(client, tenant["id"])) == 2  # the refused left no row
    assert client.delete(f"/v1/snapshots/{first.json()['id']}", headers=headers).status_code == 204
    assert client.post(f"{one}/snapshot", headers=headers).status_code == 201

    # 1 MiB of files against 2 MiB of storage: two snapshots fill it
    quota(client, tenant, max_snapshots=64, max_storage_mb=2)
    for listed in client.get("/v1/snapshots", headers=headers).json()["snapshots"]:
        client.delete(f"/v1/snapshots/{listed['id']}", headers=headers)
    data = {"path": "/home/user/data"}
    put = client.put(f"{one}/files", params=data, content=b"x" * MIB, headers=headers)
    assert put.status_code == 200
    kept = client.post(f"{one}/snapshot", headers=headers)
    assert kept.status_code == 201 and kept.json()["size_bytes"] == MIB
    assert client.post(f"{one}/snapshot", headers=headers).status_code == 201
    error = refused(client.post(f"{one}/snapshot", headers=headers), 429, "storage_quota_exhausted")
    assert error["details"]["quota"] == "max_storage_mb"
    assert error["details"]["stored_bytes"] == 2 * MIB
    fork = client.post(f"{one}/fork", json={"count": 1}, headers=headers)
    refused(fork, 429, "storage_quota_exhausted")
    live = client.get("/v1/sandboxes", headers=headers).json()["sandboxes"]
    assert [s["id"] for s in live] == [sbx["id"]]
    # the same storage quota as large outputs: executions are refused too, until a delete
    program = {"language": "fake", "code": json.dumps({})}
    deadline = time.monotonic() + 10
    while True:  # the reading is cached for a second
        ran = client.post("/v1/run", json=program, headers=headers)
        if ran.status_code != 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    refused(ran, 429, "storage_quota_exhausted")
    assert client.delete(f"/v1/snapshots/{kept.json()['id']}", headers=headers).status_code == 204
    # 1 MiB stored, the sandbox now holds 1.5 MiB: its snapshot would pass the quota
    bigger = client.put(f"{one}/files", params=data, content=b"x" * (3 * MIB // 2), headers=headers)
    assert bigger.status_code == 200
    error = refused(client.post(f"{one}/snapshot", headers=headers), 429, "storage_quota_exhausted")
    assert error["details"]["asked_bytes"] == 3 * MIB // 2
    assert len([s for s in snapshots(client, tenant["id"]) if s.deleted_at is None]) == 1

    # a snapshot the node fails to make leaves no row to count
    client.put(f"{one}/files", params=data, content=b"x", headers=headers)
    services = services_of(client)
    assert services.node is not None and services.node.sandboxes is not None
    backend: Any = services.node.sandboxes.backends["fake"]

    async def broken(sandbox_id: str, snapshot_id: str) -> Any:
        raise OSError("the node's disk is full")

    backend.snapshot = broken
    assert client.post(f"{one}/snapshot", headers=headers).status_code >= 500
    assert len([s for s in snapshots(client, tenant["id"]) if s.deleted_at is None]) == 1


def test_sandbox_calls_are_rate_limited_per_tenant(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    client, headers = sandbox_client, tenant["headers"]
    sbx = create(client, headers)
    quota(client, tenant, sandbox_calls_per_second=0.01, sandbox_call_burst=3)
    one = f"/v1/sandboxes/{sbx['id']}"
    calls = [
        lambda: client.post(f"{one}/exec", json={"cmd": ["true"]}, headers=headers),
        lambda: client.get(f"{one}/files/list", params={"path": "/"}, headers=headers),
        lambda: client.post(f"{one}/pause", headers=headers),
        lambda: client.post(f"{one}/resume", headers=headers),
        lambda: client.post(f"{one}/snapshot", headers=headers),
    ]
    answers = [call() for call in calls]
    assert [a.status_code for a in answers[:3]] == [200, 200, 200]
    for answer in answers[3:]:
        error = refused(answer, 429, "rate_limited")
        assert "sandbox_calls_per_second" in error["message"]
        assert int(answer.headers["Retry-After"]) >= 1
    other = client.post("/v1/tenants", json={"name": "other"}, headers=ADMIN).json()
    theirs = {"Authorization": f"Bearer {other['key']['api_key']}"}
    assert client.get("/v1/sandboxes", headers=theirs).status_code == 200  # its own bucket
