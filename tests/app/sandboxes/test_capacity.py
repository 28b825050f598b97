"""The node's capacity for sandboxes, through ``/v1/sandboxes`` (fake backend, both
stacks): a node takes no more memory and CPU than it gives its sandboxes."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.app.api.v1.test_sandboxes import create
from tests.app.sandboxes.conftest import run, services_of
from tests.app.sandboxes.test_quotas import quota, refused


@pytest.fixture
def sandbox_settings() -> dict[str, Any]:
    # the node gives its sandboxes 1 GiB and 3 CPU in all
    return {"sandbox_meter_seconds": 1e9, "sandbox_memory_mb": 1024, "sandbox_cpu": 3.0}


def test_the_node_takes_no_more_than_it_gives_sandboxes(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    client, headers = sandbox_client, tenant["headers"]
    quota(client, tenant, max_concurrent_sandboxes=8)
    too_large = client.post(
        "/v1/sandboxes", json={"backend": "fake", "memory_mb": 2048}, headers=headers
    )
    error = refused(too_large, 422, "sandbox_too_large")
    assert error["details"] == {"quota": None, "largest": {"memory_mb": 1024, "cpu": 3.0}}
    create(client, headers, memory_mb=512)
    create(client, headers, memory_mb=512)
    full = client.post("/v1/sandboxes", json={"backend": "fake", "memory_mb": 512}, headers=headers)
    refused(full, 503, "no_capacity")
    report = next(iter(run(client, services_of(client).catalogue.nodes)))
    assert report.sandbox_memory_mb == 1024 and report.sandbox_cpu == 3.0
