"""Snapshots of sandboxes' files, kept on the node that made them.

A snapshot is admitted before anything is copied, as a create is: its row, sized as the
sandbox's disk use now, is written in a transaction that counts it against
``max_snapshots`` and ``max_storage_mb``, the tenant's snapshots taking turns there (a
lock on the tenant's row on PostgreSQL, SQLite's one writer); the copy's real size
replaces the estimate, and a copy the node did not make drops its row.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.principal import Principal
from app.db.models import Snapshot, Tenant
from app.errors import Conflict, NotFound
from app.images.owned import OwnedImages
from app.quotas import readings
from app.quotas.spec import QuotaLimits
from app.sandboxes.admission import snapshot_refusal
from app.sandboxes.fleet import Fleet
from app.sandboxes.records import Records
from wire.ids import new_id

log = logging.getLogger(__name__)


class Snapshots:
    def __init__(self, *, records: Records, fleet: Fleet, owned: OwnedImages) -> None:
        self._records = records
        self._sessions = records.sessions
        self._fleet = fleet
        self._owned = owned

    async def snapshot(self, principal: Principal, sandbox_id: str) -> Snapshot:
        """Copy the sandbox's files, within the tenant's ``max_snapshots`` and
        ``max_storage_mb`` (judged before anything is copied)."""
        tenant_id = principal.tenant_id
        row = await self._records.get(tenant_id, sandbox_id)
        node = await self._fleet.node_of(row)
        in_use = (await node.status(sandbox_id)).disk_bytes or 0
        snapshot = Snapshot(
            id=new_id("snap"),
            tenant_id=tenant_id,
            sandbox_id=sandbox_id,
            node_id=node.node_id,
            backend=row.backend,
            image=row.image,
            image_digest=row.image_digest or "",
            size_bytes=in_use,
            created_at=datetime.now(UTC),
        )
        await self._reserve(snapshot, principal.quota)
        try:
            info = await node.snapshot(sandbox_id, snapshot.id)
        except BaseException:
            await asyncio.shield(self._drop_row(snapshot.id))
            raise
        async with self._sessions() as session, session.begin():
            await session.execute(
                update(Snapshot)
                .where(Snapshot.id == snapshot.id)
                .values(size_bytes=info.size_bytes, image_digest=info.image_digest)
            )
        snapshot.size_bytes, snapshot.image_digest = info.size_bytes, info.image_digest
        log.info("sandbox=%s: snapshot %s (%d bytes)", sandbox_id, snapshot.id, info.size_bytes)
        return snapshot

    async def _reserve(self, snapshot: Snapshot, quota: QuotaLimits) -> None:
        """Write the row of a snapshot about to be made, sized as its sandbox's disk use
        now, unless the tenant keeps ``max_snapshots`` or it would pass the storage
        quota; the tenant's snapshots take turns here."""
        async with self._sessions() as session, session.begin():
            await _take_turn(session, snapshot.tenant_id)
            session.add(snapshot)
            await session.flush()
            kept = await session.scalar(
                select(func.count())
                .select_from(Snapshot)
                .where(
                    Snapshot.tenant_id == snapshot.tenant_id,
                    Snapshot.deleted_at.is_(None),
                    Snapshot.id != snapshot.id,
                )
            )
            stored = await readings.stored_bytes(session, snapshot.tenant_id)
            refusal = snapshot_refusal(
                quota,
                kept=int(kept or 0),
                stored_bytes=stored - snapshot.size_bytes,
                adding_bytes=snapshot.size_bytes,
            )
            if refusal is not None:
                raise refusal

    async def precheck(self, principal: Principal) -> None:
        """Refuse, before any work, a snapshot the tenant has no room for even at no
        size (it keeps ``max_snapshots``, or its storage is full); the snapshot itself
        is judged again, race-free, when it is made."""
        async with self._sessions() as session:
            kept = await session.scalar(
                select(func.count())
                .select_from(Snapshot)
                .where(Snapshot.tenant_id == principal.tenant_id, Snapshot.deleted_at.is_(None))
            )
            stored = await readings.stored_bytes(session, principal.tenant_id)
        refusal = snapshot_refusal(
            principal.quota, kept=int(kept or 0), stored_bytes=stored, adding_bytes=0
        )
        if refusal is not None:
            raise refusal

    async def _drop_row(self, snapshot_id: str) -> None:
        """Forget the row of a snapshot the node did not make."""
        try:
            async with self._sessions() as session, session.begin():
                await session.execute(delete(Snapshot).where(Snapshot.id == snapshot_id))
        except Exception as exc:
            log.warning("snapshot %s: its row is left (%r)", snapshot_id, exc)

    async def get(self, tenant_id: str, snapshot_id: str) -> Snapshot:
        async with self._sessions() as session:
            row = await session.get(Snapshot, snapshot_id)
        if row is None or row.tenant_id != tenant_id or row.deleted_at is not None:
            raise NotFound(f"no snapshot {snapshot_id}")
        return row

    async def of_tenant(self, tenant_id: str, *, limit: int) -> list[Snapshot]:
        query = (
            select(Snapshot)
            .where(Snapshot.tenant_id == tenant_id, Snapshot.deleted_at.is_(None))
            .order_by(Snapshot.created_at.desc())
            .limit(limit)
        )
        async with self._sessions() as session:
            return list((await session.scalars(query)).all())

    async def delete(self, tenant_id: str, snapshot_id: str, *, image: bool = False) -> None:
        """Delete a snapshot: refused (409) while one of the tenant's images is made of
        it, unless it is that image's delete (``image``)."""
        row = await self.get(tenant_id, snapshot_id)
        if not image:
            owner = await self._owned.using_snapshot(tenant_id, snapshot_id)
            if owner is not None:
                raise Conflict(
                    f"snapshot {snapshot_id} holds the files of the image {owner.name!r}: "
                    "delete the image (DELETE /v1/images/NAME) instead"
                )
        node = await self._fleet.node_by_id(row.node_id)
        await node.delete_snapshot(snapshot_id, tenant_id=tenant_id)
        async with self._sessions() as session, session.begin():
            stored = await session.get(Snapshot, snapshot_id)
            if stored is not None:
                stored.deleted_at = datetime.now(UTC)


async def _take_turn(session: AsyncSession, tenant_id: str) -> None:
    """Wait for the tenant's other snapshot admissions to commit, and hold the others
    back until this transaction ends: a lock on the tenant's row on PostgreSQL (one that
    does not block the rows that refer to it). SQLite has one writer: the row written
    next takes its lock, which serializes the same way."""
    await session.execute(
        select(Tenant.id).where(Tenant.id == tenant_id).with_for_update(key_share=True)
    )
