"""E2B's egress settings on real containers: ``network.allow_out`` becomes the sandbox's
allow list, ``allow_internet_access=False`` and Corral's default give no network."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from e2b import CommandExitException, Sandbox

from tests.app.api.v1.test_sandboxes_crun import python_images_dir
from tests.conftest import ADMIN
from tests.node.sandboxes.test_network import UPSTREAM_ANSWER, upstream_resolver

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


def test_internet_access_resolves_names_and_a_sandbox_without_says_why(
    live_server: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with upstream_resolver() as (resolver, asked):
        url = live_server(
            sandbox_backends=["crun"],
            images_dir=python_images_dir(),
            sandbox_network_cidr="10.216.2.0/24",
            sandbox_dns=[resolver],
        )
        made = httpx.post(f"{url}/v1/tenants", json={"name": "e2b-dns"}, headers=ADMIN).json()
        for name in ("E2B_DOMAIN", "E2B_DEBUG", "E2B_ACCESS_TOKEN"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("E2B_API_URL", url)
        monkeypatch.setenv("E2B_SANDBOX_URL", url)
        monkeypatch.setenv("E2B_API_KEY", made["key"]["api_key"])
        lookup = "python3 -c \"import socket; print(socket.getaddrinfo('pypi.org', 443)[0][4][0])\""
        online = Sandbox.create(template="python", allow_internet_access=True)
        offline = Sandbox.create(template="python")
        try:
            assert online.commands.run(lookup).stdout.strip() == UPSTREAM_ANSWER
            assert "pypi.org" in asked
            with pytest.raises(CommandExitException) as failed:
                offline.commands.run(lookup)
            assert "Temporary failure in name resolution" in failed.value.stderr
            conf = offline.files.read("/etc/resolv.conf")
            assert "no network" in conf and "allow_internet_access=True" in conf, conf
        finally:
            for sandbox in (online, offline):
                sandbox.kill()


def _quoted(argv: list[str]) -> list[str]:
    import shlex

    return [shlex.quote(a) for a in argv]
