"""Sandbox records as the gateway reads and moves them: a tenant's rows, where a sandbox
lives, and every transition by compare-and-set (``app.db.sandboxes``), a row moved to
stopped having its last usage recorded at once (``app.sandboxes.metering``)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db import sandboxes as sandbox_rows
from app.db.models import Sandbox
from app.db.transactions import Transactions
from app.errors import NotFound
from app.quotas.spec import QuotaLimits
from app.sandboxes import listing, metering
from app.sandboxes.admission import Held
from app.sandboxes.place import PLACE, SandboxPlace
from wire.sandboxes import SandboxState, SandboxStatus

log = logging.getLogger(__name__)


def at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def fields(row: Sandbox, status: SandboxStatus) -> dict[str, Any]:
    """What a node's status of the sandbox changes in its row."""
    values: dict[str, Any] = {
        "state": status.state.value,
        "expires_at": at(status.expires_at),
        "image_digest": status.image_digest,
    }
    if status.cpu_ms is not None:
        values["cpu_ms"] = status.cpu_ms
    if status.memory_bytes is not None:
        values["memory_bytes"] = status.memory_bytes
    if status.state is SandboxState.STOPPED:
        values["ended_at"] = row.ended_at or datetime.now(UTC)
        values["reason"] = status.reason
    return values


def stopped(row: Sandbox) -> dict[str, Any]:
    """A destroyed (``stopping``) row's last move: stopped, its end and reason as its
    destroy's acknowledgment recorded them."""
    return {
        "state": SandboxState.STOPPED.value,
        "reason": row.reason or "destroyed",
        "ended_at": row.ended_at or datetime.now(UTC),
    }


class Records:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        rows: Transactions,
        meter_every_s: float,
    ) -> None:
        """``rows``: the committer that reads rows by key and commits the transitions
        (on the embedded SQLite file: on the event loop, no driver thread between)."""
        self.sessions = sessions
        self._rows = rows
        self._meter_every_s = meter_every_s

    async def get(self, tenant_id: str, sandbox_id: str) -> Sandbox:
        row = await self._rows.get(Sandbox, sandbox_id)
        if row is None or row.tenant_id != tenant_id:
            raise NotFound(f"no sandbox {sandbox_id}")
        return row

    async def current(self, sandbox_id: str) -> Sandbox:
        """The row as stored now (after a writer found it moved)."""
        row = await self._rows.get(Sandbox, sandbox_id)
        if row is None:
            raise NotFound(f"no sandbox {sandbox_id}")
        return row

    async def place_of(self, sandbox_id: str) -> SandboxPlace | None:
        """Where a sandbox lives, whoever's it is; None: no such sandbox."""
        values = await self._rows.read(PLACE, sandbox_id)
        return None if values is None else SandboxPlace.of(values)

    async def of_tenant(
        self,
        tenant_id: str,
        filters: listing.Filters,
        *,
        limit: int,
        after: tuple[datetime, str] | None = None,
    ) -> list[Sandbox]:
        async with self.sessions() as session:
            dialect = session.get_bind().dialect.name
            query = listing.query(tenant_id, filters, dialect=dialect, limit=limit, after=after)
            return list((await session.scalars(query)).all())

    async def held(self, tenant_id: str) -> Held:
        """What the tenant's live sandboxes hold together (its ``sandbox_totals``)."""
        return sandbox_rows.held_of(await self._rows.read(sandbox_rows.HELD, tenant_id))

    async def move(self, row: Sandbox, **values: Any) -> Sandbox | None:
        """Store ``values`` over ``row`` as it was read (compare-and-set:
        ``app.db.sandboxes``): the row as now stored, or None if another writer moved it
        first (nothing is written then). A row moved to stopped has its last usage
        recorded."""
        (moved,) = await self._rows.run([sandbox_rows.Transition(row, values)])
        if not moved:
            return None
        for name, value in values.items():
            setattr(row, name, value)
        row.version += 1
        if row.state == SandboxState.STOPPED.value:
            await self._meter_final(row)
        return row

    async def admit(self, row: Sandbox, quota: QuotaLimits) -> bool:
        """Record a new live sandbox within the tenant's quota, in one commit
        (``app.db.sandboxes.admit_on``); False: past the quota, nothing written."""
        (admitted,) = await self._rows.run([sandbox_rows.Admit(row, quota)])
        return bool(admitted)

    async def apply(self, row: Sandbox, status: SandboxStatus) -> Sandbox:
        """Store what a node says of the sandbox over the row as read; if another writer
        moved the row meanwhile, the row as it now is (the next ``sync`` brings it to
        the node's word if they still differ)."""
        stored = await self.move(row, **fields(row, status))
        return stored if stored is not None else await self.current(row.id)

    async def store_readings(self, readings: list[sandbox_rows.Reading]) -> None:
        """The nodes' latest CPU and memory readings of live sandboxes, into their records
        in one transaction (the daily CPU quota reads them: ``app.quotas.readings``)."""
        if readings:
            async with self.sessions.begin() as session:
                await sandbox_rows.store_readings(session, readings)

    async def _meter_final(self, row: Sandbox) -> None:
        """The usage of a sandbox just recorded stopped, up to its end (if this fails, the
        leader's next metering pass records it)."""
        try:
            await metering.meter_ended(self._rows, row)
        except Exception as exc:
            log.warning("sandbox=%s: its last usage is not recorded yet (%r)", row.id, exc)

    async def meter(self) -> int:
        """Record the usage of live and just-ended sandboxes (``app.sandboxes.metering``)."""
        return await metering.meter(
            self.sessions, now=datetime.now(UTC), every_s=self._meter_every_s
        )
