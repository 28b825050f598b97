"""A real Corral (uvicorn, the embedded node with crun and the ``python`` image) and the
E2B SDKs pointed at it the way docs/e2b.md says: ``E2B_API_URL`` and ``E2B_SANDBOX_URL``
at the gateway, ``E2B_API_KEY`` a tenant's key."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.app.api.v1.test_sandboxes import add_busybox
from tests.app.api.v1.test_sandboxes_crun import python_images_dir
from tests.conftest import ADMIN


@dataclass
class Corral:
    url: str
    key: str
    tenant_id: str

    def quota(self, **limits: Any) -> None:
        """Change the tenant's quota (the admin's PATCH)."""
        patched = httpx.patch(
            f"{self.url}/v1/tenants/{self.tenant_id}", json={"quota": limits}, headers=ADMIN
        )
        assert patched.status_code == 200, patched.text

    def new_key(self, name: str) -> str:
        """The key of a new tenant."""
        made = httpx.post(f"{self.url}/v1/tenants", json={"name": name}, headers=ADMIN)
        assert made.status_code == 201, made.text
        return str(made.json()["key"]["api_key"])


@pytest.fixture
def corral(live_server: Callable[..., str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Corral]:
    url = live_server(sandbox_backends=["crun"], images_dir=python_images_dir())
    yield _pointed_at(url, monkeypatch)


@pytest.fixture
def fake_corral(
    live_server: Callable[..., str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Corral]:
    """The same on the fake sandbox backend (offered as crun): the control plane, without
    containers."""
    images = tmp_path / "fake-images"
    add_busybox(images, "python")
    url = live_server(
        sandbox_backends=["fake"], images_dir=images, fake={"sandbox_aliases": {"crun": "fake"}}
    )
    yield _pointed_at(url, monkeypatch)


def _pointed_at(url: str, monkeypatch: pytest.MonkeyPatch) -> Corral:
    made = httpx.post(f"{url}/v1/tenants", json={"name": "e2b-sdk"}, headers=ADMIN)
    assert made.status_code == 201, made.text
    body: dict[str, Any] = made.json()
    for name in ("E2B_DOMAIN", "E2B_DEBUG", "E2B_ACCESS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("E2B_API_URL", url)
    monkeypatch.setenv("E2B_SANDBOX_URL", url)
    monkeypatch.setenv("E2B_API_KEY", body["key"]["api_key"])
    # the embedded node announces itself within a heartbeat: wait for it
    headers = {"Authorization": f"Bearer {body['key']['api_key']}"}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        nodes = httpx.get(f"{url}/v1/runtimes", headers=headers)
        if nodes.status_code == 200 and nodes.json()["nodes"] >= 1:
            break
        time.sleep(0.1)
    return Corral(url=url, key=body["key"]["api_key"], tenant_id=body["tenant"]["id"])
