"""A tenant's own API keys (``/v1/keys``): made, listed with their last use, revoked by
the tenant itself (newcomer review 3, #8: only the admin could); never another's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.testclient import TestClient

from tests.app.sandboxes.conftest import run, services_of
from tests.conftest import ADMIN


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_tenant_rotates_its_own_key(
    client: TestClient, new_tenant: Callable[..., dict[str, Any]]
) -> None:
    tenant, other = new_tenant(), new_tenant()
    listed = client.get("/v1/keys", headers=tenant["headers"])
    assert listed.status_code == 200, listed.text
    [first] = listed.json()["keys"]
    assert first["id"] == tenant["key_id"] and first["revoked_at"] is None

    made = client.post("/v1/keys", json={"name": "ci"}, headers=tenant["headers"])
    assert made.status_code == 201, made.text
    new = made.json()
    assert new["name"] == "ci" and new["api_key"].startswith(f"crl_{new['id']}_")
    assert client.get("/v1/keys", headers=bearer(new["api_key"])).status_code == 200

    # another tenant neither sees nor revokes it
    theirs = client.get("/v1/keys", headers=other["headers"]).json()["keys"]
    assert [k["id"] for k in theirs] == [other["key_id"]]
    refused = client.delete(f"/v1/keys/{new['id']}", headers=other["headers"])
    assert refused.status_code == 404
    assert client.get("/v1/keys", headers=bearer(new["api_key"])).status_code == 200

    # the old key revoked with the new one: refused at once
    gone = client.delete(f"/v1/keys/{first['id']}", headers=bearer(new["api_key"]))
    assert gone.status_code == 200 and gone.json()["revoked_at"] is not None
    assert client.get("/v1/keys", headers=tenant["headers"]).status_code == 401
    assert client.post("/v1/keys", json={"name": "x"}).status_code == 401


def test_a_keys_last_use_is_shown(
    client: TestClient, new_tenant: Callable[..., dict[str, Any]]
) -> None:
    tenant = new_tenant()
    unused = client.post("/v1/keys", json={"name": "spare"}, headers=tenant["headers"]).json()
    client.get("/v1/invocations", headers=tenant["headers"])  # the first key is used
    key_use = services_of(client).authenticator.key_use
    assert key_use is not None
    assert run(client, key_use.flush) >= 1
    keys = {k["id"]: k for k in client.get("/v1/keys", headers=tenant["headers"]).json()["keys"]}
    assert keys[tenant["key_id"]]["last_used_at"] is not None
    assert keys[unused["id"]]["last_used_at"] is None
    seen_by_admin = client.get(f"/v1/tenants/{tenant['id']}/keys", headers=ADMIN).json()["keys"]
    assert {k["id"]: k["last_used_at"] is not None for k in seen_by_admin} == {
        tenant["key_id"]: True,
        unused["id"]: False,
    }
