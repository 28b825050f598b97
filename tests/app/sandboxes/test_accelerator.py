"""What runs a sandbox's machine, through ``/v1/sandboxes`` (fake backend reporting an
accelerator as the microVM backend does, both stacks): the node's report names it per
backend, each sandbox's record keeps it; a backend no node offers is refused naming those
on offer."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.app.api.v1.test_sandboxes import create
from tests.app.sandboxes.conftest import run, services_of
from tests.app.sandboxes.test_quotas import refused


@pytest.fixture
def sandbox_settings() -> dict[str, Any]:
    return {"sandbox_meter_seconds": 1e9, "fake": {"sandbox_accelerator": "tcg"}}


def test_the_accelerator_is_in_the_nodes_report_and_the_sandboxs_record(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    client, headers = sandbox_client, tenant["headers"]
    made = create(client, headers)
    assert made["accelerator"] == "tcg"
    assert client.get(f"/v1/sandboxes/{made['id']}", headers=headers).json()["accelerator"] == "tcg"
    listed = client.get("/v1/sandboxes", headers=headers).json()["sandboxes"]
    assert [s["accelerator"] for s in listed] == ["tcg"]
    report = next(iter(run(client, services_of(client).catalogue.nodes)))
    assert report.sandbox_accelerators == {"fake": "tcg"}


def test_a_backend_no_node_offers_is_refused_with_those_on_offer(
    sandbox_client: TestClient, tenant: dict[str, Any]
) -> None:
    client, headers = sandbox_client, tenant["headers"]
    create(client, headers)  # the node has reported
    response = client.post("/v1/sandboxes", json={"backend": "microvm"}, headers=headers)
    error = refused(response, 422, "backend_not_offered")
    assert error["details"] == {"backend": "microvm", "offered": ["fake"]}
