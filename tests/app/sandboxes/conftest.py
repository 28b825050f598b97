"""The sandbox API's fixtures (``tests.app.api.v1.test_sandboxes``: the embedded node on
the fake backend, both stacks), with a reconciler that records no live sandbox's usage by
itself: the tests meter at the moments they choose."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from starlette.testclient import TestClient

from app.services import Services
from tests.app.api.v1.test_sandboxes import sandbox_client, tenant

__all__ = ["run", "sandbox_client", "services_of", "tenant"]


@pytest.fixture
def sandbox_settings() -> dict[str, Any]:
    return {"sandbox_meter_seconds": 1e9}


def services_of(client: TestClient) -> Services:
    services: Services = client.app.state.services  # type: ignore[attr-defined]
    return services


def run[T](client: TestClient, work: Callable[[], Awaitable[T]]) -> T:
    """``work`` on the app's event loop."""
    return client.portal.call(work)  # type: ignore[union-attr]
