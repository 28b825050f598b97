"""E2B's egress settings on real containers: ``network.allow_out`` becomes the sandbox's
allow list, ``allow_internet_access=False`` and Corral's default give no network."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from e2b import Sandbox

from tests.app.api.v1.test_sandboxes_crun import python_images_dir
from tests.conftest import ADMIN

pytestmark = [pytest.mark.crun, pytest.mark.slow]

PROBE = (
    "import socket\n"
    "for port in (8080, 8081):\n"
    "    try:\n"
    "        print(socket.create_connection(('{host}', port), 3).recv(64).decode().split()[0])\n"
    "    except OSError as e:\n"
    "        print(port, type(e).__name__)\n"
)


def test_allow_out_is_the_sandboxs_allow_list(
    live_server: Callable[..., str], monkeypatch: pytest.MonkeyPatch, outside: str
) -> None:
    url = live_server(
        sandbox_backends=["crun"],
        images_dir=python_images_dir(),
        sandbox_network_cidr="10.216.1.0/24",
        sandbox_network_deny=[],
    )
    made = httpx.post(f"{url}/v1/tenants", json={"name": "e2b-net"}, headers=ADMIN).json()
    for name in ("E2B_DOMAIN", "E2B_DEBUG", "E2B_ACCESS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("E2B_API_URL", url)
    monkeypatch.setenv("E2B_SANDBOX_URL", url)
    monkeypatch.setenv("E2B_API_KEY", made["key"]["api_key"])
    probe = ["python3", "-c", PROBE.format(host=outside)]
    opened = Sandbox.create(template="python", network={"allow_out": [outside]})
    closed = Sandbox.create(template="python", allow_internet_access=False)
    default = Sandbox.create(template="python")
    try:
        reached = opened.commands.run(" ".join(_quoted(probe))).stdout.split("\n")
        assert reached[:2] == ["hello-8080", "hello-8081"], reached
        for sandbox in (closed, default):
            shut = sandbox.commands.run(" ".join(_quoted(probe))).stdout.split("\n")
            assert all(not line.startswith("hello") for line in shut), shut
    finally:
        for sandbox in (opened, closed, default):
            sandbox.kill()


def _quoted(argv: list[str]) -> list[str]:
    import shlex

    return [shlex.quote(a) for a in argv]
