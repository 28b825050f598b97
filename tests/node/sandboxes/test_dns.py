"""The node's resolver for sandboxes (``node.sandboxes.dns``) on its own: what it answers,
refuses and forwards, and where it forwards to. On real sandboxes: ``test_network.py``."""

from __future__ import annotations

import asyncio
import socket
import struct
from pathlib import Path

import pytest

from node.sandboxes import dns
from node.settings import NodeSettings


def query(name: str, qtype: int = dns.TYPE_A, qid: int = 0x1234, opcode: int = 0) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    flags = 0x0100 | (opcode << 11)  # RD
    return (
        struct.pack("!HHHHHH", qid, flags, 1, 0, 0, 0)
        + labels
        + b"\0"
        + struct.pack("!HH", qtype, 1)
    )


def parsed(answer: bytes | None) -> tuple[int, int, list[str]]:
    """The id, rcode and A addresses of an answer."""
    assert answer is not None
    qid, flags, _, ancount = struct.unpack("!HHHH", answer[:8])
    question = dns.parse_question(answer[:2] + b"\0\0\0\x01" + b"\0" * 6 + answer[12:])
    end = question.end if question is not None else 12
    addresses = []
    at = end
    for _ in range(ancount):
        rtype, _, _, size = struct.unpack("!HHIH", answer[at + 2 : at + 12])
        if rtype == dns.TYPE_A:
            addresses.append(socket.inet_ntoa(answer[at + 12 : at + 12 + size]))
        at += 12 + size
    return qid, flags & 0xF, addresses


def resolver(
    *, any_name: bool = False, upstream: list[tuple[str, int]] | None = None
) -> dns.SandboxResolver:
    return dns.SandboxResolver(
        interface="lo",
        gateway="127.0.0.1",
        sandbox_ip="127.0.0.2",
        names={"PyPI.org": ["203.0.113.80", "203.0.113.81"]},
        any_name=any_name,
        upstream=upstream or [("127.0.0.1", 9)],
    )


async def test_a_listed_name_is_answered_with_its_pinned_addresses_and_nothing_else() -> None:
    names = resolver()
    assert parsed(await names.answer(query("pypi.org"))) == (
        0x1234,
        dns.NOERROR,
        ["203.0.113.80", "203.0.113.81"],
    )
    assert parsed(await names.answer(query("PyPi.ORG")))[2] == ["203.0.113.80", "203.0.113.81"]
    # no IPv6, no other records: no data, not an error
    assert parsed(await names.answer(query("pypi.org", qtype=28))) == (0x1234, dns.NOERROR, [])
    # any other name, a subdomain of a listed one included, is refused
    for other in ("files.pythonhosted.org", "x.pypi.org", "secret.exfil.test"):
        assert parsed(await names.answer(query(other)))[1] == dns.REFUSED, other
    assert parsed(await names.answer(query("pypi.org", opcode=2)))[1] == dns.NOTIMP
    assert parsed(await names.answer(b"\x12\x34" + b"\0" * 10))[1] == dns.FORMERR
    assert await names.answer(b"\x12") is None


async def test_any_name_is_forwarded_when_the_list_allows_everywhere() -> None:
    upstream = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    upstream.bind(("127.0.0.1", 0))
    upstream.setblocking(False)
    loop = asyncio.get_running_loop()

    async def serve() -> None:
        data, peer = await loop.sock_recvfrom(upstream, 512)
        await loop.sock_sendto(upstream, data[:2] + b"forwarded", peer)

    server = asyncio.create_task(serve())
    try:
        anywhere = resolver(any_name=True, upstream=[upstream.getsockname()])
        assert await anywhere.answer(query("example.com")) == b"\x12\x34forwarded"
        # pinned names still come from the pins
        assert parsed(await anywhere.answer(query("pypi.org")))[2] == [
            "203.0.113.80",
            "203.0.113.81",
        ]
    finally:
        server.cancel()
        upstream.close()


async def test_an_upstream_that_refuses_is_a_server_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dns, "UPSTREAM_TIMEOUT_S", 0.5)
    closed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there: the kernel answers "port unreachable"
    anywhere = resolver(any_name=True, upstream=[("127.0.0.1", port)])
    assert parsed(await anywhere.answer(query("example.com")))[1] == dns.SERVFAIL


def test_the_nodes_resolvers_come_from_the_setting_or_the_hosts_resolv_conf(tmp_path: Path) -> None:
    conf = tmp_path / "resolv.conf"
    conf.write_text(
        "# systemd-resolved\nnameserver 127.0.0.53\nnameserver fe80::1%eth0\nsearch x\n"
    )
    assert dns.host_resolvers(conf) == [("127.0.0.53", 53), ("fe80::1", 53)]
    assert dns.host_resolvers(tmp_path / "missing") == [("127.0.0.1", 53)]
    assert dns.parse_upstream("10.0.0.2:5353") == ("10.0.0.2", 5353)
    assert dns.parse_upstream("[::1]:5353") == ("::1", 5353)
    assert dns.parse_upstream("2001:db8::1") == ("2001:db8::1", 53)
    with pytest.raises(ValueError):
        dns.parse_upstream("resolver.example")
    with pytest.raises(ValueError, match="sandbox resolver"):
        NodeSettings(sandbox_dns=["10.0.0.2:0"])


def test_the_resolv_conf_of_a_sandbox_names_its_node_first() -> None:
    conf = dns.resolv_conf("10.213.0.1", ["10.1.2.3", "8.8.8.8", "1.1.1.1"])
    servers = [line.split()[1] for line in conf.splitlines() if line.startswith("nameserver")]
    assert servers == ["10.213.0.1", "10.1.2.3", "8.8.8.8"]  # glibc reads three
    assert "no network" in dns.OFFLINE_RESOLV_CONF and "network.allow" not in conf


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.3.1", 0))
        return int(probe.getsockname()[1])


async def test_it_serves_its_sandbox_alone_and_bounds_its_connections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dns, "PORT", free_port())
    served = dns.SandboxResolver(
        interface="lo",
        gateway="127.0.3.1",
        sandbox_ip="127.0.3.2",
        names={"pypi.org": ["203.0.113.80"]},
        any_name=False,
        upstream=[("127.0.0.1", 9)],
    )
    await served.start()
    loop = asyncio.get_running_loop()
    try:
        for source, heard in (("127.0.3.3", False), ("127.0.3.2", True)):
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as asker:
                asker.bind((source, 0))
                asker.setblocking(False)
                await loop.sock_sendto(asker, query("pypi.org"), ("127.0.3.1", dns.PORT))
                try:
                    async with asyncio.timeout(0.5):
                        answer = await loop.sock_recv(asker, 512)
                except TimeoutError:
                    answer = None
                assert (answer is not None) == heard, source
                if heard:
                    assert parsed(answer)[2] == ["203.0.113.80"]
        streams = []
        for _ in range(dns.MAX_STREAMS):
            sock = socket.socket()
            sock.bind(("127.0.3.2", 0))
            sock.setblocking(False)
            await loop.sock_connect(sock, ("127.0.3.1", dns.PORT))
            streams.append(sock)
        message = query("pypi.org")
        await loop.sock_sendall(streams[0], len(message).to_bytes(2, "big") + message)
        answer = await loop.sock_recv(streams[0], 512)
        assert parsed(answer[2:])[2] == ["203.0.113.80"]
        with socket.socket() as one_too_many:
            one_too_many.bind(("127.0.3.2", 0))
            one_too_many.setblocking(False)
            await loop.sock_connect(one_too_many, ("127.0.3.1", dns.PORT))
            await loop.sock_sendall(one_too_many, len(message).to_bytes(2, "big") + message)
            try:
                refused = await loop.sock_recv(one_too_many, 512)
            except ConnectionResetError:
                refused = b""
            assert refused == b""  # closed unanswered
        for sock in streams:
            sock.close()
    finally:
        await served.close()
