"""The authenticator and its one key cache, through a gateway on both stacks: calls in
flight when a key's entry expires share one database read; a change to the tenant during
that read is not cached over; the cache holds no key in clear and keeps its bound; a
revoked key is refused at once, on the gateway that revoked it and (cluster) on another
that had it cached."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.db import tenants
from app.main import create_app
from app.settings import Settings
from tests.conftest import ADMIN


def _authenticator(client: TestClient) -> Any:
    return client.app.state.services.authenticator  # type: ignore[attr-defined]


def test_calls_that_miss_together_read_the_key_once(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    created = client.post("/v1/tenants", json={"name": "a"}, headers=ADMIN).json()
    key = created["key"]["api_key"]
    reads: list[str] = []
    real = tenants.find_key

    async def counted(session: Any, *, key_id: str) -> Any:
        reads.append(key_id)
        await asyncio.sleep(0.05)
        return await real(session, key_id=key_id)

    monkeypatch.setattr(tenants, "find_key", counted)
    authenticator = _authenticator(client)
    authenticator.cache.evict_tenant(created["tenant"]["id"])

    async def many() -> set[str]:
        found = await asyncio.gather(*(authenticator.tenant_for(key) for _ in range(20)))
        return {p.tenant_id for p in found}

    assert client.portal is not None
    assert client.portal.call(many) == {created["tenant"]["id"]}
    assert len(reads) == 1


def test_a_tenant_disabled_during_a_lookup_is_not_cached_enabled(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, new_tenant: Callable[..., dict[str, Any]]
) -> None:
    tenant = new_tenant()
    authenticator = _authenticator(client)
    authenticator.cache.evict_tenant(tenant["id"])
    real = tenants.find_key

    async def slow(session: Any, *, key_id: str) -> Any:
        found = await real(session, key_id=key_id)
        await asyncio.sleep(0.2)  # the tenant is disabled meanwhile
        return found

    monkeypatch.setattr(tenants, "find_key", slow)

    async def race() -> None:
        lookup = asyncio.create_task(authenticator.tenant_for(tenant["key"]))
        await asyncio.sleep(0.05)
        await authenticator.revoked(tenant["id"])  # what the tenants route does on a change
        await lookup

    assert client.portal is not None
    client.portal.call(race)
    assert authenticator.cache.digest(tenant["key"]) not in authenticator.cache


def test_the_cache_holds_no_key_in_clear(
    client: TestClient, new_tenant: Callable[..., dict[str, Any]]
) -> None:
    tenant = new_tenant()
    assert client.get("/v1/usage", headers=tenant["headers"]).status_code == 200
    cache = _authenticator(client).cache
    assert len(cache) >= 1
    secret = tenant["key"].rsplit("_", 1)[1].encode()
    for digest, (_, principal) in cache._entries.items():
        assert isinstance(digest, bytes) and secret not in digest
        assert tenant["key"] not in repr(principal)
    assert tenant["key"] not in repr(cache._entries)


def test_the_cache_keeps_its_bound(
    make_settings: Callable[..., Settings], stack: dict[str, Any]
) -> None:
    with TestClient(create_app(make_settings(auth_cache_size=3, **stack))) as client:
        keys = [
            client.post("/v1/tenants", json={"name": f"b{i}"}, headers=ADMIN).json()["key"][
                "api_key"
            ]
            for i in range(6)
        ]
        for key in keys:
            response = client.get("/v1/usage", headers={"Authorization": f"Bearer {key}"})
            assert response.status_code == 200, response.text
        cache = _authenticator(client).cache
        assert len(cache) == 3
        # the least recently used went first: the last three are the ones kept
        assert [cache.digest(k) in cache for k in keys] == [False] * 3 + [True] * 3


def _revoke(client: TestClient, tenant: dict[str, Any]) -> None:
    revoked = client.delete(f"/v1/tenants/{tenant['id']}/keys/{tenant['key_id']}", headers=ADMIN)
    assert revoked.status_code == 200, revoked.text


def test_a_revoked_key_is_refused_at_once(
    make_settings: Callable[..., Settings], stack: dict[str, Any]
) -> None:
    with TestClient(create_app(make_settings(auth_cache_seconds=3600, **stack))) as client:
        made = client.post("/v1/tenants", json={"name": "r"}, headers=ADMIN).json()
        tenant = {"id": made["tenant"]["id"], "key_id": made["key"]["id"]}
        headers = {"Authorization": f"Bearer {made['key']['api_key']}"}
        assert client.get("/v1/usage", headers=headers).status_code == 200  # cached
        _revoke(client, tenant)
        refused = client.get("/v1/usage", headers=headers)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.parametrize("change", ["revoke", "disable"])
def test_a_key_revoked_on_one_gateway_is_refused_at_once_on_another(
    make_settings: Callable[..., Settings],
    postgres_url: str,
    redis_url: str,
    tmp_path: Path,
    change: str,
) -> None:
    shared = {
        "database_url": postgres_url,
        "redis_url": redis_url,
        "auth_cache_seconds": 3600,  # only the revocation can end the entry
        "auth_revocation_check_seconds": 0,
    }
    with (
        TestClient(create_app(make_settings(data_dir=tmp_path / "a", **shared))) as a,
        TestClient(create_app(make_settings(data_dir=tmp_path / "b", **shared))) as b,
    ):
        made = a.post("/v1/tenants", json={"name": "x"}, headers=ADMIN).json()
        tenant = {"id": made["tenant"]["id"], "key_id": made["key"]["id"]}
        headers = {"Authorization": f"Bearer {made['key']['api_key']}"}
        assert b.get("/v1/usage", headers=headers).status_code == 200  # cached on b
        assert b.get("/v1/usage", headers=headers).status_code == 200
        if change == "revoke":
            _revoke(a, tenant)
        else:
            patched = a.patch(f"/v1/tenants/{tenant['id']}", json={"disabled": True}, headers=ADMIN)
            assert patched.status_code == 200, patched.text
        refused = b.get("/v1/usage", headers=headers)
    assert refused.status_code == (401 if change == "revoke" else 403)
