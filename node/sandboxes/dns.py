"""Sandboxes' name resolution: their ``/etc/resolv.conf`` and the node's resolver.

A sandbox with a network asks its node, at its gateway (the host end of its veth), and
nothing else unless its list says so: the node answers on that address, port 53 (UDP
and TCP), for that sandbox alone (the socket is bound to its interface, the asker must
be its address, and the node's input rule lets port 53 through only to the address of
the interface a packet came in on):

- a name of the allow list: the addresses the node pinned at create (those the rules
  allow, as written to ``/etc/hosts``), type A; other types: no data;
- any other name: forwarded to the node's resolvers (``sandbox_dns``, by default the
  host's ``/etc/resolv.conf``: a loopback stub works, the node asks from the host) when
  the list allows ``0.0.0.0/0``; refused (REFUSED) otherwise, so that a sandbox with a
  list of names cannot reach any resolver beyond it (a query is a message to whoever
  serves the name: DNS tunnelling).

A sandbox without a network gets a ``/etc/resolv.conf`` saying so: its nameserver is
its own loopback, where nothing listens, so a lookup fails at once ("Temporary failure
in name resolution") and the file's comment says why and how to get a network.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from ipaddress import IPv6Address, ip_address
from pathlib import Path

log = logging.getLogger(__name__)

PORT = 53
#: how long the node waits for one of its resolvers
UPSTREAM_TIMEOUT_S = 2.0
#: queries of one sandbox waiting for an upstream answer at once (more are dropped)
MAX_PENDING = 64
#: TCP connections of one sandbox open at once (more are closed at once: the node's
#: descriptors are not the sandbox's to spend)
MAX_STREAMS = 8
#: a TCP connection idle this long is closed
STREAM_IDLE_S = 10.0
MAX_MESSAGE = 4096
NOERROR, FORMERR, SERVFAIL, NOTIMP, REFUSED = 0, 1, 2, 4, 5
TYPE_A, CLASS_IN = 1, 1

OFFLINE_RESOLV_CONF = """\
# Corral: this sandbox has no network, so no name resolves here: a lookup fails at
# once with "Temporary failure in name resolution" (nothing answers on 127.0.0.1).
# A sandbox gets a network when its create lists destinations: "network": {"allow":
# ["pypi.org:443", "0.0.0.0/0"]} in Corral's API, allow_internet_access=True or
# network={"allow_out": [...]} through E2B's SDK (docs/sandboxes.md, "Network").
nameserver 127.0.0.1
options timeout:1 attempts:1
"""


def resolv_conf(gateway: str, others: Iterable[str] = ()) -> str:
    """The ``/etc/resolv.conf`` of a sandbox with a network: its node at ``gateway``,
    then the resolvers its list allows on port 53 (glibc asks the next one when a
    server refuses)."""
    lines = [
        "# Corral: this sandbox's resolver is its node (at its gateway). It answers the",
        "# names of the sandbox's network allow list with the addresses pinned at create",
        "# (as in /etc/hosts), any name when the list allows 0.0.0.0/0, and refuses the",
        '# rest (docs/sandboxes.md, "Network").',
        f"nameserver {gateway}",
        *(f"nameserver {address}" for address in list(others)[:2]),  # glibc reads 3
        "options timeout:2 attempts:2",
    ]
    return "\n".join(lines) + "\n"


def parse_upstream(entry: str) -> tuple[str, int]:
    """``IP``, ``IPv4:PORT`` or ``[IPv6]:PORT``: a resolver the node forwards to."""
    host, port = entry.strip(), PORT
    if host.startswith("["):
        host, _, rest = host[1:].partition("]")
        port = int(rest.removeprefix(":") or PORT)
    elif host.count(":") == 1:
        host, _, number = host.partition(":")
        port = int(number)
    ip_address(host)  # ValueError when it is not an address
    if not 0 < port < 65536:
        raise ValueError(f"resolver {entry!r}: bad port")
    return host, port


def host_resolvers(path: Path = Path("/etc/resolv.conf")) -> list[tuple[str, int]]:
    """The host's nameservers (glibc's default, 127.0.0.1, when it names none)."""
    found: list[tuple[str, int]] = []
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] == "nameserver":
                with contextlib.suppress(ValueError):
                    found.append(parse_upstream(words[1].split("%")[0]))
    return found or [("127.0.0.1", PORT)]


@dataclass(frozen=True, slots=True)
class Question:
    id: int
    flags: int
    name: str
    qtype: int
    qclass: int
    end: int  #: where the question ends in the query


def parse_question(query: bytes) -> Question | None:
    """The one question of a query (None: not a query one can answer)."""
    if len(query) < 12:
        return None
    qid, flags, qdcount = struct.unpack("!HHH", query[:6])
    if flags & 0x8000 or qdcount != 1:
        return None
    labels, at = [], 12
    while True:
        if at >= len(query):
            return None
        size = query[at]
        if size == 0:
            at += 1
            break
        if size > 63:
            return None  # no compression in a question
        labels.append(query[at + 1 : at + 1 + size])
        at += 1 + size
    if at + 4 > len(query):
        return None
    qtype, qclass = struct.unpack("!HH", query[at : at + 4])
    try:
        name = b".".join(labels).decode("ascii").lower()
    except UnicodeDecodeError:
        return None
    return Question(qid, flags, name, qtype, qclass, at + 4)


def reply(query: bytes, question: Question, rcode: int, addresses: Iterable[str] = ()) -> bytes:
    """An answer to ``question``: ``rcode`` with A records of ``addresses``."""
    records = [
        struct.pack("!HHHIH", 0xC00C, TYPE_A, CLASS_IN, 60, 4) + socket.inet_aton(a)
        for a in addresses
    ]
    # QR, the query's opcode and RD, RA; no EDNS (the OPT record is left out)
    flags = 0x8000 | (question.flags & 0x7900) | 0x0080 | rcode
    header = struct.pack("!HHHHHH", question.id, flags, 1, len(records), 0, 0)
    return header + query[12 : question.end] + b"".join(records)


def error(query: bytes, rcode: int) -> bytes | None:
    """A bare error answer to whatever ``query`` is, when it has a header."""
    if len(query) < 12:
        return None
    qid, flags = struct.unpack("!HH", query[:4])
    return struct.pack("!HHHHHH", qid, 0x8000 | (flags & 0x7900) | 0x0080 | rcode, 0, 0, 0, 0)


@dataclass
class Policy:
    """What one sandbox's resolver answers."""

    #: name -> addresses pinned at create
    names: dict[str, list[str]]
    #: any other name forwarded to the node's resolvers (the list allows 0.0.0.0/0)
    any_name: bool
    pending: int = field(default=0)


class SandboxResolver:
    """The node's resolver for one sandbox, on its gateway address."""

    def __init__(
        self,
        *,
        interface: str,
        gateway: str,
        sandbox_ip: str,
        names: dict[str, list[str]],
        any_name: bool,
        upstream: list[tuple[str, int]],
    ) -> None:
        self.interface = interface
        self.gateway = gateway
        self.sandbox_ip = sandbox_ip
        self.policy = Policy({n.lower().rstrip("."): a for n, a in names.items()}, any_name)
        self.upstream = upstream
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        self._streams = 0

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        udp = self._socket(socket.SOCK_DGRAM)
        try:
            transport, _ = await loop.create_datagram_endpoint(lambda: _Datagrams(self), sock=udp)
        except BaseException:
            udp.close()
            raise
        self._udp = transport
        tcp = self._socket(socket.SOCK_STREAM)
        try:
            tcp.listen(16)
            self._tcp = await asyncio.start_server(self._stream, sock=tcp)
        except BaseException:
            tcp.close()
            await self.close()
            raise

    def _socket(self, kind: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, kind)
        try:
            if kind == socket.SOCK_STREAM:  # past a closed one's TIME_WAIT (UDP: never shared)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, self.interface.encode())
            sock.setblocking(False)
            sock.bind((self.gateway, PORT))
        except OSError as exc:
            sock.close()
            raise OSError(
                exc.errno,
                f"the sandbox resolver cannot listen on {self.gateway}:{PORT} ({exc.strerror}): "
                "a DNS server on this host listening on all addresses must bind its own "
                "interfaces only",
            ) from exc
        return sock

    async def close(self) -> None:
        if self._udp is not None:
            self._udp.close()
            self._udp = None
        if self._tcp is not None:
            self._tcp.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._tcp.wait_closed(), 1)
            self._tcp = None

    async def answer(self, query: bytes) -> bytes | None:
        """The answer to one query of the sandbox (None: no answer at all)."""
        question = parse_question(query)
        if question is None:
            return error(query, FORMERR)
        if question.flags & 0x7800:  # an opcode other than QUERY
            return reply(query, question, NOTIMP)
        pinned = self.policy.names.get(question.name.rstrip("."))
        if pinned is not None:
            want_a = question.qtype == TYPE_A and question.qclass == CLASS_IN
            return reply(query, question, NOERROR, pinned if want_a else ())
        if not self.policy.any_name:
            return reply(query, question, REFUSED)
        if self.policy.pending >= MAX_PENDING:
            return None
        self.policy.pending += 1
        try:
            return await self._forward(query, question)
        finally:
            self.policy.pending -= 1

    async def _forward(self, query: bytes, question: Question) -> bytes:
        loop = asyncio.get_running_loop()
        for host, port in self.upstream:
            v6 = isinstance(ip_address(host), IPv6Address)
            family = socket.AF_INET6 if v6 else socket.AF_INET
            with socket.socket(family, socket.SOCK_DGRAM) as sock:
                sock.setblocking(False)
                try:
                    await loop.sock_connect(sock, (host, port))
                    await loop.sock_sendall(sock, query)
                    async with asyncio.timeout(UPSTREAM_TIMEOUT_S):
                        while True:
                            answer = await loop.sock_recv(sock, MAX_MESSAGE)
                            if answer[:2] == query[:2]:
                                return answer
                except (OSError, TimeoutError) as exc:
                    log.debug("sandbox resolver: %s:%d did not answer: %s", host, port, exc)
        return reply(query, question, SERVFAIL)

    async def _stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._streams += 1
        try:
            peer = writer.get_extra_info("peername")
            if not peer or peer[0] != self.sandbox_ip or self._streams > MAX_STREAMS:
                return
            while True:
                async with asyncio.timeout(STREAM_IDLE_S):
                    size = struct.unpack("!H", await reader.readexactly(2))[0]
                    query = await reader.readexactly(size)
                answer = await self.answer(query)
                if answer is None:
                    return
                writer.write(struct.pack("!H", len(answer)) + answer)
                await writer.drain()
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            self._streams -= 1
            writer.close()


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, resolver: SandboxResolver) -> None:
        self.resolver = resolver
        self.transport: asyncio.DatagramTransport | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if addr[0] != self.resolver.sandbox_ip or len(data) > MAX_MESSAGE:
            return
        task = asyncio.get_running_loop().create_task(self._answer(data, addr))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, data: bytes, addr: tuple[str, int]) -> None:
        answer = await self.resolver.answer(data)
        if answer is not None and self.transport is not None and not self.transport.is_closing():
            self.transport.sendto(answer, addr)  # sized as the query asked (EDNS)

    def connection_lost(self, exc: Exception | None) -> None:
        for task in self._tasks:
            task.cancel()
