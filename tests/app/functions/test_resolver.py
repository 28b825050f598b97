"""Resolving a function and version without a database read per call: an alias moved
through this gateway applies at once, one moved by another gateway within the TTL, and
concurrent misses share one read."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.db import functions as repo
from app.functions.resolver import Resolver
from app.main import create_app
from app.settings import Settings
from tests.conftest import ADMIN

CODE = "def handler(event):\n    return {VERSION}\n"


def setup(client: TestClient) -> tuple[str, dict[str, str]]:
    created = client.post("/v1/tenants", json={"name": "r"}, headers=ADMIN).json()
    headers = {"Authorization": f"Bearer {created['key']['api_key']}"}
    for n in (1, 2):
        body = {"name": "f", "language": "python", "code": CODE.replace("{VERSION}", str(n))}
        assert client.post("/v1/functions", json=body, headers=headers).status_code == 201
    return created["tenant"]["id"], headers


def move_elsewhere(client: TestClient, tenant_id: str, version: int) -> None:
    """Point alias ``stable`` at ``version`` as another gateway would: in the database,
    without this gateway's ``forget``."""
    services = client.app.state.services  # type: ignore[attr-defined]

    async def move() -> None:
        async with services.sessions.begin() as session:
            await repo.set_alias(
                session, tenant_id=tenant_id, name="f", alias="stable", version=version
            )

    assert client.portal is not None
    client.portal.call(move)


def resolved(client: TestClient, tenant_id: str, ref: str | None) -> int:
    services = client.app.state.services  # type: ignore[attr-defined]

    async def resolve() -> int:
        _, version = await services.resolver.resolve(tenant_id, "f", ref)
        return int(version.version)

    assert client.portal is not None
    return int(client.portal.call(resolve))


def test_a_change_through_this_gateway_applies_at_once(
    make_settings: Callable[..., Settings],
) -> None:
    with TestClient(create_app(make_settings(function_cache_seconds=3600))) as client:
        tenant_id, headers = setup(client)
        assert resolved(client, tenant_id, None) == 2
        moved = client.put("/v1/functions/f/aliases/stable", json={"version": 1}, headers=headers)
        assert moved.status_code == 200, moved.text
        assert resolved(client, tenant_id, "stable") == 1
        moved = client.put("/v1/functions/f/aliases/stable", json={"version": 2}, headers=headers)
        assert resolved(client, tenant_id, "stable") == 2
        assert client.delete("/v1/functions/f", headers=headers).status_code == 204
        with pytest.raises(Exception, match="no function"):
            resolved(client, tenant_id, "stable")


@pytest.mark.parametrize("ttl", [0.0, 0.3])
def test_another_gateways_change_applies_within_the_ttl(
    make_settings: Callable[..., Settings], ttl: float
) -> None:
    with TestClient(create_app(make_settings(function_cache_seconds=ttl))) as client:
        tenant_id, _ = setup(client)
        move_elsewhere(client, tenant_id, 1)
        assert resolved(client, tenant_id, "stable") == 1
        move_elsewhere(client, tenant_id, 2)
        if ttl:
            assert resolved(client, tenant_id, "stable") == 1  # trusted for the TTL
            asyncio.run(asyncio.sleep(ttl))
        assert resolved(client, tenant_id, "stable") == 2


def test_concurrent_misses_share_one_read(
    monkeypatch: pytest.MonkeyPatch, client: TestClient
) -> None:
    reads: list[str] = []
    real_get = repo.get

    async def counted(session: Any, *, tenant_id: str, name: str) -> Any:
        reads.append(name)
        await asyncio.sleep(0.05)
        return await real_get(session, tenant_id=tenant_id, name=name)

    monkeypatch.setattr(repo, "get", counted)
    services = client.app.state.services  # type: ignore[attr-defined]
    created = client.post("/v1/tenants", json={"name": "c"}, headers=ADMIN).json()
    headers = {"Authorization": f"Bearer {created['key']['api_key']}"}
    body = {"name": "f", "language": "python", "code": CODE.replace("{VERSION}", "1")}
    assert client.post("/v1/functions", json=body, headers=headers).status_code == 201
    resolver = Resolver(services.sessions, ttl_s=60)
    tenant_id = created["tenant"]["id"]

    async def many() -> list[int]:
        found = await asyncio.gather(*(resolver.resolve(tenant_id, "f", None) for _ in range(20)))
        return [v.version for _, v in found]

    assert client.portal is not None
    assert client.portal.call(many) == [1] * 20
    assert reads == ["f"]
