"""Admin API: tenants, quotas and keys."""

from __future__ import annotations

from typing import Any

from starlette.testclient import TestClient

from tests.conftest import ADMIN


def test_create_returns_tenant_and_a_working_key(client: TestClient, new_tenant: Any) -> None:
    tenant = new_tenant("team-a", max_concurrent_executions=3)
    assert tenant["id"].startswith("ten_")
    assert tenant["key"].startswith("crl_key_")
    assert tenant["tenant"]["quota"]["max_concurrent_executions"] == 3
    assert tenant["tenant"]["quota"]["max_memory_mb"] == 1024  # default kept
    response = client.get("/v1/invocations", headers=tenant["headers"])
    assert response.status_code == 200
    assert response.json()["invocations"] == []


def test_key_is_accepted_as_x_api_key(client: TestClient, new_tenant: Any) -> None:
    tenant = new_tenant()
    response = client.get("/v1/invocations", headers={"X-API-Key": tenant["key"]})
    assert response.status_code == 200


def test_duplicate_name_conflicts(client: TestClient, new_tenant: Any) -> None:
    new_tenant("same")
    response = client.post("/v1/tenants", json={"name": "same"}, headers=ADMIN)
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "conflict"


def test_list_and_paginate(client: TestClient, new_tenant: Any) -> None:
    ids = sorted(new_tenant()["id"] for _ in range(3))
    first = client.get("/v1/tenants?limit=2", headers=ADMIN).json()
    assert [t["id"] for t in first["tenants"]] == ids[:2]
    second = client.get(f"/v1/tenants?limit=2&after={first['next_after']}", headers=ADMIN).json()
    assert [t["id"] for t in second["tenants"]] == ids[2:]
    assert second["next_after"] is None


def test_patch_quota_and_disable(client: TestClient, new_tenant: Any) -> None:
    tenant = new_tenant()
    response = client.patch(
        f"/v1/tenants/{tenant['id']}",
        json={"quota": {"executions_per_second": 5, "max_wall_seconds": 2.5}},
        headers=ADMIN,
    )
    assert response.status_code == 200
    quota = response.json()["quota"]
    assert quota["executions_per_second"] == 5 and quota["max_wall_seconds"] == 2.5
    assert client.get(f"/v1/tenants/{tenant['id']}", headers=ADMIN).json()["quota"] == quota

    response = client.patch(f"/v1/tenants/{tenant['id']}", json={"disabled": True}, headers=ADMIN)
    assert response.json()["disabled"] is True
    response = client.get("/v1/invocations", headers=tenant["headers"])
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "tenant_disabled"

    client.patch(f"/v1/tenants/{tenant['id']}", json={"disabled": False}, headers=ADMIN)
    assert client.get("/v1/invocations", headers=tenant["headers"]).status_code == 200


def test_keys_create_list_revoke(client: TestClient, new_tenant: Any) -> None:
    tenant = new_tenant()
    created = client.post(
        f"/v1/tenants/{tenant['id']}/keys", json={"name": "ci"}, headers=ADMIN
    ).json()
    second = {"Authorization": f"Bearer {created['api_key']}"}
    assert client.get("/v1/invocations", headers=second).status_code == 200

    listed = client.get(f"/v1/tenants/{tenant['id']}/keys", headers=ADMIN).json()["keys"]
    assert {k["id"] for k in listed} == {tenant["key_id"], created["id"]}
    assert all("api_key" not in k and "secret_hash" not in k for k in listed)

    response = client.delete(f"/v1/tenants/{tenant['id']}/keys/{created['id']}", headers=ADMIN)
    assert response.status_code == 200 and response.json()["revoked_at"] is not None
    response = client.get("/v1/invocations", headers=second)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    # The first key still works.
    assert client.get("/v1/invocations", headers=tenant["headers"]).status_code == 200


def test_key_of_one_tenant_cannot_be_revoked_through_another(
    client: TestClient, new_tenant: Any
) -> None:
    a, b = new_tenant(), new_tenant()
    response = client.delete(f"/v1/tenants/{b['id']}/keys/{a['key_id']}", headers=ADMIN)
    assert response.status_code == 404
    assert client.get("/v1/invocations", headers=a["headers"]).status_code == 200


def test_tenant_keys_cannot_use_admin_api(client: TestClient, new_tenant: Any) -> None:
    tenant = new_tenant()
    for method, path in [
        ("GET", "/v1/tenants"),
        ("POST", "/v1/tenants"),
        ("PATCH", f"/v1/tenants/{tenant['id']}"),
        ("POST", f"/v1/tenants/{tenant['id']}/keys"),
        ("DELETE", f"/v1/tenants/{tenant['id']}/keys/{tenant['key_id']}"),
    ]:
        response = client.request(method, path, json={}, headers=tenant["headers"])
        assert response.status_code == 403, (method, path)
        assert response.json()["error"]["code"] == "admin_required"


def test_only_the_hash_of_a_key_is_stored(client: TestClient, new_tenant: Any) -> None:
    import hashlib

    from sqlalchemy import select

    from app.db.models import ApiKey

    tenant = new_tenant()
    services = client.app.state.services  # type: ignore[attr-defined]

    async def read() -> list[tuple[str, ...]]:
        async with services.sessions() as session:
            rows = (await session.execute(select(ApiKey))).scalars().all()
            return [(r.id, r.name, r.secret_hash) for r in rows]

    rows = client.portal.call(read)  # type: ignore[union-attr]
    from app.auth import keys

    parsed = keys.parse(tenant["key"])
    assert parsed is not None
    secret = parsed.secret
    assert (tenant["key_id"], "default", hashlib.sha256(secret.encode()).hexdigest()) in rows
    assert not any(secret in value for row in rows for value in row)
