"""Egress for sandboxes that ask for it: a veth pair, a /30 and an nftables chain each.

A sandbox's network namespace has only its loopback unless its spec's ``network`` lists
destinations (``wire.sandboxes.NetworkPolicy``). Then the backend, once the sandbox's
init process exists and before any command of the tenant runs, calls ``attach``: a veth
pair whose host end is ``c<tag>-<N>`` and whose other end is ``eth0`` inside the
sandbox, addresses from the N-th /30 of the node's ``sandbox_network_cidr``, a default
route through the host end, and the chain ``sb_<N>`` of the nftables table
``inet corral_<tag>``, reached through its ``egress`` verdict map keyed by that
interface. ``<tag>`` comes from the CIDR: nodes sharing a host, each with its own CIDR,
never touch each other's rules; a host-wide lock keeps a second process off a CIDR in
use.

The rules live on the host, where nothing inside a sandbox can change them (root in a
sandbox has no CAP_NET_ADMIN in any case), and are keyed by the interface a packet came
in on, not by its source address:

- to the node itself (any of its addresses, the host end included): rejected, but for
  DNS (port 53, UDP and TCP) to the host end of the interface the packet came in on,
  where the node answers that sandbox's queries (``node.sandboxes.dns``);
- into a sandbox: only replies to connections it opened (another sandbox, or anything
  outside, cannot open a connection to it);
- IPv6 from a sandbox: dropped (its ``eth0`` has an IPv4 address only);
- out of a sandbox: its own source address only, never to loopback, link-local (cloud
  metadata), multicast, reserved or this node's sandbox addresses, nor to the operator's
  ``sandbox_network_deny`` networks (RFC 1918 and CGNAT ranges by default: where a
  cluster's own services live); then only to the listed destinations (a port allows TCP
  and UDP to it), everything else rejected at once (the program sees "connection
  refused", not a hang);
- leaving the node: masqueraded behind the node's address.

Host names in a list are resolved on the node when the sandbox is attached (IPv4), the
addresses pinned in the rules and written to the sandbox's ``/etc/hosts``, and answered
by the sandbox's resolver. A name that does not resolve, or resolves only to denied
addresses, refuses the create (400 ``invalid_network``).

``detach`` removes the chain, the map entry and the host end (deleting the container
deletes its namespace and the veth with it). Each attachment is kept on disk by the
backend, so a restarted node knows which /30s are taken; ``adopt`` removes every chain
and interface no sandbox holds (a node killed between two steps leaves nothing). The
host is changed (the table installed, IPv4 forwarding enabled) only when the first
sandbox asks for a network.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import logging
import os
import socket
import subprocess
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

from node import threadspawn
from node.children import communicate
from node.sandboxes.base import BackendUnavailable, SandboxError
from node.sandboxes.dns import SandboxResolver, host_resolvers, parse_upstream
from wire.sandboxes import Destination, NetworkPolicy, parse_destination

log = logging.getLogger(__name__)

LOCK_DIR = Path("/run/corral")
#: refused at once: a TCP reset (an ICMP error is a soft error to TCP, which would
#: retry its SYN for a second before giving up), ICMP for the rest
REFUSE_TCP = "meta l4proto tcp reject with tcp reset"
REFUSE = "reject with icmpx admin-prohibited"
#: never reachable from a sandbox, whatever the operator or the tenant lists
ALWAYS_DENIED = (
    "0.0.0.0/8",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "224.0.0.0/4",
    "240.0.0.0/4",
)
#: the operator's default deny list: where a cluster's own services usually live
DEFAULT_DENY = ("10.0.0.0/8", "100.64.0.0/10", "172.16.0.0/12", "192.168.0.0/16")


class InvalidNetwork(SandboxError):
    status, code = 400, "invalid_network"


@dataclass(frozen=True, slots=True)
class Attachment:
    """One sandbox's place on the node's sandbox network."""

    index: int
    host_ip: str
    sandbox_ip: str
    interface: str
    #: name -> addresses, as written to the sandbox's /etc/hosts
    hosts: dict[str, list[str]]
    #: its resolver answers any name (the list allows 0.0.0.0/0), not only ``hosts``
    any_name: bool = False

    @property
    def chain(self) -> str:
        return f"sb_{self.index}"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Attachment:
        return cls(**json.loads(text))


@dataclass(frozen=True, slots=True)
class Rule:
    network: IPv4Network
    port: int | None


class Network:
    """The node's sandbox network: addresses, interfaces and nftables rules."""

    def __init__(
        self,
        cidr: str,
        deny: Iterable[str],
        *,
        resolvers: Iterable[str] = (),
        lock_dir: Path = LOCK_DIR,
    ) -> None:
        """``resolvers``: where the sandboxes' resolver forwards names it may answer and
        does not know (``IP[:PORT]``; none: the host's ``/etc/resolv.conf``)."""
        self.cidr = IPv4Network(cidr)
        if self.cidr.prefixlen > 28:
            raise ValueError(f"sandbox network {cidr} is too small: a /28 at least")
        self.deny = [IPv4Network(n, strict=False) for n in deny]
        tag = hashlib.sha256(str(self.cidr).encode()).hexdigest()[:4]
        #: the nftables table and interface prefix of this network (one per CIDR, so
        #: nodes sharing a host with their own CIDRs never touch each other's rules)
        self.table = f"inet corral_{tag}"
        self.prefix = f"c{tag}-"
        self._lock_path = lock_dir / f"network-{tag}.lock"
        self._lock_fd: int | None = None
        self._taken: set[int] = set()
        listed = [parse_upstream(r) for r in resolvers]
        self.upstream = listed or host_resolvers()
        self._resolvers: dict[int, SandboxResolver] = {}
        self._lock = asyncio.Lock()
        self._started = False

    @property
    def capacity(self) -> int:
        return self.cidr.num_addresses // 4

    # --- set-up -------------------------------------------------------------------------
    async def adopt(self, held: Iterable[Attachment]) -> None:
        """At the node's start: the attachments its surviving sandboxes hold are taken;
        every chain, map entry and host interface no sandbox holds is removed (left by a
        node killed between two steps). Nothing is installed yet: the host is changed
        only when a sandbox first asks for a network (``attach``)."""
        async with self._lock:
            self._taken = {a.index for a in held}
            if _which("nft") and self._own():
                await self._reconcile(set(self._taken))
        for attachment in held:
            try:
                await self._serve_dns(attachment)
            except BackendUnavailable as exc:
                log.warning("sandbox %s keeps no resolver: %s", attachment.interface, exc)

    def _own(self) -> bool:
        """Hold this network's host-wide lock (released when the process ends): one node
        per CIDR on a host, or two would hand out the same addresses."""
        if self._lock_fd is not None:
            return True
        self._lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            log.warning(
                "another process on this host uses the sandbox network %s: this node gives "
                "sandboxes no network (give each node its own CORRAL_SANDBOX_NETWORK_CIDR)",
                self.cidr,
            )
            return False
        self._lock_fd = fd
        return True

    async def close(self) -> None:
        for resolver in list(self._resolvers.values()):
            await resolver.close()
        self._resolvers.clear()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        self._started = False

    async def _ensure_started(self) -> None:
        if self._started:
            return
        if not self._own():
            raise BackendUnavailable(
                f"another process on this host uses the sandbox network {self.cidr}"
            )
        for tool in ("nft", "ip", "nsenter"):
            if not _which(tool):
                raise BackendUnavailable(
                    f"sandbox networking needs {tool}: run scripts/setup-sandboxes.sh"
                )
        await _run("nft", "-f", "-", stdin=self._base_ruleset())
        await asyncio.to_thread(_enable_forwarding)
        self._started = True

    def _base_ruleset(self) -> str:
        """The table, its set, map and base chains: made if missing, the base chains'
        rules and the denied set replaced in one transaction (the sandboxes' chains and
        the map's entries survive a node's restart)."""
        denied = sorted({*ALWAYS_DENIED, str(self.cidr), *(str(n) for n in self.deny)})
        ifaces = f'"{self.prefix}*"'
        t = self.table
        hooks = {
            "input": "type filter hook input priority filter - 10; policy accept;",
            "forward": "type filter hook forward priority filter - 10; policy accept;",
            "postrouting": "type nat hook postrouting priority srcnat; policy accept;",
        }
        lines = [
            f"add table {t}",
            f"add set {t} denied {{ type ipv4_addr; flags interval; auto-merge; }}",
            f"flush set {t} denied",
            f"add element {t} denied {{ {', '.join(denied)} }}",
            f"add map {t} egress {{ type ifname : verdict; }}",
        ]
        for chain, hook in hooks.items():
            lines += [f"add chain {t} {chain} {{ {hook} }}", f"flush chain {t} {chain}"]
        for rule in (
            # DNS to the sandbox's own gateway (the host end of its interface), where
            # the node answers it: nowhere else on the node
            f"input iifname {ifaces} fib daddr . iif type local "
            "meta l4proto { tcp, udp } th dport 53 accept",
            f"input iifname {ifaces} {REFUSE_TCP}",
            f"input iifname {ifaces} {REFUSE}",
            f"forward oifname {ifaces} ct state established,related accept",
            f"forward oifname {ifaces} drop",
            f"forward iifname {ifaces} ct state established,related accept",
            f"forward iifname {ifaces} meta nfproto ipv6 drop",
            f"forward iifname {ifaces} iifname vmap @egress",
            f"forward iifname {ifaces} {REFUSE_TCP}",
            f"forward iifname {ifaces} {REFUSE}",
            f"postrouting ip saddr {self.cidr} oifname != {ifaces} masquerade",
        ):
            lines.append(f"add rule {t} {rule}")
        return "\n".join(lines) + "\n"

    async def _reconcile(self, keep: set[int]) -> None:
        chains, entries = await _table_contents(self.table)
        script = [
            f'delete element {self.table} egress {{ "{e}" }}'
            for e in sorted(entries)
            if self._index_of(e) not in keep
        ]
        script += [
            f"delete chain {self.table} {c}"
            for c in sorted(chains)
            if c.startswith("sb_") and c[3:].isdigit() and int(c[3:]) not in keep
        ]
        if script:
            await _run("nft", "-f", "-", stdin="\n".join(script) + "\n")
            log.info("removed %d stale sandbox network rules", len(script))
        for name in sorted(os.listdir("/sys/class/net")):
            index = self._index_of(name)
            if index is not None and index not in keep:
                await _run("ip", "link", "delete", name, check=False)
                log.info("removed stale sandbox interface %s", name)

    # --- attach and detach ---------------------------------------------------------------
    async def attach(self, sandbox_id: str, pid: int, policy: NetworkPolicy) -> Attachment:
        """Give the sandbox whose init is ``pid`` its interface and rules."""
        rules, hosts, any_name = await self._resolve(policy)
        async with self._lock:
            await self._ensure_started()
            index = next((i for i in range(1, self.capacity) if i not in self._taken), None)
            if index is None:
                raise InvalidNetwork("the node's sandbox network is full")
            self._taken.add(index)
        base = int(self.cidr.network_address) + 4 * index
        attachment = Attachment(
            index=index,
            host_ip=str(IPv4Address(base + 1)),
            sandbox_ip=str(IPv4Address(base + 2)),
            interface=f"{self.prefix}{index}",
            hosts=hosts,
            any_name=any_name,
        )
        try:
            await self._link(attachment, pid)
            await _run("nft", "-f", "-", stdin=self._chain(attachment, rules))
            await self._serve_dns(attachment)
        except BaseException:
            await asyncio.shield(self.detach(attachment))
            raise
        log.info(
            "sandbox=%s: network %s via %s, %d rules",
            sandbox_id,
            attachment.sandbox_ip,
            attachment.interface,
            len(rules),
        )
        return attachment

    async def _serve_dns(self, attachment: Attachment) -> None:
        """The sandbox's resolver, on its gateway address (``node.sandboxes.dns``)."""
        if attachment.index in self._resolvers:
            return  # a backend started again (adopt): already served
        resolver = SandboxResolver(
            interface=attachment.interface,
            gateway=attachment.host_ip,
            sandbox_ip=attachment.sandbox_ip,
            names=attachment.hosts,
            any_name=attachment.any_name,
            upstream=self.upstream,
        )
        try:
            await resolver.start()
        except OSError as exc:
            raise BackendUnavailable(str(exc)) from exc
        self._resolvers[attachment.index] = resolver

    async def _link(self, attachment: Attachment, pid: int) -> None:
        host, inside = attachment.interface, f"{attachment.sandbox_ip}/30"
        await _run(
            "ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", str(pid)
        )
        await _run(
            "ip",
            "-batch",
            "-",
            stdin=f"addr add {attachment.host_ip}/30 dev {host}\nlink set {host} up\n",
        )
        await _run(
            "nsenter",
            f"--net=/proc/{pid}/ns/net",
            "ip",
            "-batch",
            "-",
            stdin=(
                f"addr add {inside} dev eth0\nlink set eth0 up\n"
                f"route add default via {attachment.host_ip}\n"
            ),
        )

    def _chain(self, attachment: Attachment, rules: list[Rule]) -> str:
        chain = f"{self.table} {attachment.chain}"
        lines = [
            f"add chain {chain}",
            f"flush chain {chain}",
            f"add rule {chain} ip saddr != {attachment.sandbox_ip} drop",
            f"add rule {chain} ip daddr @denied {REFUSE_TCP}",
            f"add rule {chain} ip daddr @denied {REFUSE}",
        ]
        for rule in rules:
            match = f"ip daddr {rule.network}"
            if rule.port is not None:
                match += f" meta l4proto {{ tcp, udp }} th dport {rule.port}"
            lines.append(f"add rule {chain} {match} accept")
        lines += [f"add rule {chain} {REFUSE_TCP}", f"add rule {chain} {REFUSE}"]
        lines.append(
            f"add element {self.table} egress "
            f'{{ "{attachment.interface}" : jump {attachment.chain} }}'
        )
        return "\n".join(lines) + "\n"

    async def detach(self, attachment: Attachment) -> None:
        """Remove what ``attach`` made; safe to repeat, and on a half-made attachment."""
        resolver = self._resolvers.pop(attachment.index, None)
        if resolver is not None:
            await resolver.close()
        chains, entries = await _table_contents(self.table)
        script = []
        if attachment.interface in entries:
            script.append(f'delete element {self.table} egress {{ "{attachment.interface}" }}')
        if attachment.chain in chains:
            script.append(f"delete chain {self.table} {attachment.chain}")
        if script:
            await _run("nft", "-f", "-", stdin="\n".join(script) + "\n")
        if attachment.interface in await asyncio.to_thread(os.listdir, "/sys/class/net"):
            await _run("ip", "link", "delete", attachment.interface, check=False)
        async with self._lock:
            self._taken.discard(attachment.index)

    def _index_of(self, name: str) -> int | None:
        rest = name.removeprefix(self.prefix)
        return int(rest) if rest != name and rest.isdigit() else None

    # --- the allow list ------------------------------------------------------------------
    async def _resolve(
        self, policy: NetworkPolicy
    ) -> tuple[list[Rule], dict[str, list[str]], bool]:
        """The rules of a list, its names' addresses, and whether its sandbox's resolver
        answers any name (the list allows 0.0.0.0/0, on any port)."""
        rules: list[Rule] = []
        hosts: dict[str, list[str]] = {}
        any_name = False
        for entry in policy.allow:
            destination = parse_destination(entry)
            if destination.network is not None:
                self._check_allowed(entry, [destination.network])
                rules.append(Rule(destination.network, destination.port))
                any_name = any_name or destination.network.prefixlen == 0
                continue
            addresses = await _lookup(destination)
            allowed = [a for a in addresses if not self._denied(IPv4Network(a))]
            if not allowed:
                raise InvalidNetwork(
                    f"network entry {entry!r}: {destination.host} resolves only to denied "
                    f"addresses ({', '.join(addresses)})"
                )
            hosts[str(destination.host)] = allowed
            rules += [Rule(IPv4Network(a), destination.port) for a in allowed]
        return rules, hosts, any_name

    def _denied(self, network: IPv4Network) -> bool:
        return network.prefixlen > 0 and any(
            network.subnet_of(d) for d in (*self.deny, self.cidr, *_always_denied())
        )

    def _check_allowed(self, entry: str, networks: list[IPv4Network]) -> None:
        for network in networks:
            if self._denied(network):
                raise InvalidNetwork(
                    f"network entry {entry!r}: {network} is closed to sandboxes on this node"
                )


def _always_denied() -> list[IPv4Network]:
    return [IPv4Network(n) for n in ALWAYS_DENIED]


async def _lookup(destination: Destination) -> list[str]:
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(
            destination.host, destination.port or 0, family=socket.AF_INET, type=socket.SOCK_STREAM
        )
    except OSError as exc:
        raise InvalidNetwork(f"network entry {destination.host!r} does not resolve: {exc}") from exc
    return sorted({str(info[4][0]) for info in infos})


def _which(tool: str) -> bool:
    return any(
        os.access(os.path.join(d, tool), os.X_OK)
        for d in [*os.environ.get("PATH", "/usr/bin:/bin").split(":"), "/usr/sbin", "/sbin"]
    )


def _enable_forwarding() -> None:
    path = Path("/proc/sys/net/ipv4/ip_forward")
    if path.read_text().strip() != "1":
        path.write_text("1")
        log.info("enabled IPv4 forwarding (sandboxes with an allow list route through the node)")


async def _table_contents(table: str) -> tuple[set[str], set[str]]:
    """The chain names of a table and the interfaces its egress map holds."""
    out = await _run("nft", "-j", "list", "table", *table.split(), check=False)
    try:
        items = json.loads(out or b"{}").get("nftables", [])
    except ValueError:
        return set(), set()
    chains = {i["chain"]["name"] for i in items if "chain" in i}
    entries: set[str] = set()
    for item in items:
        body = item.get("map")
        if body and body.get("name") == "egress":
            for element in body.get("elem", []):
                key = element[0] if isinstance(element, list) else element
                if isinstance(key, str):
                    entries.add(key)
    return chains, entries


async def _run(*args: str, stdin: str | None = None, check: bool = True) -> bytes:
    proc = await threadspawn.start(  # not the loop's fork: see node.threadspawn
        *args,
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await communicate(proc, stdin.encode() if stdin is not None else None)
    if check and proc.returncode != 0:
        raise SandboxError(f"{args[0]} {args[1]}: {err.decode(errors='replace').strip()[:300]}")
    return out
