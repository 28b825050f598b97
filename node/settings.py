"""A node agent's settings: everything the data plane can be told, and nothing more.

A node needs a Redis URL (``corral node``) or an in-process transport (embedded in
``corral serve``); it has no database URL, no admin key and runs no migrations. Built
once from ``CORRAL_*`` variables by the CLI (or by the embedded app) and passed down.
"""

from __future__ import annotations

import os
import socket
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from node.sandboxes.dns import parse_upstream
from node.sandboxes.network import DEFAULT_DENY

#: Memory per execution slot when the slots are derived from the node's memory: what a
#: short program in a warm jail typically uses, not its limit.
SLOT_MEMORY_MB = 64
MAX_SLOTS = 512
#: The CPU quotas of a node's sandboxes may add up to this many times its cores.
SANDBOX_CPU_OVERCOMMIT = 4
MIN_SANDBOX_MEMORY_MB = 256


class NodeSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CORRAL_", extra="ignore")

    dev_mode: bool = Field(False, description="Allow the fake runtime. Never in production.")
    node_id: str | None = Field(None, description="Default: hostname-pid.")
    redis_url: str | None = Field(
        None, description="Where a separate node finds its work (required by `corral node`)."
    )
    data_dir: Path = Field(Path("var"), description="Where the backends keep their files.")
    images_dir: Path | None = Field(
        None,
        description="Where the container images are kept (images); default: "
        "<data_dir>/images. Point several checkouts at one directory to share a cache.",
    )
    control_url: str | None = Field(
        None,
        description="Base URL of the control plane (a gateway, e.g. http://gateway:8080) a "
        "separate node fetches the images it lacks from, by digest, with its node token; "
        "several, comma-separated, are tried in order. Unset: nothing is fetched (embedded "
        "in `corral serve`, the node shares the gateway's image store).",
    )
    node_slots: int = Field(
        0,
        ge=0,
        description="Executions this node runs at once; 0: one per SLOT_MEMORY_MB of the "
        "node's memory (a limit is a ceiling, not what a program uses: the memory guard, not "
        "the slot count, holds work back when memory runs short).",
    )
    memory_reserve_mb: int = Field(
        1024,
        ge=0,
        description="The node takes no new work while the host has less than this much "
        "memory available (MemAvailable), so the kernel's OOM killer never has to choose.",
    )
    node_memory_mb: int | None = Field(
        None,
        ge=64,
        description="Memory this node gives to executions; default: the host's memory less "
        "a quarter (reported to placement).",
    )
    runtimes: list[str] = Field(
        default_factory=lambda: ["nsjail", "wasm"], description="Backends this node starts."
    )
    heartbeat_seconds: float = Field(1.0, gt=0, description="How often the node reports.")
    usage_report_seconds: float = Field(
        60.0,
        gt=0,
        description="How often the node reports the idle capacity its warm pools held "
        "(one usage event per pool and period, the platform's cost).",
    )
    node_dead_after_seconds: float = Field(
        6.0, gt=0, description="A node silent this long is dead; its work is handed out again."
    )
    node_host: str = Field("127.0.0.1", description="Listen address of /healthz and /metrics.")
    node_port: int | None = Field(
        8081, ge=0, le=65535, description="Port of /healthz and /metrics; 0: any, unset: none."
    )
    drain_seconds: float = Field(
        10.0, ge=0, description="On shutdown, how long running executions may finish."
    )
    wasm: dict[str, Any] = Field(
        default_factory=dict,
        description="Overrides for the wasm backend (node/fncall/wasm/config.py), as JSON: "
        "e.g. CORRAL_WASM='{\"warm_per_language\": 2}'.",
    )
    nsjail: dict[str, Any] = Field(
        default_factory=dict,
        description="Overrides for the nsjail backend (node/fncall/nsjail/config.py), as JSON: "
        'e.g. CORRAL_NSJAIL=\'{"max_jails": 64, "warm_per_language": 2}\'.',
    )
    fake: dict[str, Any] = Field(
        default_factory=dict,
        description='Options of the fake backend (tests only), e.g. \'{"run_log": "/tmp/x"}\'.',
    )
    sandbox_backends: list[str] = Field(
        default_factory=list,
        description="Stateful sandbox backends this node offers, e.g. '[\"crun\"]' (none: "
        "the node runs FnCall work only).",
    )
    sandbox_microvm_dir: Path | None = Field(
        None,
        description="Where microVMs, their kernel, disks and templates live (default: "
        "<data_dir>/microvm); QEMU runs unprivileged, so every directory above it must be "
        "one others may traverse.",
    )
    sandbox_microvm_accelerator: Literal["auto", "kvm", "tcg"] = Field(
        "auto",
        description="What runs microVM sandboxes: auto (KVM when a probe boot under it "
        "works, else TCG), or kvm / tcg forced.",
    )
    sandbox_warm: dict[str, int] = Field(
        default_factory=dict,
        description="Warm sandboxes kept paused per image, at least, e.g. '{\"python\": 2}' "
        "(more when creates arrive faster; see node/sandboxes/warm.py).",
    )
    sandbox_max_warm: int = Field(64, ge=1, description="Warm sandboxes over all images, at most.")
    sandbox_max: int = Field(4096, ge=1, description="Sandboxes this node holds at most.")
    sandbox_memory_mb: int | None = Field(
        None,
        ge=64,
        description="Memory this node's sandboxes may hold together: the sum of their "
        "memory limits (memory_mb) stays within it, a create past it is refused (503 "
        "no_capacity; placement sends it to a node with room). Default: the host's memory "
        "less memory_reserve_mb, as jails_memory_mb for the jails "
        "(resolved_sandbox_memory_mb).",
    )
    sandbox_cpu: float | None = Field(
        None,
        gt=0,
        description="CPU (cores) this node's sandboxes may hold together, their cpu quotas "
        "summed. Default: the host's cores times SANDBOX_CPU_OVERCOMMIT (a CPU quota is a "
        "ceiling, not a reservation).",
    )
    sandbox_create_concurrency: int = Field(
        8, ge=1, description="Sandbox creates the node runs at once."
    )
    sandbox_create_queue: int = Field(
        256, ge=0, description="Creates that may wait for one of those; more fail at once."
    )
    sandbox_create_wait_seconds: float = Field(
        30.0, gt=0, description="How long a create waits before it fails (503 no_capacity)."
    )
    sandbox_transfers_per_tenant: int = Field(
        8,
        ge=1,
        description="File transfers (downloads, uploads, listing pages) one tenant runs at "
        "once on this node; more are refused with 429 too_many_transfers.",
    )
    sandbox_transfers_per_node: int = Field(
        64, ge=1, description="File transfers this node runs at once over all tenants."
    )
    sandbox_max_watchers: int = Field(
        1024, ge=1, description="Directory watchers (E2B watch_dir) the node holds at most."
    )
    sandbox_max_watchers_per_tenant: int = Field(
        64,
        ge=1,
        description="Directory watchers one tenant holds at most on this node, over its "
        "sandboxes (more: 429 watcher_quota_exceeded).",
    )
    sandbox_runtime: str = Field(
        "crun", pattern=r"^(crun|runc)$", description="The OCI runtime of container sandboxes."
    )
    sandbox_network_cidr: str | None = Field(
        "10.213.0.0/16",
        description="Addresses of sandboxes that ask for a network (a /30 each); unset: "
        "this node refuses them (node/sandboxes/network.py).",
    )
    sandbox_network_deny: list[str] = Field(
        default_factory=lambda: list(DEFAULT_DENY),
        description="Networks no sandbox reaches whatever its allow list says (RFC 1918 "
        "and CGNAT by default: add the cluster's own; loopback, link-local and multicast "
        "are always closed).",
    )
    sandbox_dns: list[str] = Field(
        default_factory=list,
        description="Resolvers the node asks for the names its sandboxes may look up beyond "
        "their allow list's (``IP``, ``IP:PORT``); empty: the host's /etc/resolv.conf "
        "(node/sandboxes/dns.py).",
    )
    sandbox_user_namespaces: bool = Field(
        True,
        description="Run each container sandbox in a user namespace of its own (root inside "
        "is an unprivileged host uid). Off only on kernels without idmapped mounts (< 5.19): "
        "root inside is then host root.",
    )
    sandbox_uid_ranges_dir: Path = Field(
        Path("/run/corral/uid-ranges"),
        description="The host-wide registry of sandboxes' host id ranges (shared by every "
        "node on the host; node/sandboxes/crun/uidranges.py).",
    )
    sandbox_uid_first: int = Field(
        1 << 28, ge=65536, description="The first host uid/gid given to sandboxes' ranges."
    )
    sandbox_uid_slots: int = Field(
        16384, ge=1, description="How many ranges of 65,536 ids sandboxes may hold on the host."
    )
    sandbox_lxcfs_dir: Path | None = Field(
        Path("/run/corral/lxcfs"),
        description="Where the host's LXCFS serves sandboxes their own /proc figures (memory, "
        "CPUs, uptime); unset: sandboxes see the host's (node/sandboxes/crun/lxcfs.py).",
    )
    node_token: SecretStr | None = Field(
        None,
        description="Bearer token of the node's sandbox API, shared with the gateways "
        "(required by a separate node with sandbox backends; generated when embedded).",
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.node_slots == 0:
            self.node_slots = max(8, min(MAX_SLOTS, self.resolved_memory_mb // SLOT_MEMORY_MB))
        if "fake" in self.runtimes and not self.dev_mode:
            raise ValueError("the fake runtime is for tests only; it needs CORRAL_DEV_MODE=1")
        for network in [self.sandbox_network_cidr or "0.0.0.0/32", *self.sandbox_network_deny]:
            try:
                IPv4Network(network, strict=False)
            except ValueError as exc:
                raise ValueError(f"sandbox network setting {network!r}: {exc}") from None
        for resolver in self.sandbox_dns:
            try:
                parse_upstream(resolver)
            except ValueError as exc:
                raise ValueError(f"sandbox resolver {resolver!r}: {exc}") from None
        if self.heartbeat_seconds * 2 > self.node_dead_after_seconds:
            raise ValueError(
                "CORRAL_NODE_DEAD_AFTER_SECONDS must be at least twice CORRAL_HEARTBEAT_SECONDS"
            )
        return self

    @property
    def resolved_node_id(self) -> str:
        return self.node_id or f"{socket.gethostname()}-{os.getpid()}"

    @property
    def resolved_images_dir(self) -> Path:
        return self.images_dir if self.images_dir is not None else self.data_dir / "images"

    @property
    def control_urls(self) -> list[str]:
        return [url.strip() for url in (self.control_url or "").split(",") if url.strip()]

    @property
    def resolved_memory_mb(self) -> int:
        if self.node_memory_mb is not None:
            return self.node_memory_mb
        return max(64, host_memory_mb() * 3 // 4)

    @property
    def resolved_sandbox_memory_mb(self) -> int:
        """What the node's sandboxes may hold together (``sandbox_memory_mb``)."""
        if self.sandbox_memory_mb is not None:
            return self.sandbox_memory_mb
        return default_sandbox_memory_mb(self.memory_reserve_mb)

    @property
    def resolved_sandbox_cpu(self) -> float:
        if self.sandbox_cpu is not None:
            return self.sandbox_cpu
        return float((os.cpu_count() or 1) * SANDBOX_CPU_OVERCOMMIT)


def host_memory_mb() -> int:
    """The host's physical memory, in MiB."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)


def default_sandbox_memory_mb(reserve_mb: int) -> int:
    """The memory a node's sandboxes hold together by default: the host's less the
    node's reserve (``memory_reserve_mb``), at least ``MIN_SANDBOX_MEMORY_MB``."""
    return max(MIN_SANDBOX_MEMORY_MB, host_memory_mb() - reserve_mb)
