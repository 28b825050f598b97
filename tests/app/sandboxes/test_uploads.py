"""File uploads past the gateway's body cap: exempt from it (streamed to the node, bounded
by ``max_file_bytes`` instead), while every other route keeps it; an upload whose client
goes silent is refused (408) rather than held."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.requests import Request
from starlette.testclient import TestClient

from app.errors import UploadStalled
from app.http.middleware import is_upload
from app.main import create_app
from app.sandboxes.files import upload_body
from app.settings import Settings
from tests.app.api.v1.test_sandboxes import add_busybox, create
from tests.conftest import ADMIN

#: over the default body cap (8 MiB)
OVER_CAP = 9 << 20


@pytest.fixture
def client(make_settings: Callable[..., Settings], tmp_path: Path) -> Iterator[TestClient]:
    add_busybox(tmp_path / "data" / "images", "python")
    settings = make_settings(sandbox_backends=["fake"], max_file_bytes=16 << 20)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.fixture
def headers(client: TestClient) -> dict[str, str]:
    made = client.post("/v1/tenants", json={"name": "uploads"}, headers=ADMIN)
    assert made.status_code == 201, made.text
    return {"Authorization": f"Bearer {made.json()['key']['api_key']}"}


def chunks(size: int, piece: int = 1 << 20) -> Iterator[bytes]:
    """A body without a Content-Length (chunked), as a stream is sent."""
    for at in range(0, size, piece):
        yield bytes([at // piece % 251]) * min(piece, size - at)


def test_an_upload_passes_the_body_cap_and_other_routes_keep_it(
    client: TestClient, headers: dict[str, str]
) -> None:
    assert client.app.state.settings.max_body_bytes < OVER_CAP  # type: ignore[attr-defined]
    one = f"/v1/sandboxes/{create(client, headers)['id']}"
    put = client.put(
        f"{one}/files", params={"path": "/tmp/big"}, content=chunks(OVER_CAP), headers=headers
    )
    assert put.status_code == 200, put.text
    assert put.json()["size"] == OVER_CAP
    got = client.get(f"{one}/files", params={"path": "/tmp/big"}, headers=headers)
    assert got.content == b"".join(chunks(OVER_CAP))
    for path in (f"{one}/exec", f"{one}/files/mkdir"):
        for body in (b"x" * OVER_CAP, chunks(OVER_CAP)):  # declared, then streamed
            refused = client.post(path, content=body, headers=headers)
            assert refused.status_code == 413, (path, refused.text)
            assert refused.json()["error"]["code"] == "payload_too_large"


def test_a_file_over_max_file_bytes_is_refused_declared_or_streamed(
    client: TestClient, headers: dict[str, str]
) -> None:
    one = f"/v1/sandboxes/{create(client, headers)['id']}"
    too_big = (16 << 20) + 1
    for body in (b"x" * too_big, chunks(too_big)):
        put = client.put(f"{one}/files", params={"path": "/tmp/big"}, content=body, headers=headers)
        assert put.status_code == 413, put.text
        assert put.json()["error"]["code"] == "payload_too_large"
        assert "16777216" in put.json()["error"]["message"]


@pytest.mark.parametrize(
    ("method", "path", "upload"),
    [
        ("PUT", "/v1/sandboxes/sbx_1/files", True),
        ("POST", "/files", True),
        ("GET", "/v1/sandboxes/sbx_1/files", False),
        ("POST", "/v1/sandboxes/sbx_1/files", False),
        ("PUT", "/v1/sandboxes/sbx_1/files/mkdir", False),
        ("PUT", "/v1/sandboxes/a/b/files", False),
        ("POST", "/files/x", False),
        ("POST", "/v1/run", False),
    ],
)
def test_only_the_file_uploads_are_exempt(method: str, path: str, upload: bool) -> None:
    assert is_upload({"type": "http", "method": method, "path": path}) is upload


async def test_an_upload_whose_client_goes_silent_is_refused() -> None:
    sent: list[bytes] = [b"first"]

    async def receive() -> dict[str, Any]:
        if sent:
            return {"type": "http.request", "body": sent.pop(), "more_body": True}
        await asyncio.Event().wait()  # the client says nothing more
        raise AssertionError("unreachable")

    settings = SimpleNamespace(transfer_idle_seconds=0.05)
    app = SimpleNamespace(state=SimpleNamespace(services=SimpleNamespace(settings=settings)))
    request = Request({"type": "http", "method": "PUT", "headers": [], "app": app}, receive)
    got: list[bytes] = []
    with pytest.raises(UploadStalled) as refused:
        async for chunk in upload_body(request):
            got.append(chunk)
    assert got == [b"first"]
    assert (refused.value.status, refused.value.code) == (408, "upload_stalled")
