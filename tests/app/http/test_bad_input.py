"""Bad input to every endpoint gets a clear 4xx with a stable code: never a 500."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.conftest import ADMIN

# (method, path template, a valid body or None) for every endpoint taking a body.
BODY_ENDPOINTS = [
    ("POST", "/v1/tenants", {"name": "ok"}, "admin"),
    ("PATCH", "/v1/tenants/{tenant}", {"disabled": False}, "admin"),
    ("POST", "/v1/tenants/{tenant}/keys", {"name": "k"}, "admin"),
    ("POST", "/v1/run", {"language": "fake", "code": "{}"}, "tenant"),
    ("POST", "/v1/sandboxes", {"backend": "fake"}, "tenant"),
    ("POST", "/v1/sandboxes/sbx_0/timeout", {"ttl_s": 60}, "tenant"),
    ("POST", "/v1/sandboxes/sbx_0/fork", {"count": 1}, "tenant"),
]
AUTH_ENDPOINTS = [
    ("POST", "/v1/tenants", "admin"),
    ("GET", "/v1/tenants", "admin"),
    ("GET", "/v1/tenants/{tenant}", "admin"),
    ("PATCH", "/v1/tenants/{tenant}", "admin"),
    ("POST", "/v1/tenants/{tenant}/keys", "admin"),
    ("GET", "/v1/tenants/{tenant}/keys", "admin"),
    ("DELETE", "/v1/tenants/{tenant}/keys/{key}", "admin"),
    ("POST", "/v1/run", "tenant"),
    ("GET", "/v1/invocations", "tenant"),
    ("GET", "/v1/invocations/inv_0", "tenant"),
    ("GET", "/v1/runtimes", "tenant"),
    ("POST", "/v1/sandboxes", "tenant"),
    ("GET", "/v1/sandboxes", "tenant"),
    ("GET", "/v1/sandboxes/sbx_0", "tenant"),
    ("POST", "/v1/sandboxes/sbx_0/timeout", "tenant"),
    ("GET", "/v1/snapshots", "tenant"),
]


@pytest.fixture
def stack() -> dict[str, Any]:
    """Input handling does not depend on the deployment shape: embedded only."""
    return {}


@pytest.fixture
def ctx(client: TestClient, new_tenant: Any) -> dict[str, Any]:
    tenant = new_tenant()
    return {"tenant": tenant["id"], "key": tenant["key_id"], "headers": tenant["headers"]}


def _url(path: str, ctx: dict[str, Any]) -> str:
    return path.format(tenant=ctx["tenant"], key=ctx["key"])


def _headers(kind: str, ctx: dict[str, Any]) -> dict[str, str]:
    return dict(ADMIN if kind == "admin" else ctx["headers"])


def _assert_error(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"]["code"] == code, body
    assert body["error"]["message"]
    assert "Traceback" not in response.text


@pytest.mark.parametrize(("method", "path", "valid", "kind"), BODY_ENDPOINTS)
class TestBodies:
    def test_malformed_json(
        self, client: TestClient, ctx: Any, method: str, path: str, valid: Any, kind: str
    ) -> None:
        response = client.request(
            method,
            _url(path, ctx),
            content=b'{"name": ',
            headers=_headers(kind, ctx) | {"Content-Type": "application/json"},
        )
        _assert_error(response, 400, "invalid_json")

    def test_empty_body(
        self, client: TestClient, ctx: Any, method: str, path: str, valid: Any, kind: str
    ) -> None:
        response = client.request(method, _url(path, ctx), headers=_headers(kind, ctx))
        _assert_error(response, 400, "invalid_json")

    def test_not_an_object(
        self, client: TestClient, ctx: Any, method: str, path: str, valid: Any, kind: str
    ) -> None:
        response = client.request(method, _url(path, ctx), json=[1, 2], headers=_headers(kind, ctx))
        _assert_error(response, 422, "validation_error")

    def test_unknown_field(
        self, client: TestClient, ctx: Any, method: str, path: str, valid: Any, kind: str
    ) -> None:
        response = client.request(
            method, _url(path, ctx), json=valid | {"bogus": 1}, headers=_headers(kind, ctx)
        )
        _assert_error(response, 422, "validation_error")
        assert response.json()["error"]["details"][0]["loc"] == ["body", "bogus"]

    def test_wrong_type(
        self, client: TestClient, ctx: Any, method: str, path: str, valid: Any, kind: str
    ) -> None:
        wrong = {k: {"nested": ["x"]} for k in valid}
        response = client.request(method, _url(path, ctx), json=wrong, headers=_headers(kind, ctx))
        _assert_error(response, 422, "validation_error")

    def test_oversized_body(
        self, client: TestClient, ctx: Any, method: str, path: str, valid: Any, kind: str
    ) -> None:
        limit = client.app.state.settings.max_body_bytes  # type: ignore[attr-defined]
        big = b'{"name": "' + b"x" * limit + b'"}'
        response = client.request(
            method,
            _url(path, ctx),
            content=big,
            headers=_headers(kind, ctx) | {"Content-Type": "application/json"},
        )
        _assert_error(response, 413, "payload_too_large")

    def test_wrong_content_type(
        self, client: TestClient, ctx: Any, method: str, path: str, valid: Any, kind: str
    ) -> None:
        response = client.request(
            method,
            _url(path, ctx),
            content=b"name=x",
            headers=_headers(kind, ctx) | {"Content-Type": "application/x-www-form-urlencoded"},
        )
        _assert_error(response, 415, "unsupported_media_type")


@pytest.mark.parametrize(("method", "path", "kind"), AUTH_ENDPOINTS)
class TestCredentials:
    def test_missing_key(
        self, client: TestClient, ctx: Any, method: str, path: str, kind: str
    ) -> None:
        response = client.request(method, _url(path, ctx))
        _assert_error(response, 401, "missing_api_key")
        assert response.headers["www-authenticate"].startswith("Bearer")

    def test_garbage_key(
        self, client: TestClient, ctx: Any, method: str, path: str, kind: str
    ) -> None:
        response = client.request(method, _url(path, ctx), headers={"X-API-Key": "nope"})
        expected = (403, "admin_required") if kind == "admin" else (401, "invalid_api_key")
        _assert_error(response, *expected)

    def test_wellformed_unknown_key(
        self, client: TestClient, ctx: Any, method: str, path: str, kind: str
    ) -> None:
        fake = "crl_key_" + "0" * 20 + "_" + "A" * 43
        response = client.request(method, _url(path, ctx), headers={"X-API-Key": fake})
        expected = (403, "admin_required") if kind == "admin" else (401, "invalid_api_key")
        _assert_error(response, *expected)

    def test_wrong_secret_for_a_real_key_id(
        self, client: TestClient, ctx: Any, method: str, path: str, kind: str
    ) -> None:
        forged = f"crl_{ctx['key']}_" + "B" * 43
        response = client.request(method, _url(path, ctx), headers={"X-API-Key": forged})
        expected = (403, "admin_required") if kind == "admin" else (401, "invalid_api_key")
        _assert_error(response, *expected)

    def test_bad_authorization_scheme(
        self, client: TestClient, ctx: Any, method: str, path: str, kind: str
    ) -> None:
        response = client.request(method, _url(path, ctx), headers={"Authorization": "Basic x"})
        _assert_error(response, 401, "invalid_api_key")


def test_unknown_tenant_and_key(client: TestClient, ctx: Any) -> None:
    for method, path in [
        ("GET", "/v1/tenants/ten_missing"),
        ("PATCH", "/v1/tenants/ten_missing"),
        ("POST", "/v1/tenants/ten_missing/keys"),
        ("GET", "/v1/tenants/ten_missing/keys"),
        ("DELETE", f"/v1/tenants/{ctx['tenant']}/keys/key_missing"),
    ]:
        _assert_error(client.request(method, path, json={}, headers=ADMIN), 404, "not_found")


def test_unknown_route_and_method(client: TestClient, ctx: Any) -> None:
    _assert_error(client.get("/v1/nothing-here"), 404, "not_found")
    _assert_error(client.put("/v1/run", headers=ctx["headers"]), 405, "method_not_allowed")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": ""}, "name"),
        ({"name": "has space"}, "name"),
        ({"name": "x" * 200}, "name"),
        ({"name": "ok", "quota": {"max_concurrent_executions": 0}}, "max_concurrent_executions"),
        ({"name": "ok", "quota": {"executions_per_second": -1}}, "executions_per_second"),
        ({"name": "ok", "quota": {"max_memory_mb": 1}}, "max_memory_mb"),
        ({"name": "ok", "quota": {"nonsense": 1}}, "nonsense"),
    ],
)
def test_tenant_field_validation(client: TestClient, body: dict[str, Any], field: str) -> None:
    response = client.post("/v1/tenants", json=body, headers=ADMIN)
    _assert_error(response, 422, "validation_error")
    assert field in response.json()["error"]["details"][0]["loc"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"code": "x"}, "language"),
        ({"language": "fake"}, "code"),
        ({"language": "fake", "code": "", "run_timeout": 0}, "run_timeout"),
        ({"language": "fake", "code": "", "run_timeout": "soon"}, "run_timeout"),
        ({"language": "fake", "code": "", "memory_limit_mb": 4}, "memory_limit_mb"),
        ({"language": "fake", "code": "", "files": ["a"]}, "files"),
    ],
)
def test_run_field_validation(
    client: TestClient, ctx: Any, body: dict[str, Any], field: str
) -> None:
    response = client.post("/v1/run", json=body, headers=ctx["headers"])
    _assert_error(response, 422, "validation_error")
    assert field in response.json()["error"]["details"][0]["loc"]


def test_run_limits_over_quota(client: TestClient, new_tenant: Any) -> None:
    tenant = new_tenant(max_memory_mb=256, max_wall_seconds=5)
    body = {"language": "fake", "code": "{}"}
    response = client.post(
        "/v1/run", json=body | {"memory_limit_mb": 512}, headers=tenant["headers"]
    )
    _assert_error(response, 422, "limit_too_high")
    response = client.post("/v1/run", json=body | {"run_timeout": 6}, headers=tenant["headers"])
    _assert_error(response, 422, "limit_too_high")


def test_run_unknown_language(client: TestClient, ctx: Any) -> None:
    response = client.post(
        "/v1/run", json={"language": "cobol", "code": ""}, headers=ctx["headers"]
    )
    _assert_error(response, 400, "unsupported_runtime")


@pytest.mark.parametrize(
    "query",
    [
        "limit=0",
        "limit=abc",
        "limit=100000",
        "status=exploded",
        "kind=nope",
        "before=yesterday",
        "bogus=1",
    ],
)
def test_invocation_query_validation(client: TestClient, ctx: Any, query: str) -> None:
    response = client.get(f"/v1/invocations?{query}", headers=ctx["headers"])
    _assert_error(response, 422, "validation_error")


@pytest.mark.parametrize("query", ["limit=0", "limit=x", "after=" + "z" * 100, "bogus=1"])
def test_tenant_list_query_validation(client: TestClient, query: str) -> None:
    response = client.get(f"/v1/tenants?{query}", headers=ADMIN)
    _assert_error(response, 422, "validation_error")


@pytest.mark.parametrize(
    "query",
    [
        "limit=0",
        "limit=x",
        "state=exploded",
        "backend=NOT%20A%20BACKEND",
        "image=",
        "cursor=yesterday",
        "cursor=" + "z" * 200,
        "metadata.=x",
        "metadata=episode%3D7",
        "metadata.episode=7&metadata.episode=8",
        "&".join(f"metadata.k{n}=v" for n in range(17)),
        "bogus=1",
    ],
)
def test_sandbox_list_query_validation(client: TestClient, ctx: Any, query: str) -> None:
    response = client.get(f"/v1/sandboxes?{query}", headers=ctx["headers"])
    _assert_error(response, 422, "validation_error")


@pytest.mark.parametrize("query", ["limit=0", "state=live", "bogus=1"])
def test_snapshot_list_query_validation(client: TestClient, ctx: Any, query: str) -> None:
    response = client.get(f"/v1/snapshots?{query}", headers=ctx["headers"])
    _assert_error(response, 422, "validation_error")


def test_a_sandbox_past_the_lifetime_quota_is_refused(client: TestClient, new_tenant: Any) -> None:
    tenant = new_tenant(max_sandbox_lifetime_seconds=60)
    response = client.post(
        "/v1/sandboxes", json={"backend": "fake", "ttl_s": 61}, headers=tenant["headers"]
    )
    _assert_error(response, 422, "lifetime_too_long")
