"""A tenant's quota: its fields are declared here, once.

``QuotaLimits`` is the value (immutable, cached by admission), the API's answer and
the JSON stored in ``quotas.limits``; ``QuotaDefaults`` reads the defaults of new tenants
from ``CORRAL_QUOTA_*``; ``QuotaPatch`` (any subset, every constraint kept) is derived
from it. Adding a quota is adding a field below.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic_settings import BaseSettings, SettingsConfigDict


class QuotaLimits(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_concurrent_executions: int = Field(
        128,
        ge=1,
        le=100_000,
        description="Executions running at once (more wait in admission). RL reward clients "
        "send whole batches at once; nodes share their slots fairly between tenants.",
    )
    max_concurrent_sandboxes: int = Field(8, ge=0, le=100_000, description="Live sandboxes.")
    executions_per_second: float = Field(
        5_000.0,
        gt=0,
        le=1_000_000,
        description="Sustained rate of new executions (the default is above what one "
        "machine serves: a quota is there to share a cluster, not to slow one box down).",
    )
    burst: int = Field(
        10_000, ge=1, le=10_000_000, description="Token-bucket size for executions_per_second."
    )
    cpu_seconds_per_day: float = Field(86_400.0, gt=0, description="CPU time per UTC day.")
    max_storage_mb: int = Field(
        1024,
        ge=1,
        le=1_048_576,
        description="Large outputs (parts over 64 KiB) kept for the blob retention, and "
        "sandbox snapshots kept; past it new executions and snapshots get 429 "
        "storage_quota_exhausted until some outputs expire or snapshots are deleted.",
    )
    max_memory_mb: int = Field(1024, ge=16, le=1_048_576, description="Memory of one execution.")
    max_wall_seconds: float = Field(
        60.0, gt=0, le=86_400, description="Time limit of one stage (compile or run)."
    )
    max_sandbox_lifetime_seconds: int = Field(
        3600, ge=1, le=30 * 86_400, description="Lifetime of one sandbox."
    )
    # --- sandboxes: the size of one, what all live ones hold together, their calls ---
    max_sandbox_memory_mb: int = Field(
        8192, ge=32, le=262_144, description="Memory of one sandbox (its memory_mb)."
    )
    max_sandbox_cpu: float = Field(4.0, gt=0, le=64, description="CPU of one sandbox (cores).")
    max_sandbox_disk_mb: int = Field(
        16_384, ge=16, le=1_048_576, description="Writable layer of one sandbox (its disk_mb)."
    )
    max_sandboxes_memory_mb: int = Field(
        16_384,
        ge=0,
        le=100_000_000,
        description="Memory of the tenant's live sandboxes together (their memory_mb summed).",
    )
    max_sandboxes_cpu: float = Field(
        16.0, ge=0, le=1_000_000, description="CPU of the tenant's live sandboxes together."
    )
    max_sandboxes_disk_mb: int = Field(
        32_768,
        ge=0,
        le=1_000_000_000,
        description="Writable layers of the tenant's live sandboxes together (disk_mb summed).",
    )
    max_snapshots: int = Field(
        64, ge=0, le=100_000, description="Snapshots kept (made and not deleted)."
    )
    sandbox_calls_per_second: float = Field(
        2_000.0,
        gt=0,
        le=1_000_000,
        description="Sustained rate of sandbox calls (create, exec, files, processes, "
        "snapshots, pause and resume; /v1/sandboxes and the E2B API alike).",
    )
    sandbox_call_burst: int = Field(
        4_000, ge=1, le=10_000_000, description="Token-bucket size for sandbox_calls_per_second."
    )
    time_limit_basis: Literal["wall", "cpu"] = Field(
        "wall",
        description="How a time limit is judged: wall-clock time (fast verdicts; a stage "
        "starved of CPU is flagged contended), or CPU time with a wall-clock backstop "
        "(exact verdicts, more latency under contention).",
    )

    def merged(self, patch: BaseModel | None) -> QuotaLimits:
        """These limits with the fields ``patch`` sets replaced."""
        if patch is None:
            return self
        return QuotaLimits.model_validate(self.model_dump() | patch.model_dump(exclude_none=True))

    @classmethod
    def stored(cls, limits: dict[str, Any], defaults: QuotaLimits) -> QuotaLimits:
        """The limits kept in the database; a field added since falls back to ``defaults``."""
        known = {k: v for k, v in limits.items() if k in cls.model_fields}
        return cls.model_validate(defaults.model_dump() | known)


#: The quotas that only pace a tenant (a rate, a burst, executions at once): what the
#: keyless tenant of one box is not held to unless the operator sets them.
PACING = (
    "executions_per_second",
    "burst",
    "max_concurrent_executions",
    "sandbox_calls_per_second",
    "sandbox_call_burst",
)
#: The pacing defaults before issue 30: a keyless tenant still holding all of them was
#: made by an older ``make run``, and is lifted (``keyless_limits``).
OLD_PACING = {
    "executions_per_second": 200.0,
    "burst": 400,
    "max_concurrent_executions": 128,
    "sandbox_calls_per_second": 100.0,
    "sandbox_call_burst": 500,
}


class QuotaDefaults(QuotaLimits, BaseSettings):
    """The quotas of a new tenant unless the admin says otherwise (``CORRAL_QUOTA_*``)."""

    model_config = SettingsConfigDict(env_prefix="CORRAL_QUOTA_", extra="ignore", frozen=True)

    def limits(self) -> QuotaLimits:
        return QuotaLimits.model_validate(self.model_dump())

    def keyless_limits(self) -> QuotaLimits:
        """The quotas of the keyless tenant (``default_tenant``: local clients of one box,
        SandboxFusion's): the defaults, with every pacing quota the operator did not set
        (``CORRAL_QUOTA_*``) at its highest, so the machine's capacity (its nodes' slots,
        the admission queue) is what limits them, not a rate meant for sharing a cluster."""
        fields = QuotaLimits.model_fields
        lifted: dict[str, Any] = {}
        for name in PACING:
            if name in self.model_fields_set:
                continue
            bound = next(m.le for m in fields[name].metadata if getattr(m, "le", None))
            lifted[name] = bound
        return QuotaLimits.model_validate(self.model_dump() | lifted)


def _patch_model() -> type[BaseModel]:
    fields: dict[str, Any] = {
        name: (
            Optional[  # noqa: UP045 - a type built at run time
                Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
            ],
            Field(None, description=info.description),
        )
        for name, info in QuotaLimits.model_fields.items()
    }
    return create_model(
        "QuotaPatch",
        __config__=ConfigDict(extra="forbid"),
        __doc__="Any subset of a tenant's quotas.",
        **fields,
    )


QuotaPatch = _patch_model()
