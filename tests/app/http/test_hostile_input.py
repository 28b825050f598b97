"""Hostile input to the API gets a clear 4xx with a stable code and at most one log line:
deep JSON, strings that cannot be encoded, non-JSON numbers, and input schemas built to
stall the gateway (ReDoS, self-reference)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.conftest import ADMIN

REDOS = "^(a+)+$"
IDENTITY = "def handler(x):\n    return x\n"

#: (method, path, kind) of every endpoint that reads a JSON body.
BODY_ENDPOINTS = [
    ("POST", "/v1/tenants", "admin"),
    ("PATCH", "/v1/tenants/{tenant}", "admin"),
    ("POST", "/v1/tenants/{tenant}/keys", "admin"),
    ("POST", "/v1/run", "tenant"),
    ("POST", "/v1/run/batch", "tenant"),
    ("POST", "/run_code", "tenant"),
    ("POST", "/v1/functions", "tenant"),
    ("PUT", "/v1/functions/echo/aliases/stable", "tenant"),
    ("POST", "/v1/functions/echo/invoke", "tenant"),
    ("POST", "/v1/functions/echo/versions/1/invoke", "tenant"),
    ("POST", "/v1/functions/echo/invoke/batch", "tenant"),
]


@pytest.fixture
def stack() -> dict[str, Any]:
    """Input handling does not depend on the deployment shape: embedded only."""
    return {}


@pytest.fixture
def ctx(client: TestClient, new_tenant: Any) -> dict[str, Any]:
    tenant = new_tenant()
    registered = client.post(
        "/v1/functions",
        json={"name": "echo", "language": "python", "code": IDENTITY},
        headers=tenant["headers"],
    )
    assert registered.status_code == 201, registered.text
    return tenant


def _call(
    client: TestClient, ctx: dict[str, Any], method: str, path: str, kind: str, raw: bytes
) -> Any:
    headers = dict(ADMIN if kind == "admin" else ctx["headers"])
    return client.request(
        method,
        path.format(tenant=ctx["id"]),
        content=raw,
        headers=headers | {"Content-Type": "application/json"},
    )


def _refused(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code, error
    assert "Traceback" not in response.text
    return error


def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing logged at ERROR, no traceback, no line longer than a line."""
    for record in caplog.records:
        assert record.levelno < logging.ERROR, record.getMessage()
        assert record.exc_info is None, record.getMessage()
        assert "\n" not in record.getMessage()


@pytest.mark.parametrize(("method", "path", "kind"), BODY_ENDPOINTS)
@pytest.mark.parametrize("depth", [100, 100_000])
def test_deep_json_is_400_and_one_log_line_at_most(
    client: TestClient,
    ctx: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
    method: str,
    path: str,
    kind: str,
    depth: int,
) -> None:
    caplog.set_level(logging.INFO)
    raw = b"[" * depth + b"]" * depth
    error = _refused(_call(client, ctx, method, path, kind, raw), 400, "too_deeply_nested")
    assert "64" in error["message"]
    _quiet(caplog)


@pytest.mark.parametrize(("method", "path", "kind"), BODY_ENDPOINTS)
@pytest.mark.parametrize("escape", [b"x\\udc00y", b"\\ude00\\ud83d"], ids=["lone", "reversed"])
def test_lone_surrogates_are_400(
    client: TestClient,
    ctx: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
    method: str,
    path: str,
    kind: str,
    escape: bytes,
) -> None:
    caplog.set_level(logging.INFO)
    for raw in (b'{"name": "' + escape + b'"}', b'{"' + escape + b'": 1}', b'["' + escape + b'"]'):
        error = _refused(_call(client, ctx, method, path, kind, raw), 400, "invalid_json")
        assert "surrogate" in error["message"]
    _quiet(caplog)


def test_lone_surrogates_in_every_field_of_a_registration(
    client: TestClient, ctx: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """What schemathesis found: POST /v1/functions answered 500 to a lone surrogate."""
    caplog.set_level(logging.INFO)
    body = '"name": "f", "language": "python", "code": "def handler(x):\\n    return x\\n"'
    for field in ("code", "language", "entry_point"):
        raw = "{" + body.replace(f'"{field}": "', f'"{field}": "\\udcff') + "}"
        if field == "entry_point":
            raw = "{" + body + ', "entry_point": "h\\udcff"}'
        response = _call(client, ctx, "POST", "/v1/functions", "tenant", raw.encode())
        _refused(response, 400, "invalid_json")
    response = _call(
        client,
        ctx,
        "POST",
        "/v1/functions",
        "tenant",
        ("{" + body + ', "input_schema": {"pattern": "\\ud800"}}').encode(),
    )
    _refused(response, 400, "invalid_json")
    _quiet(caplog)


@pytest.mark.parametrize("raw", [b"NaN", b'{"x": Infinity}', b"[-Infinity]", b"1" * 5000])
def test_numbers_json_does_not_have_are_400(
    client: TestClient, ctx: dict[str, Any], raw: bytes
) -> None:
    response = _call(client, ctx, "POST", "/v1/functions/echo/invoke", "tenant", raw)
    _refused(response, 400, "invalid_json")


def test_deep_input_within_the_bound_reaches_the_schema(
    client: TestClient, ctx: dict[str, Any]
) -> None:
    nested = b"[" * 60 + b"]" * 60
    response = _call(client, ctx, "POST", "/v1/functions/echo/invoke", "tenant", nested)
    # Parsed and validated; nothing runs Python on this stack (the fake runtime only).
    _refused(response, 400, "unsupported_runtime")


class TestReDoS:
    """The confirmed finding: ``^(a+)+$`` and 25 characters stalled the gateway 2.2 s."""

    def test_the_engine_is_re2(self) -> None:
        import re2

        from app.functions.regex import compile_pattern

        assert type(compile_pattern(REDOS)) is type(re2.compile("a"))

    def test_backtracking_pattern_is_answered_by_a_linear_engine(
        self, client: TestClient, ctx: dict[str, Any]
    ) -> None:
        self.test_the_engine_is_re2()  # first, so that the unfixed code fails here, not hangs
        headers = ctx["headers"]
        registered = client.post(
            "/v1/functions",
            json={
                "name": "redos",
                "language": "python",
                "code": IDENTITY,
                "input_schema": {"type": "string", "pattern": REDOS},
            },
            headers=headers,
        )
        assert registered.status_code == 201, registered.text
        for length in (25, 30, 100_000):
            error = _refused(
                client.post("/v1/functions/redos/invoke", json="a" * length + "!", headers=headers),
                422,
                "input_validation_error",
            )
            assert "does not match" in error["message"]
        batch = client.post(
            "/v1/functions/redos/invoke/batch",
            json={"inputs": ["a" * 30 + "!"] * 256},
            headers=headers,
        )
        assert batch.status_code == 200, batch.text
        results = batch.json()["results"]
        assert len(results) == 256
        assert {item["error"]["code"] for item in results} == {"input_validation_error"}

    @pytest.mark.parametrize(
        "schema",
        [
            {"type": "string", "pattern": r"^(a+)\1$"},
            {"type": "string", "pattern": "^(?=a)(a+)+$"},
            {"type": "object", "patternProperties": {"(?<!x)y": {}}},
        ],
    )
    def test_patterns_re2_cannot_run_are_refused_at_registration(
        self, client: TestClient, ctx: dict[str, Any], schema: dict[str, Any]
    ) -> None:
        response = client.post(
            "/v1/functions",
            json={"name": "bad", "language": "python", "code": IDENTITY, "input_schema": schema},
            headers=ctx["headers"],
        )
        error = _refused(response, 422, "invalid_input_schema")
        assert "cannot be used" in error["message"]


@pytest.mark.parametrize(
    "schema",
    [{"$ref": "#"}, {"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}],
)
def test_self_referencing_schema_is_refused_at_registration(
    client: TestClient, ctx: dict[str, Any], caplog: pytest.LogCaptureFixture, schema: Any
) -> None:
    caplog.set_level(logging.INFO)
    response = client.post(
        "/v1/functions",
        json={"name": "loop", "language": "python", "code": IDENTITY, "input_schema": schema},
        headers=ctx["headers"],
    )
    error = _refused(response, 422, "invalid_input_schema")
    assert "refers to itself" in error["message"]
    _quiet(caplog)


def test_a_recursion_error_anywhere_is_400_in_one_line(
    client: TestClient,
    ctx: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The backstop: should a RecursionError escape some handler, the answer is a 400 and
    the log one line, not a 500 with a 4,000-line traceback."""
    from app.functions import service

    def recurse(*args: Any, **kwargs: Any) -> Any:
        return recurse()

    monkeypatch.setattr(service, "target", recurse)
    caplog.set_level(logging.INFO)
    response = client.post("/v1/functions/echo/invoke", json=1, headers=ctx["headers"])
    _refused(response, 400, "too_deeply_nested")
    _quiet(caplog)
    assert len([r for r in caplog.records if "recursion" in r.getMessage()]) == 1
