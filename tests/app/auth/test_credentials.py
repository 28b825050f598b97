"""The one credential reader: which headers each surface reads, and a request carrying
two different credentials refused with the same 400 on every surface (the API, E2B's
control plane and in-sandbox calls, the node-facing routes), never read as one key here
and another there."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from starlette.requests import Request
from starlette.testclient import TestClient

from app.auth import credentials
from app.auth.credentials import API, E2B_CONTROL, E2B_SANDBOX, NODE
from app.errors import ConflictingCredentials, InvalidApiKey


def request_with(headers: list[tuple[bytes, bytes]]) -> Request:
    return Request({"type": "http", "method": "GET", "path": "/", "headers": headers})


@pytest.mark.parametrize(
    ("headers", "presented"),
    [
        ([(b"authorization", b"Bearer  k1 ")], "k1"),
        ([(b"x-api-key", b" k2")], "k2"),
        ([(b"x-api-key", b"k1"), (b"authorization", b"bearer k1")], "k1"),  # the same key
        ([(b"authorization", b"Bearer k1"), (b"authorization", b"Bearer k1")], "k1"),
        ([(b"x-api-key", b"  "), (b"authorization", b"Bearer k1")], "k1"),  # empty: absent
        ([(b"x-api-key", b"  ")], None),
        ([(b"x-access-token", b"k9")], None),  # not read on the API
        ([], None),
    ],
)
def test_the_api_reads_bearer_and_x_api_key(
    headers: list[tuple[bytes, bytes]], presented: str | None
) -> None:
    assert credentials.presented(request_with(headers), API) == presented
    assert credentials.presented(request_with(headers), E2B_CONTROL) == presented


@pytest.mark.parametrize(
    ("headers", "presented"),
    [
        ([(b"x-access-token", b"t1")], "t1"),
        ([(b"e2b-traffic-access-token", b"t2")], "t2"),
        ([(b"x-api-key", b"k3")], "k3"),
        # Authorization is the user a call acts as there (Basic), never a credential
        ([(b"authorization", b"Basic dXNlcjo="), (b"x-access-token", b"t1")], "t1"),
        ([(b"authorization", b"Bearer k1")], None),
    ],
)
def test_in_sandbox_calls_read_the_access_token_headers(
    headers: list[tuple[bytes, bytes]], presented: str | None
) -> None:
    assert credentials.presented(request_with(headers), E2B_SANDBOX) == presented


@pytest.mark.parametrize(
    ("surface", "headers"),
    [
        (API, [(b"x-api-key", b"k2"), (b"authorization", b"Bearer k1")]),
        (API, [(b"authorization", b"Bearer k1"), (b"authorization", b"Bearer k3")]),
        (E2B_CONTROL, [(b"authorization", b"Bearer k1"), (b"x-api-key", b"k2")]),
        (E2B_SANDBOX, [(b"x-access-token", b"t1"), (b"x-api-key", b"k2")]),
        (E2B_SANDBOX, [(b"e2b-traffic-access-token", b"t2"), (b"x-access-token", b"t1")]),
        (NODE, [(b"authorization", b"Bearer n1"), (b"authorization", b"Bearer n2")]),
    ],
    ids=lambda v: getattr(v, "name", None) or "",
)
def test_two_different_credentials_are_refused(
    surface: credentials.Surface, headers: list[tuple[bytes, bytes]]
) -> None:
    with pytest.raises(ConflictingCredentials):
        credentials.presented(request_with(headers), surface)
    with pytest.raises(ConflictingCredentials):
        credentials.presented(request_with(headers[::-1]), surface)  # whatever the order


@pytest.mark.parametrize("value", [b"Basic abc", b"Bearer", b"Bearer   ", b"Token k1"])
def test_an_authorization_that_is_not_a_bearer_key_is_refused(value: bytes) -> None:
    with pytest.raises(InvalidApiKey):
        credentials.presented(request_with([(b"authorization", value)]), API)


def _two_keys(key: str) -> list[tuple[str, str]]:
    """A tenant's valid key as X-API-Key, and another credential as Bearer."""
    return [("X-API-Key", key), ("Authorization", "Bearer crl_key_" + "0" * 20 + "_" + "x" * 43)]


@pytest.mark.parametrize(
    ("method", "path", "extra"),
    [
        ("GET", "/v1/usage", {}),  # the API
        ("GET", "/sandboxes", {}),  # E2B's control plane
        ("GET", "/v2/sandboxes", {}),
        ("GET", "/files", {"E2b-Sandbox-Id": "sbx_x", "X-Access-Token": "tok"}),  # in-sandbox
        ("GET", "/internal/images/abc", {}),  # the node-facing routes
    ],
)
def test_every_surface_refuses_two_different_keys_alike(
    client: TestClient,
    new_tenant: Callable[..., dict[str, Any]],
    method: str,
    path: str,
    extra: dict[str, str],
) -> None:
    tenant = new_tenant()
    headers = [*_two_keys(tenant["key"]), *extra.items()]
    if path.startswith("/internal/"):
        headers = [("Authorization", "Bearer n1"), ("Authorization", "Bearer n2")]
    response = client.request(method, path, headers=headers)
    assert response.status_code == 400, response.text
    assert "two different credentials" in response.text
