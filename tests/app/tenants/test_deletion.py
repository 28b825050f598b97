"""Deleting a tenant (``DELETE /v1/tenants/{id}``): keep its records or purge them, on
both stacks, asked again safely."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from starlette.testclient import TestClient

from app.db.models import (
    ApiKey,
    Blob,
    Function,
    FunctionArtifact,
    FunctionVersion,
    Invocation,
    Sandbox,
    Snapshot,
    Tenant,
    TenantImage,
    UsageEvent,
)
from app.services import Services
from app.tenants import deletion
from tests.app.api.v1.test_sandboxes import create
from tests.conftest import ADMIN

CODE = "def handler(input):\n    return input\n"
#: more than a row keeps: the output goes to a blob
LARGE = 70 * 1024


def services_of(client: TestClient) -> Services:
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    return services


def counts(client: TestClient, tenant_id: str) -> dict[str, int]:
    """The tenant's rows, by table."""
    tables = {
        "invocations": (Invocation, Invocation.tenant_id),
        "blobs": (Blob, Blob.tenant_id),
        "functions": (Function, Function.tenant_id),
        "artifacts": (FunctionArtifact, FunctionArtifact.tenant_id),
        "sandboxes": (Sandbox, Sandbox.tenant_id),
        "snapshots": (Snapshot, Snapshot.tenant_id),
        "usage_events": (UsageEvent, UsageEvent.tenant_id),
        "keys": (ApiKey, ApiKey.tenant_id),
        "live_keys": (ApiKey, ApiKey.tenant_id),
    }

    async def read() -> dict[str, int]:
        found: dict[str, int] = {}
        async with services_of(client).sessions() as session:
            for name, (model, column) in tables.items():
                query = select(func.count()).select_from(model).where(column == tenant_id)
                if name == "live_keys":
                    query = query.where(ApiKey.revoked_at.is_(None))
                found[name] = int(await session.scalar(query) or 0)
            found["versions"] = int(
                await session.scalar(
                    select(func.count())
                    .select_from(FunctionVersion)
                    .join(Function, Function.id == FunctionVersion.function_id)
                    .where(Function.tenant_id == tenant_id)
                )
                or 0
            )
        return found

    return client.portal.call(read)  # type: ignore[union-attr]


def states(client: TestClient, tenant_id: str) -> list[str]:
    async def read() -> list[str]:
        async with services_of(client).sessions() as session:
            query = select(Sandbox.state).where(Sandbox.tenant_id == tenant_id)
            return list((await session.scalars(query)).all())

    return client.portal.call(read)  # type: ignore[union-attr]


def populate(client: TestClient, tenant: dict[str, Any], *, snapshot: bool = False) -> str:
    """A live sandbox (and a snapshot of it), a run with a large output, a function; the
    sandbox's id."""
    headers = tenant["headers"]
    raised = client.patch(
        f"/v1/tenants/{tenant['id']}",
        json={"quota": {"max_concurrent_sandboxes": 8}},
        headers=ADMIN,
    )
    assert raised.status_code == 200, raised.text
    sbx = create(client, headers)
    if snapshot:
        made = client.post(f"/v1/sandboxes/{sbx['id']}/snapshot", headers=headers)
        assert made.status_code == 201, made.text
    ran = client.post(
        "/v1/run",
        json={"language": "fake", "code": json.dumps({"stdout": "x" * LARGE})},
        headers=headers,
    )
    assert ran.status_code == 200 and ran.json()["status"] == "succeeded", ran.text
    fn = {"name": "echo", "language": "python", "code": CODE}
    assert client.post("/v1/functions", json=fn, headers=headers).status_code == 201
    return str(sbx["id"])


def other_tenant(client: TestClient) -> dict[str, Any]:
    made = client.post("/v1/tenants", json={"name": "bystander"}, headers=ADMIN).json()
    headers = {"Authorization": f"Bearer {made['key']['api_key']}"}
    ran = client.post("/v1/run", json={"language": "fake", "code": "{}"}, headers=headers)
    assert ran.status_code == 200, ran.text
    return {"id": made["tenant"]["id"], "headers": headers}


def test_delete_keeps_the_records_and_ends_the_sandboxes(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    client = sandbox_client
    populate(client, tenant)
    before = counts(client, tenant["id"])
    assert before["blobs"] >= 1 and before["functions"] == 1 and before["live_keys"] == 1

    response = client.delete(f"/v1/tenants/{tenant['id']}", headers=ADMIN)
    assert response.status_code == 200, response.text
    done = response.json()
    assert done["sandboxes_ended"] == 1 and done["purged"] == {} and done["remaining"] == {}
    assert done["tenant"]["disabled"] is True and done["tenant"]["deleted_at"]
    assert done["tenant"]["purged_at"] is None
    refused = client.get("/v1/sandboxes", headers=tenant["headers"])
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert set(states(client, tenant["id"])) <= {"stopping", "stopped"}
    after = counts(client, tenant["id"])
    assert after["live_keys"] == 0
    assert after["usage_events"] >= before["usage_events"]  # the sandbox's, metered to its end
    changing = ("live_keys", "usage_events")
    assert {k: v for k, v in after.items() if k not in changing} == {
        k: v for k, v in before.items() if k not in changing
    }  # records kept, for the bill

    enable = client.patch(f"/v1/tenants/{tenant['id']}", json={"disabled": False}, headers=ADMIN)
    assert enable.status_code == 409 and "deleted" in enable.json()["error"]["message"]
    key = client.post(f"/v1/tenants/{tenant['id']}/keys", json={}, headers=ADMIN)
    assert key.status_code == 409
    again = client.delete(f"/v1/tenants/{tenant['id']}", headers=ADMIN).json()
    assert again["sandboxes_ended"] == 0
    assert again["tenant"]["deleted_at"] == done["tenant"]["deleted_at"]
    shown = client.get(f"/v1/tenants/{tenant['id']}", headers=ADMIN).json()
    assert shown["deleted_at"] == done["tenant"]["deleted_at"]


def test_purge_removes_the_content_keeps_the_bill_and_finishes_when_asked_again(
    sandbox_client: TestClient, tenant: dict[str, Any], tmp_path: Path
) -> None:
    client = sandbox_client
    populate(client, tenant, snapshot=True)
    bystander = other_tenant(client)
    kept = counts(client, bystander["id"])
    release = tmp_path / "release"
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            client.post,
            "/v1/run",
            json={"language": "fake", "code": json.dumps({"until_file": str(release)})},
            headers=tenant["headers"],
        )
        deadline = time.monotonic() + 10
        while counts(client, tenant["id"])["invocations"] < 2 and time.monotonic() < deadline:
            time.sleep(0.02)

        first = client.delete(f"/v1/tenants/{tenant['id']}?purge=true", headers=ADMIN)
        assert first.status_code == 200, first.text
        done = first.json()
        assert done["sandboxes_ended"] == 1 and done["tenant"]["purged_at"] is None
        assert done["purged"]["invocations"] == 1 and done["purged"]["functions"] == 1
        assert done["remaining"]["invocations"] == 1  # open: the recorder's, left alone
        release.touch()
        assert running.result(timeout=10).json()["status"] == "succeeded"
    deadline = time.monotonic() + 10
    while any(done["remaining"].values()) and time.monotonic() < deadline:
        time.sleep(0.05)  # the run's record, the sandbox's teardown
        done = client.delete(f"/v1/tenants/{tenant['id']}?purge=true", headers=ADMIN).json()
    assert done["remaining"] == {"invocations": 0, "sandboxes": 0, "snapshots": 0}, done
    assert done["tenant"]["purged_at"]
    again = client.delete(f"/v1/tenants/{tenant['id']}?purge=true", headers=ADMIN).json()
    assert again["tenant"]["purged_at"] == done["tenant"]["purged_at"]
    assert again["sandboxes_ended"] == 0 and not any(again["purged"].values())

    left = counts(client, tenant["id"])
    assert left["usage_events"] >= 3  # the runs' and the sandbox's: the bill stays
    assert {k: v for k, v in left.items() if k not in ("usage_events", "keys")} == {
        "invocations": 0,
        "blobs": 0,
        "functions": 0,
        "versions": 0,
        "artifacts": 0,
        "sandboxes": 0,
        "snapshots": 0,
        "live_keys": 0,
    }

    async def tenant_row() -> Tenant | None:
        async with services_of(client).sessions() as session:
            return await session.get(Tenant, tenant["id"])

    assert client.portal.call(tenant_row) is not None  # type: ignore[union-attr]
    assert counts(client, bystander["id"]) == kept
    assert client.get("/v1/invocations", headers=bystander["headers"]).status_code == 200


def test_purge_takes_the_tenants_images_with_their_snapshots(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    """An image's snapshot cannot be deleted alone while the image lives: the purge
    deletes both, or it would leave the snapshot in ``remaining`` for ever."""
    client = sandbox_client
    populate(client, tenant, snapshot=True)

    async def add_image() -> None:
        async with services_of(client).sessions() as session, session.begin():
            snapshot_id = await session.scalar(
                select(Snapshot.id).where(Snapshot.tenant_id == tenant["id"])
            )
            assert snapshot_id is not None
            session.add(
                TenantImage(
                    id="img_purged",
                    tenant_id=tenant["id"],
                    name="mine",
                    snapshot_id=snapshot_id,
                    parent="python",
                    env={},
                    user="user",
                    workdir="/home/user",
                )
            )

    async def images() -> int:
        async with services_of(client).sessions() as session:
            query = select(func.count()).select_from(TenantImage)
            return int(
                await session.scalar(query.where(TenantImage.tenant_id == tenant["id"])) or 0
            )

    client.portal.call(add_image)  # type: ignore[union-attr]
    done = client.delete(f"/v1/tenants/{tenant['id']}?purge=true", headers=ADMIN).json()
    deadline = time.monotonic() + 10
    while any(done["remaining"].values()) and time.monotonic() < deadline:
        time.sleep(0.05)  # the sandbox's teardown
        done = client.delete(f"/v1/tenants/{tenant['id']}?purge=true", headers=ADMIN).json()
    assert done["remaining"] == {"invocations": 0, "sandboxes": 0, "snapshots": 0}, done
    assert client.portal.call(images) == 0  # type: ignore[union-attr]


def test_only_the_operator_deletes_and_an_unknown_tenant_is_404(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    client = sandbox_client
    own = client.delete(f"/v1/tenants/{tenant['id']}", headers=tenant["headers"])
    assert own.status_code == 403 and own.json()["error"]["code"] == "admin_required"
    missing = client.delete("/v1/tenants/ten_nope?purge=true", headers=ADMIN)
    assert missing.status_code == 404
    bad = client.delete(f"/v1/tenants/{tenant['id']}?purge=maybe", headers=ADMIN)
    assert bad.status_code == 422
    assert client.get("/v1/sandboxes", headers=tenant["headers"]).status_code == 200


def test_a_large_purge_is_finished_by_asking_again(
    sandbox_client: TestClient, tenant: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deletion, "BATCH", 2)
    monkeypatch.setattr(deletion, "MAX_BATCHES", 1)
    client = sandbox_client
    for _ in range(3):
        body = {"language": "fake", "code": "{}"}
        assert client.post("/v1/run", json=body, headers=tenant["headers"]).status_code == 200
    first = client.delete(f"/v1/tenants/{tenant['id']}?purge=true", headers=ADMIN).json()
    assert first["purged"]["invocations"] == 2 and first["remaining"]["invocations"] == 1
    assert first["tenant"]["purged_at"] is None
    second = client.delete(f"/v1/tenants/{tenant['id']}?purge=true", headers=ADMIN).json()
    assert second["purged"]["invocations"] == 1 and second["remaining"]["invocations"] == 0
    assert second["tenant"]["purged_at"]
