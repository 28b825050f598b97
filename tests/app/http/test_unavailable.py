"""A database or Redis that cannot be reached is a 503 with a stable code and
Retry-After, never a 500: clients retry a 503, and nothing was started."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from starlette.testclient import TestClient

from app.db.engine import make_engine, make_sessionmaker
from app.main import create_app
from app.settings import Settings


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_database_is_503_database_unavailable(
    client: TestClient, new_tenant: Callable[..., dict[str, Any]]
) -> None:
    tenant = new_tenant()
    services = client.app.state.services  # type: ignore[attr-defined]
    portal = client.portal
    assert portal is not None
    healthy = services.authenticator._sessions
    broken = make_engine(f"postgresql+asyncpg://corral@127.0.0.1:{closed_port()}/corral")
    services.authenticator._sessions = make_sessionmaker(broken)
    services.authenticator.cache.evict_tenant(tenant["id"])
    try:
        response = client.get("/v1/invocations", headers=tenant["headers"])
    finally:
        services.authenticator._sessions = healthy
        portal.call(broken.dispose)
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "database_unavailable"
    assert response.headers["retry-after"] == "1"
    assert client.get("/v1/invocations", headers=tenant["headers"]).status_code == 200


@pytest.mark.redis
@pytest.mark.postgres
def test_an_unreachable_redis_is_503_dispatch_unavailable(
    make_settings: Callable[..., Settings], postgres_url: str, redis_url: str
) -> None:
    settings = make_settings(
        database_url=postgres_url, redis_url=redis_url, catalogue_seconds=0.001
    )
    with TestClient(create_app(settings)) as client:
        created = client.post(
            "/v1/tenants",
            json={"name": "r"},
            headers={"Authorization": f"Bearer {settings.admin_key.get_secret_value()}"},  # type: ignore[union-attr]
        ).json()
        headers = {"Authorization": f"Bearer {created['key']['api_key']}"}
        services = client.app.state.services  # type: ignore[attr-defined]
        portal = client.portal
        assert portal is not None
        transport = services.transport
        healthy = transport._redis
        broken = Redis(host="127.0.0.1", port=closed_port(), decode_responses=True)
        transport._redis = broken
        try:
            response = client.post(
                "/v1/run", json={"language": "fake", "code": "{}"}, headers=headers
            )
        finally:
            transport._redis = healthy
            portal.call(broken.aclose)
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "dispatch_unavailable"
        again = client.post("/v1/run", json={"language": "fake", "code": "{}"}, headers=headers)
        assert again.status_code == 200, again.text
