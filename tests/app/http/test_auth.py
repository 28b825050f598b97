"""The key cache: calls in flight when a key's entry expires share one database read, and
a change to the tenant during that read is not cached over; which header's key a request
presents."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from starlette.requests import Request
from starlette.testclient import TestClient

from app.db import tenants
from app.errors import InvalidApiKey
from app.http.auth import presented_key
from tests.conftest import ADMIN


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
    authenticator = client.app.state.services.authenticator  # type: ignore[attr-defined]
    authenticator.forget_tenant(created["tenant"]["id"])

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
    authenticator = client.app.state.services.authenticator  # type: ignore[attr-defined]
    authenticator.forget_tenant(tenant["id"])
    real = tenants.find_key

    async def slow(session: Any, *, key_id: str) -> Any:
        found = await real(session, key_id=key_id)
        await asyncio.sleep(0.2)  # the tenant is disabled meanwhile
        return found

    monkeypatch.setattr(tenants, "find_key", slow)

    async def race() -> None:
        lookup = asyncio.create_task(authenticator.tenant_for(tenant["key"]))
        await asyncio.sleep(0.05)
        authenticator.forget_tenant(tenant["id"])  # what the tenants route does on a change
        await lookup

    assert client.portal is not None
    client.portal.call(race)
    assert tenant["key"] not in authenticator._cache


@pytest.mark.parametrize(
    ("headers", "presented"),
    [
        ([(b"authorization", b"Bearer  k1 ")], "k1"),
        ([(b"x-api-key", b" k2")], "k2"),
        ([(b"x-api-key", b"k2"), (b"authorization", b"bearer k1")], "k1"),
        ([(b"authorization", b"Bearer k1"), (b"authorization", b"Bearer k3")], "k1"),
        ([(b"x-api-key", b"  ")], None),
        ([], None),
    ],
)
def test_the_presented_key_comes_from_authorization_first(
    headers: list[tuple[bytes, bytes]], presented: str | None
) -> None:
    request = Request({"type": "http", "method": "GET", "path": "/", "headers": headers})
    assert presented_key(request) == presented


@pytest.mark.parametrize("value", [b"Basic abc", b"Bearer", b"Bearer   "])
def test_an_authorization_that_is_not_a_bearer_key_is_refused(value: bytes) -> None:
    request = Request(
        {"type": "http", "method": "GET", "path": "/", "headers": [(b"authorization", value)]}
    )
    with pytest.raises(InvalidApiKey):
        presented_key(request)
