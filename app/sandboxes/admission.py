"""What a sandbox operation must pass before it runs: the tenant's sandbox quotas.

    every sandbox call    a token from the tenant's sandbox-calls bucket
                          (``sandbox_calls_per_second``, ``sandbox_call_burst``; a call
                          waits up to ``CALL_WAIT_S`` for one), else 429 ``rate_limited``:
                          /v1/sandboxes and /v1/snapshots (``app.api.v1.sandboxes``), the
                          E2B control plane and in-sandbox routes (``app.api.e2b.auth``)
    create, fork          the size of one sandbox (``size_refusal``: 422
                          ``sandbox_too_large`` naming the field), the daily CPU budget,
                          then what the live sandboxes hold together (``totals_refusal``:
                          429 ``concurrency_limited`` or ``sandbox_quota_exhausted``),
                          judged against the tenant's ``sandbox_totals`` before the node
                          is asked, and again by the one conditional update that records
                          the sandbox (``app.db.sandboxes.admit``)
    exec, process start, the interpreter's execute, resume, E2B connect
                          the daily CPU budget (``cpu``: 429 ``cpu_quota_exhausted``,
                          Retry-After until UTC midnight), as invocations
    snapshot, fork        the snapshots kept and the storage quota (``snapshot_refusal``)

The CPU budget is read through ``app.quotas.readings`` (cached ``cache_seconds``, one
read shared by the calls that miss together), so on the exec path it costs a dict
lookup and a clock read; the sandbox-calls bucket is the admission counters' (in
process, or one Redis script in a cluster).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from app.auth.principal import Principal
from app.errors import (
    ConcurrencyLimited,
    CpuQuotaExhausted,
    QuotaExceeded,
    RateLimited,
    SandboxQuotaExhausted,
    SandboxTooLarge,
    SnapshotQuotaExhausted,
    StorageQuotaExhausted,
)
from app.quotas.counters import QuotaCounters
from app.quotas.readings import Readings, seconds_until_utc_midnight
from app.quotas.spec import QuotaLimits
from app.quotas.throttles import Throttles

#: how long a sandbox call waits for a token of its bucket before it is refused
CALL_WAIT_S = 1.0
#: sandboxes end (and free what they hold) all the time: when to ask again
SANDBOX_RETRY_AFTER_S = 1.0
#: snapshots are freed only by a delete, storage by a delete or a blob's expiry
SNAPSHOT_RETRY_AFTER_S = 60.0
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Ask:
    """What one sandbox holds: its CPU quota (cores), memory and writable layer (MiB)."""

    cpu: float
    memory_mb: int
    disk_mb: int

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> Ask:
        """The size a sandbox's recorded spec gives it (the create's defaults if absent)."""
        return cls(
            cpu=float(spec.get("cpu", 1.0)),
            memory_mb=int(spec.get("memory_mb", 512)),
            disk_mb=int(spec.get("disk_mb", 1024)),
        )


@dataclass(frozen=True, slots=True)
class Held:
    """What a tenant's live sandboxes hold together (``sandbox_totals``): how many, their
    memory and disk (MiB) and CPU (thousandths of a core, kept as an integer so that
    adding and taking off never drifts)."""

    count: int = 0
    memory_mb: int = 0
    cpu_milli: int = 0
    disk_mb: int = 0

    @classmethod
    def of(cls, asks: Iterable[Ask]) -> Held:
        held = list(asks)
        return cls(
            count=len(held),
            memory_mb=sum(a.memory_mb for a in held),
            cpu_milli=sum(milli(a.cpu) for a in held),
            disk_mb=sum(a.disk_mb for a in held),
        )

    def plus(self, asks: Iterable[Ask]) -> Held:
        more = Held.of(asks)
        return Held(
            count=self.count + more.count,
            memory_mb=self.memory_mb + more.memory_mb,
            cpu_milli=self.cpu_milli + more.cpu_milli,
            disk_mb=self.disk_mb + more.disk_mb,
        )


def milli(cpu: float) -> int:
    """Cores in thousandths (what ``Held`` and ``sandbox_totals`` count)."""
    return round(cpu * 1000)


def size_refusal(quota: QuotaLimits, ask: Ask) -> SandboxTooLarge | None:
    """Why one sandbox of this size may not be made for the tenant, if it may not."""
    for field, asked, limit, unit in (
        ("max_sandbox_memory_mb", ask.memory_mb, quota.max_sandbox_memory_mb, "MiB of memory"),
        ("max_sandbox_cpu", ask.cpu, quota.max_sandbox_cpu, "CPU"),
        ("max_sandbox_disk_mb", ask.disk_mb, quota.max_sandbox_disk_mb, "MiB of disk"),
    ):
        if asked > limit:
            return SandboxTooLarge(
                f"the sandbox asks {asked:g} {unit}, over the tenant's {field} {limit:g}",
                details={"quota": field, "limit": limit, "asked": asked},
            )
    return None


def totals_refusal(
    quota: QuotaLimits, live: Held | Iterable[Ask], ask: Ask
) -> QuotaExceeded | None:
    """Why the tenant may not hold ``ask`` more, its ``live`` sandboxes (``ask`` not
    among them) held, if it may not (the same bounds as ``app.db.sandboxes.admit``)."""
    held = live if isinstance(live, Held) else Held.of(live)
    if held.count + 1 > quota.max_concurrent_sandboxes:
        return ConcurrencyLimited(
            f"the tenant holds {held.count} live sandboxes, its max_concurrent_sandboxes "
            f"{quota.max_concurrent_sandboxes}",
            retry_after=SANDBOX_RETRY_AFTER_S,
            details={"quota": "max_concurrent_sandboxes", "limit": quota.max_concurrent_sandboxes},
        )
    for field, asked, used, limit, unit in (
        (
            "max_sandboxes_memory_mb",
            ask.memory_mb,
            held.memory_mb,
            quota.max_sandboxes_memory_mb,
            "MiB of memory",
        ),
        (
            "max_sandboxes_cpu",
            ask.cpu,
            held.cpu_milli / 1000,
            quota.max_sandboxes_cpu,
            "CPU",
        ),
        (
            "max_sandboxes_disk_mb",
            ask.disk_mb,
            held.disk_mb,
            quota.max_sandboxes_disk_mb,
            "MiB of disk",
        ),
    ):
        if used + asked > limit:
            return SandboxQuotaExhausted(
                f"the tenant's live sandboxes hold {used:g} {unit}; {asked:g} more would pass "
                f"its {field} {limit:g}",
                retry_after=SANDBOX_RETRY_AFTER_S,
                details={"quota": field, "limit": limit, "held": used, "asked": asked},
            )
    return None


def snapshot_refusal(
    quota: QuotaLimits, *, kept: int, stored_bytes: int, adding_bytes: int
) -> QuotaExceeded | None:
    """Why the tenant may not keep one more snapshot of about ``adding_bytes``, if not:
    it keeps ``kept`` snapshots and stores ``stored_bytes`` (outputs and snapshots)."""
    if kept >= quota.max_snapshots:
        return SnapshotQuotaExhausted(
            f"the tenant keeps {kept} snapshots, its max_snapshots {quota.max_snapshots}: "
            "delete some first",
            retry_after=SNAPSHOT_RETRY_AFTER_S,
            details={"quota": "max_snapshots", "limit": quota.max_snapshots},
        )
    limit = quota.max_storage_mb * MIB
    if stored_bytes >= limit or stored_bytes + adding_bytes > limit:
        return StorageQuotaExhausted(
            f"the tenant stores {stored_bytes / MIB:.1f} MiB (large outputs and snapshots); "
            f"a snapshot of this sandbox's {adding_bytes / MIB:.1f} MiB would pass its "
            f"max_storage_mb {quota.max_storage_mb}: delete snapshots first",
            retry_after=SNAPSHOT_RETRY_AFTER_S,
            details={
                "quota": "max_storage_mb",
                "limit": quota.max_storage_mb,
                "stored_bytes": stored_bytes,
                "asked_bytes": adding_bytes,
            },
        )
    return None


class SandboxAdmission:
    """The checks that need shared state: the sandbox-calls bucket and the CPU reading."""

    def __init__(
        self,
        counters: QuotaCounters,
        readings: Readings,
        *,
        call_wait_s: float = CALL_WAIT_S,
        throttles: Throttles | None = None,
    ) -> None:
        self._counters = counters
        self._throttles = throttles
        self.readings = readings
        self._call_wait_s = call_wait_s

    async def call(self, principal: Principal) -> None:
        """Take one token of the tenant's sandbox-calls bucket, waiting for it if it is
        due within ``CALL_WAIT_S``; else 429 ``rate_limited``."""
        quota = principal.quota
        wait = await self._counters.reserve_token(
            principal.tenant_id,
            rate=quota.sandbox_calls_per_second,
            burst=quota.sandbox_call_burst,
            max_wait=self._call_wait_s,
            bucket="sandbox_calls",
        )
        rate = quota.sandbox_calls_per_second
        if wait is None:
            if self._throttles is not None:
                await self._throttles.note(
                    principal.tenant_id, "sandbox_calls_per_second", "refused", limit=rate
                )
            raise RateLimited(
                f"over the tenant's sandbox_calls_per_second {rate:g}",
                retry_after=max(1.0, 1.0 / rate),
                limit=rate,
                details={"quota": "sandbox_calls_per_second"},
            )
        if wait > 0:
            if self._throttles is not None:
                await self._throttles.note(
                    principal.tenant_id,
                    "sandbox_calls_per_second",
                    "delayed",
                    limit=rate,
                    waited_s=wait,
                )
            await asyncio.sleep(wait)

    async def cpu(self, principal: Principal) -> None:
        """Refuse (429 ``cpu_quota_exhausted``) once the tenant used its CPU of the day."""
        limit = principal.quota.cpu_seconds_per_day
        if await self.readings.cpu_seconds_today(principal.tenant_id) >= limit:
            raise CpuQuotaExhausted(
                f"the tenant used its cpu_seconds_per_day {limit:g} (invocations and "
                "sandboxes); it is renewed at midnight UTC",
                retry_after=seconds_until_utc_midnight(),
                details={"quota": "cpu_seconds_per_day", "limit": limit},
            )
