"""A real Corral server with the fake sandbox backend and a ``python`` image, for the
SDK's and the CLI's tests: uvicorn on a free port (``live_server``), so clients use real
sockets."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from corral import Corral, NoCapacity, Sandbox, Unavailable
from tests.app.api.v1.test_sandboxes import add_busybox
from tests.conftest import ADMIN


@dataclass(frozen=True)
class SandboxServer:
    url: str
    key: str

    def tenant(self, name: str, **quota: Any) -> str:
        """A new tenant's API key."""
        return new_tenant(self.url, name, **quota)


def until_stopped(sbx: Sandbox) -> str:
    """The sandbox's state once its teardown, after a kill's answer, is recorded."""
    deadline = time.monotonic() + 10
    while sbx.refresh().state != "stopped" and time.monotonic() < deadline:
        time.sleep(0.01)
    return sbx.state


def new_tenant(url: str, name: str, **quota: Any) -> str:
    made = httpx.post(f"{url}/v1/tenants", json={"name": name, "quota": quota}, headers=ADMIN)
    assert made.status_code == 201, made.text
    return str(made.json()["key"]["api_key"])


def wait_for_sandboxes(url: str, key: str, backend: str, image: str = "python") -> None:
    """Until the node's first report (with its sandbox API) reaches the catalogue: a
    create no longer answers 503."""
    deadline = time.monotonic() + 20
    with Corral(url, key) as client:
        while True:
            try:
                client.sandboxes.create(image, backend=backend, memory_mb=64).kill()
                return
            except (NoCapacity, Unavailable):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def start(live_server: Callable[..., str], tmp_path: Path) -> SandboxServer:
    add_busybox(tmp_path / "data" / "images", "python")
    url = live_server(sandbox_backends=["fake"])
    wait_for_sandboxes(url, new_tenant(url, "warm-up"), "fake")
    return SandboxServer(url, new_tenant(url, "sdk", max_concurrent_sandboxes=4))
