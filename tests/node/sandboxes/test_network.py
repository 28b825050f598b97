"""Egress allow lists on real container sandboxes, real veths and real nftables rules.

An "outside" host (``tests.conftest.outside``: a network namespace behind a veth, as a
server on another machine would be) serves on two ports; sandboxes reach only what
their list allows, never the node, another sandbox or a denied network, and nothing is
left on the host when they end, or after a node killed between two steps restarts."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import socketserver
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from node.sandboxes.base import BackendUnavailable, RootImage
from node.sandboxes.crun.backend import CrunBackend
from node.sandboxes.network import Attachment, InvalidNetwork, Network
from tests.node.sandboxes.conftest import spec, started_backend
from tests.node.sandboxes.test_crun import run

pytestmark = pytest.mark.crun

CIDR = "10.215.0.0/24"


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=check)


def network(**kw: object) -> Network:
    return Network(CIDR, kw.get("deny", ["10.214.0.128/25"]))  # type: ignore[arg-type]


@pytest_asyncio.fixture
async def netted(tmp_path: Path) -> AsyncIterator[CrunBackend]:
    """A crun backend whose sandboxes may ask for a network."""
    async with started_backend(tmp_path / "data", network=network()) as backend:
        yield backend
    assert not host_interfaces(backend), "an interface outlived its sandbox"


def host_interfaces(backend: CrunBackend) -> list[str]:
    assert backend.network is not None
    return [n for n in os.listdir("/sys/class/net") if n.startswith(backend.network.prefix)]


def chains(backend: CrunBackend) -> list[str]:
    assert backend.network is not None
    out = sh("nft", "-j", "list", "table", *backend.network.table.split(), check=False).stdout
    items = json.loads(out or "{}").get("nftables", [])
    return [i["chain"]["name"] for i in items if "chain" in i and i["chain"]["name"][:3] == "sb_"]


async def fetch(backend: CrunBackend, sandbox_id: str, target: str) -> str:
    host, port = target.rsplit(":", 1)
    result = await run(
        backend,
        sandbox_id,
        ["sh", "-c", f"nc -w 2 {host} {port} </dev/null; echo rc=$?"],
        timeout_s=15,
    )
    return result.stdout.decode() + result.stderr.decode()


def allowing(sandbox_id: str, *allow: str) -> object:
    return spec(sandbox_id, network={"allow": list(allow)})


async def test_an_allowed_destination_is_reached_and_nothing_else(
    netted: CrunBackend, busybox_image: RootImage, outside: str
) -> None:
    await netted.create(allowing("sbx-egress", f"{outside}:8080"), busybox_image)  # type: ignore[arg-type]
    reached = await fetch(netted, "sbx-egress", f"{outside}:8080")
    assert "hello-8080" in reached, reached
    # masqueraded: the outside sees the node's address, not the sandbox's
    assert "from-10.214.0.1" in reached, reached
    assert "hello-8081" not in await fetch(netted, "sbx-egress", f"{outside}:8081")
    # the node itself, through any of its addresses, is closed: a service listening
    # on all of the node's addresses hears nothing
    host_end = Attachment.from_json(
        (netted.root / "sbx-egress" / "network.json").read_text()
    ).host_ip
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        for address in (host_end, "10.214.0.1", _node_address()):
            refused = await fetch(netted, "sbx-egress", f"{address}:{port}")
            assert "rc=0" not in refused and "refused" in refused, (address, refused)
        listener.settimeout(0.2)
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()


async def test_a_sandbox_without_a_list_has_no_interface_but_loopback(
    netted: CrunBackend, busybox_image: RootImage, outside: str
) -> None:
    await netted.create(spec("sbx-closed"), busybox_image)
    links = await run(netted, "sbx-closed", ["cat", "/proc/net/dev"])
    assert "eth0" not in links.stdout.decode() and "lo:" in links.stdout.decode()
    assert "rc=0" not in await fetch(netted, "sbx-closed", f"{outside}:8080")


async def test_sandboxes_cannot_reach_each_other(
    netted: CrunBackend, busybox_image: RootImage, outside: str
) -> None:
    await netted.create(allowing("sbx-one", "0.0.0.0/0"), busybox_image)  # type: ignore[arg-type]
    await netted.create(allowing("sbx-two", "0.0.0.0/0"), busybox_image)  # type: ignore[arg-type]
    two = Attachment.from_json((netted.root / "sbx-two" / "network.json").read_text())
    listening = await netted.exec(
        "sbx-two",
        _exec(["sh", "-c", "echo secret | nc -l -p 9000 -w 5"]),
        default_user="user",
    )
    try:
        await asyncio.sleep(0.3)
        assert "secret" not in await fetch(netted, "sbx-one", f"{two.sandbox_ip}:9000")
    finally:
        await listening.signal(9)
    # the whole internet is allowed, so the outside host (not denied) answers
    assert "hello-8081" in await fetch(netted, "sbx-one", f"{outside}:8081")


async def test_a_denied_network_is_refused_even_when_listed(
    netted: CrunBackend, busybox_image: RootImage
) -> None:
    with pytest.raises(InvalidNetwork, match="closed to sandboxes"):
        await netted.create(allowing("sbx-denied", "10.214.0.200:80"), busybox_image)  # type: ignore[arg-type]
    with pytest.raises(InvalidNetwork, match="closed to sandboxes"):
        await netted.create(allowing("sbx-meta", "169.254.169.254:80"), busybox_image)  # type: ignore[arg-type]
    assert not (netted.root / "sbx-denied").exists() and not chains(netted)


async def test_a_host_name_is_resolved_pinned_and_written_to_etc_hosts(
    netted: CrunBackend, busybox_image: RootImage, outside: str, tmp_path: Path
) -> None:
    with host_entry(outside, "corral-outside.test"):
        await netted.create(allowing("sbx-named", "corral-outside.test:8080"), busybox_image)  # type: ignore[arg-type]
    inside = await run(netted, "sbx-named", ["cat", "/etc/hosts"])
    assert f"{outside}\tcorral-outside.test" in inside.stdout.decode()
    assert "hello-8080" in await fetch(netted, "sbx-named", "corral-outside.test:8080")


async def test_destroy_and_a_restart_after_a_crash_leave_no_rules_or_interfaces(
    netted: CrunBackend, busybox_image: RootImage, outside: str, tmp_path: Path
) -> None:
    await netted.create(allowing("sbx-keep", f"{outside}:8080"), busybox_image)  # type: ignore[arg-type]
    await netted.create(allowing("sbx-gone", f"{outside}:8080"), busybox_image)  # type: ignore[arg-type]
    assert len(chains(netted)) == 2 and len(host_interfaces(netted)) == 2
    await netted.destroy("sbx-gone")
    assert len(chains(netted)) == 1 and len(host_interfaces(netted)) == 1
    # a node killed after attaching but before recording it: a chain and a veth to a
    # namespace that nobody holds
    assert netted.network is not None
    with namespace_holder() as pid:
        orphan = await netted.network.attach("sbx-orphan", pid, _policy(f"{outside}:80"))
        assert len(chains(netted)) == 2 and len(host_interfaces(netted)) == 2
        await netted.close()
        restarted = CrunBackend(tmp_path / "data", network=network())
        assert await restarted.start() == ["sbx-keep"]
        try:
            assert orphan.chain not in chains(restarted) and len(chains(restarted)) == 1
            assert orphan.interface not in host_interfaces(restarted)
            assert len(host_interfaces(restarted)) == 1
            # the survivor still reaches what it may
            assert "hello-8080" in await fetch(restarted, "sbx-keep", f"{outside}:8080")
        finally:
            await restarted.destroy("sbx-keep")
            await restarted.close()
    assert not chains(restarted) and not host_interfaces(restarted)


async def test_a_second_node_on_the_same_network_leaves_the_first_alone(
    netted: CrunBackend, busybox_image: RootImage, tmp_path: Path, outside: str
) -> None:
    await netted.create(allowing("sbx-first", f"{outside}:8080"), busybox_image)  # type: ignore[arg-type]
    # a second node on this host with the same CIDR (and no sandboxes of its own) must
    # neither reconcile the first one's rules away nor hand out its addresses
    second = CrunBackend(tmp_path / "data2", network=network())
    await second.start()
    try:
        assert len(chains(netted)) == 1 and len(host_interfaces(netted)) == 1
        with pytest.raises(BackendUnavailable, match="another process"):
            await second.create(allowing("sbx-second", f"{outside}:8080"), busybox_image)  # type: ignore[arg-type]
    finally:
        await second.close()
    assert "hello-8080" in await fetch(netted, "sbx-first", f"{outside}:8080")


@contextlib.contextmanager
def host_entry(address: str, name: str) -> Iterator[None]:
    """``name`` resolves to ``address`` on this host for the block."""
    hosts = Path("/etc/hosts")
    original = hosts.read_text()
    hosts.write_text(original + f"{address}\t{name}\n")
    try:
        yield
    finally:
        hosts.write_text(original)


@contextlib.contextmanager
def namespace_holder() -> Iterator[int]:
    """The pid of a process in a network namespace of its own."""
    holder = subprocess.Popen(["unshare", "--net", "sleep", "60"])
    try:
        deadline = time.monotonic() + 5
        while os.readlink(f"/proc/{holder.pid}/ns/net") == os.readlink("/proc/self/ns/net"):
            assert time.monotonic() < deadline, "unshare did not make a namespace"
            time.sleep(0.01)
        yield holder.pid
    finally:
        holder.kill()
        holder.wait()


def _policy(*allow: str):  # type: ignore[no-untyped-def]
    from wire.sandboxes import NetworkPolicy

    return NetworkPolicy(allow=list(allow))


def _exec(cmd: list[str]):  # type: ignore[no-untyped-def]
    from wire.sandboxes import ExecRequest

    return ExecRequest(cmd=cmd, timeout_s=10)


def _node_address() -> str:
    out = sh("ip", "-4", "-o", "addr", "show", "scope", "global").stdout.split()
    addresses = [w.split("/")[0] for w in out if "/" in w and not w.startswith("10.21")]
    return addresses[0] if addresses else "127.0.0.1"


async def test_a_claimed_warm_sandbox_gets_its_network_at_the_claim(
    netted: CrunBackend, busybox_image: RootImage, outside: str
) -> None:
    await netted.create(spec("warm-net"), busybox_image)  # made ahead, with no network
    await netted.pause("warm-net")
    await netted.claim("warm-net", allowing("sbx-claimnet", f"{outside}:8080"))  # type: ignore[arg-type]
    assert "hello-8080" in await fetch(netted, "sbx-claimnet", f"{outside}:8080")
    assert len(chains(netted)) == 1
    await netted.destroy("sbx-claimnet")
    assert not chains(netted) and not host_interfaces(netted)


# --- names -------------------------------------------------------------------------------
#: what the test's upstream resolver answers for any name
UPSTREAM_ANSWER = "203.0.113.7"


@contextlib.contextmanager
def upstream_resolver() -> Iterator[tuple[str, list[str]]]:
    """A DNS server on this host's loopback, as the node's resolver: every A question
    answered with ``UPSTREAM_ANSWER``. Its ``IP:PORT`` and the names it was asked."""
    asked: list[str] = []

    class Answer(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            query, sock = self.request
            at, labels = 12, []
            while query[at]:
                labels.append(query[at + 1 : at + 1 + query[at]].decode())
                at += 1 + query[at]
            asked.append(".".join(labels))
            qtype = int.from_bytes(query[at + 1 : at + 3], "big")
            answers = (
                b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04"
                + socket.inet_aton(UPSTREAM_ANSWER)
                if qtype == 1
                else b""
            )
            header = query[:2] + b"\x81\x80\x00\x01" + (1 if answers else 0).to_bytes(2, "big")
            sock.sendto(
                header + b"\x00\x00\x00\x00" + query[12 : at + 5] + answers, self.client_address
            )

    server = socketserver.ThreadingUDPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def upstream() -> Iterator[tuple[str, list[str]]]:
    with upstream_resolver() as found:
        yield found


@pytest_asyncio.fixture
async def resolving(tmp_path: Path, upstream: tuple[str, list[str]]) -> AsyncIterator[CrunBackend]:
    """A crun backend whose node resolves names through ``upstream``."""
    net = Network(CIDR, ["10.214.0.128/25"], resolvers=[upstream[0]])
    async with started_backend(tmp_path / "data", network=net) as backend:
        yield backend


async def test_a_sandbox_with_the_internet_resolves_any_name_through_its_node(
    resolving: CrunBackend, python_image: RootImage, upstream: tuple[str, list[str]]
) -> None:
    await resolving.create(allowing("sbx-dns", "0.0.0.0/0"), python_image)  # type: ignore[arg-type]
    gateway = Attachment.from_json((resolving.root / "sbx-dns" / "network.json").read_text())
    conf = (await run(resolving, "sbx-dns", ["cat", "/etc/resolv.conf"])).stdout.decode()
    assert f"nameserver {gateway.host_ip}\n" in conf, conf
    looked_up = await run(
        resolving,
        "sbx-dns",
        [
            "sh",
            "-c",
            'getent hosts pkg.corral.test; python3 -c "import socket; '
            "print(socket.getaddrinfo('files.corral.test', 443)[0][4][0])\"",
        ],
    )
    out = looked_up.stdout.decode()
    assert f"{UPSTREAM_ANSWER}" in out.split()[0] and "pkg.corral.test" in out, looked_up
    assert out.split()[-1] == UPSTREAM_ANSWER, looked_up
    assert {"pkg.corral.test", "files.corral.test"} <= set(upstream[1])
    # over TCP too (what a resolver falls back to for long answers)
    tcp = await run(
        resolving,
        "sbx-dns",
        ["sh", "-c", "RES_OPTIONS=use-vc getent ahostsv4 tcp.corral.test"],
    )
    assert UPSTREAM_ANSWER in tcp.stdout.decode(), tcp
    assert "tcp.corral.test" in upstream[1]


async def test_a_list_of_names_resolves_those_names_and_reaches_no_other_resolver(
    resolving: CrunBackend,
    busybox_image: RootImage,
    outside: str,
    upstream: tuple[str, list[str]],
) -> None:
    with host_entry(outside, "corral-outside.test"):
        await resolving.create(allowing("sbx-names", "corral-outside.test:8080"), busybox_image)  # type: ignore[arg-type]

    async def lookup(*args: str) -> str:
        result = await run(
            resolving, "sbx-names", ["sh", "-c", f"busybox nslookup {' '.join(args)}; echo rc=$?"]
        )
        return result.stdout.decode() + result.stderr.decode()

    # asked of the resolver in /etc/resolv.conf (not /etc/hosts): the pinned address
    allowed = await lookup("corral-outside.test")
    assert f"Address: {outside}" in allowed and "rc=0" in allowed, allowed
    # any other name is refused by the node, which asks nobody
    refused = await lookup("secret-1.exfil.test")
    assert "REFUSED" in refused and UPSTREAM_ANSWER not in refused, refused
    # and no resolver beyond its own can be asked: not one on the internet, not the
    # listed host on another port, not the node's resolver of a sandbox that may ask
    # for any name (at that sandbox's gateway), not the node on its other addresses
    await resolving.create(allowing("sbx-open", "0.0.0.0/0"), busybox_image)  # type: ignore[arg-type]
    other = Attachment.from_json((resolving.root / "sbx-open" / "network.json").read_text())
    for resolver in ("8.8.8.8", outside, other.host_ip, _node_address()):
        direct = await lookup("secret-2.exfil.test", resolver)
        assert "rc=0" not in direct and UPSTREAM_ANSWER not in direct, (resolver, direct)
    assert not [name for name in upstream[1] if "exfil" in name], upstream[1]


async def test_a_resolver_the_list_allows_is_asked_after_the_node(
    resolving: CrunBackend, busybox_image: RootImage, outside: str
) -> None:
    await resolving.create(allowing("sbx-own-dns", f"{outside}:53", "8.8.8.8:53"), busybox_image)  # type: ignore[arg-type]
    conf = (await run(resolving, "sbx-own-dns", ["cat", "/etc/resolv.conf"])).stdout.decode()
    servers = [line.split()[1] for line in conf.splitlines() if line.startswith("nameserver")]
    assert servers[1:] == [outside, "8.8.8.8"], conf


async def test_a_sandbox_without_network_says_so_when_a_name_is_looked_up(
    resolving: CrunBackend, python_image: RootImage
) -> None:
    await resolving.create(spec("sbx-offline"), python_image)
    conf = await run(
        resolving, "sbx-offline", ["sh", "-c", "ls -ln /etc/resolv.conf; cat /etc/resolv.conf"]
    )
    text = conf.stdout.decode()
    # the sandbox's root owns it (the image is idmapped, /etc is in the writable layer)
    assert text.split()[2:4] == ["0", "0"], text
    assert "this sandbox has no network" in text and "allow_internet_access=True" in text
    assert "nameserver 127.0.0.1" in text, text
    looked_up = await run(
        resolving,
        "sbx-offline",
        ["python3", "-c", "import socket; socket.getaddrinfo('pypi.org', 443)"],
    )
    assert "Temporary failure in name resolution" in looked_up.stderr.decode(), looked_up
    # the sandbox's root may change it (its own file in its own layer)
    rewritten = await run(
        resolving,
        "sbx-offline",
        ["sh", "-c", "echo 'nameserver 127.0.0.2' > /etc/resolv.conf && cat /etc/resolv.conf"],
        user="root",
    )
    assert rewritten.stdout.decode() == "nameserver 127.0.0.2\n", rewritten


async def test_a_claimed_warm_sandbox_trades_its_offline_resolver_for_the_node(
    resolving: CrunBackend, busybox_image: RootImage, outside: str
) -> None:
    await resolving.create(spec("warm-dns"), busybox_image)
    await resolving.pause("warm-dns")
    await resolving.claim("warm-dns", allowing("sbx-claimdns", "0.0.0.0/0"))  # type: ignore[arg-type]
    found = await run(resolving, "sbx-claimdns", ["sh", "-c", "busybox nslookup x.corral.test"])
    assert UPSTREAM_ANSWER in found.stdout.decode(), found
