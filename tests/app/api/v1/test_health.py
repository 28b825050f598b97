"""Operations endpoints: liveness, readiness, Prometheus metrics and the OpenAPI document."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any

from openapi_spec_validator import OpenAPIV31SpecValidator, validate
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from app.api.v1 import ENDPOINTS
from app.db.engine import make_engine

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client: TestClient) -> Samples:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_healthz(client: TestClient) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readyz_when_everything_is_up(client: TestClient) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "ready"
    assert body["database"] is True
    assert body["schema"] is True
    assert body["dispatch"] is True
    assert body["nodes"] >= 1


def test_readyz_is_503_while_the_schema_is_behind(
    make_settings: Callable[..., Any], tmp_path: Any
) -> None:
    """A gateway that does not migrate (``run_migrations=False``) is not ready on a schema
    older than its release; it is ready on its head, and on a newer release's schema."""
    import asyncio

    from sqlalchemy import text

    from app.db.migrate import upgrade
    from app.main import create_app

    data = tmp_path / "behind"
    data.mkdir()
    engine = make_engine(f"sqlite+aiosqlite:///{data}/corral.db")

    async def migrate(revision: str, sql: str | None = None) -> None:
        await upgrade(engine, revision)
        if sql:
            async with engine.begin() as conn:
                await conn.execute(text(sql))

    try:
        asyncio.run(migrate("0002"))
        settings = make_settings(data_dir=data, run_migrations=False)
        with TestClient(create_app(settings)) as client:
            behind = client.get("/readyz")
            assert behind.status_code == 503 and behind.json()["schema"] is False
            asyncio.run(migrate("head"))
            assert client.get("/readyz").status_code == 200
            asyncio.run(migrate("head", "UPDATE alembic_version SET version_num = '9999'"))
            ahead = client.get("/readyz")
            assert ahead.status_code == 200 and ahead.json()["schema"] is True
    finally:
        asyncio.run(engine.dispose())


def test_readyz_is_503_when_the_database_is_unreachable(client: TestClient) -> None:
    """The gateway's engine is swapped for one aimed at a port nothing listens on."""
    services = client.app.state.services  # type: ignore[attr-defined]
    portal = client.portal
    assert portal is not None
    healthy = services.engine
    broken = make_engine(f"postgresql+asyncpg://corral@127.0.0.1:{closed_port()}/corral")
    services.engine = broken
    try:
        response = client.get("/readyz")
    finally:
        services.engine = healthy
        portal.call(broken.dispose)
    assert response.status_code == 503, response.text
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["database"] is False
    assert body["dispatch"] is True

    assert client.get("/readyz").status_code == 200  # and ready again once it is back
    assert client.get("/healthz").status_code == 200  # liveness never depends on it


def test_metrics_count_requests_by_route_template(
    client: TestClient, new_tenant: Callable[..., dict[str, Any]]
) -> None:
    tenant = new_tenant()
    for invocation_id in ("inv_first", "inv_second"):
        response = client.get(f"/v1/invocations/{invocation_id}", headers=tenant["headers"])
        assert response.status_code == 404
    assert client.get("/no/such/route").status_code == 404

    samples = scrape(client)
    template = "/v1/invocations/{invocation_id}"
    count = sample(
        samples, "corral_http_requests_total", method="GET", route=template, status="404"
    )
    assert count == 2
    routes = {dict(labels).get("route") for (_, labels) in samples}
    assert "unmatched" in routes
    assert not any(r and ("inv_first" in r or "inv_second" in r) for r in routes)
    assert not any(r and r.startswith("/no/such") for r in routes)
    assert sample(samples, "corral_http_request_seconds_count", method="GET", route=template) == 2


def test_metrics_count_invocations_and_expose_queue_depth(
    client: TestClient, new_tenant: Callable[..., dict[str, Any]]
) -> None:
    tenant = new_tenant()
    for behaviour in ({"stdout": "ok"}, {"stdout": "ok"}, {"exit": 4}):
        response = client.post(
            "/v1/run",
            json={"language": "fake", "code": json.dumps(behaviour)},
            headers=tenant["headers"],
        )
        assert response.status_code == 200, response.text

    samples = scrape(client)
    assert sample(samples, "corral_invocations_total", kind="run", status="succeeded") == 2
    assert sample(samples, "corral_invocations_total", kind="run", status="failed") == 1
    assert sample(samples, "corral_queue_depth", queue="dispatch") == 0
    assert sample(samples, "corral_queue_depth", queue="admission") == 0
    run_posts = sample(
        samples, "corral_http_requests_total", method="POST", route="/v1/run", status="200"
    )
    assert run_posts == 3


def test_openapi_is_valid_3_1_and_lists_every_endpoint(client: TestClient) -> None:
    response = client.get("/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.1")
    validate(document, cls=OpenAPIV31SpecValidator)

    listed = {
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method in operations
    }
    assert listed == {(ep.method, ep.path) for ep in ENDPOINTS}
    operation_ids = [
        op["operationId"] for operations in document["paths"].values() for op in operations.values()
    ]
    assert len(operation_ids) == len(set(operation_ids)) == len(ENDPOINTS)


def test_openapi_documents_auth_bodies_and_path_parameters(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    run = paths["/v1/run"]["post"]
    assert run["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/RunRequest"
    )
    assert "security" in run
    assert "security" not in paths["/healthz"]["get"]
    get_inv = paths["/v1/invocations/{invocation_id}"]["get"]
    assert [p["name"] for p in get_inv["parameters"] if p["in"] == "path"] == ["invocation_id"]
    list_inv = paths["/v1/invocations"]["get"]
    assert {p["name"] for p in list_inv["parameters"] if p["in"] == "query"} >= {
        "limit",
        "status",
        "language",
        "before",
    }


def test_openapi_documents_the_streamed_exec_answer(client: TestClient) -> None:
    """``"stream": true`` answers NDJSON: the document says so (schemathesis checks that
    every answer's media type is documented)."""
    exec_op = client.get("/openapi.json").json()["paths"]["/v1/sandboxes/{sandbox_id}/exec"]["post"]
    assert set(exec_op["responses"]["200"]["content"]) == {
        "application/json",
        "application/x-ndjson",
    }
