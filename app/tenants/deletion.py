"""Deleting a tenant (``DELETE /v1/tenants/{id}``, the console's tenant page).

A deletion **keeps** the tenant's records by default: the tenant is marked deleted
(``deleted_at``) and disabled for good (it cannot be enabled again, nor given a key), its
keys are revoked (every gateway refuses them at once), and its live sandboxes are ended
through the normal destroy path (``app.sandboxes.teardown``: the row ``stopping`` and its
charge closed in one commit, its node's teardown after), so their usage is metered to
their end. Its invocations, functions, sandbox records, snapshots and usage stay, for the
bill and for the operator to read.

A **purge** removes, as well, what the tenant put in or got out: its final invocations
with their blobs (code, inputs, outputs), its functions with their versions and
artifacts, its snapshots (deleted on their nodes, then their rows) and the images it built
(``tenant_images``, whose files are snapshots), its sandbox records
once a sandbox is stopped and metered to its end, and its console sessions. It keeps the
tenant's row (its name stays taken), its revoked keys (hashes, no secrets) and its usage
(``usage_events`` and ``usage_rollups``: the bill, with no content).

Every table keeps its one writer: sandbox rows are moved by the destroy path (compare and
set) and deleted only once stopped and metered, when nothing writes them any more; an
invocation is deleted only when final, as the retention pass does (an open one is the
recorder's and the reconciler's: the tenant being disabled, it ends and the next purge
takes it); snapshots go through ``app.sandboxes.snapshots``. What a purge could not remove
yet (an open invocation, a sandbox still stopping, a snapshot whose node is out of reach)
is counted in ``remaining``, as is what one call leaves of a large tenant's invocations
(``MAX_BATCHES`` of ``BATCH`` at most); asking again removes it. Each step is idempotent, so a
deletion cut at any point (a gateway that died, a node out of reach) is finished by
asking again; ``purged_at`` is set when a purge leaves nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sqlalchemy import ColumnElement, Executable, delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.db import blobs
from app.db.invocations import FINAL
from app.db.models import (
    ApiKey,
    ConsoleSession,
    Function,
    FunctionArtifact,
    FunctionVersion,
    Invocation,
    Sandbox,
    Snapshot,
    Tenant,
    TenantImage,
)
from app.errors import Conflict, CorralError, NotFound
from app.sandboxes.listing import LIVE
from wire.sandboxes import SandboxState

if TYPE_CHECKING:
    from app.services import Services

log = logging.getLogger(__name__)

#: rows deleted per statement (and transaction), as the retention pass
BATCH = 1000
#: invocation batches one call deletes at most: a large tenant's purge is finished by
#: asking again (``remaining``), never by one request that runs for minutes
MAX_BATCHES = 20


@dataclass
class Deletion:
    """What one deletion did, and (a purge) what it left for the next."""

    tenant: Tenant
    sandboxes_ended: int = 0
    purged: dict[str, int] = field(default_factory=dict)
    remaining: dict[str, int] = field(default_factory=dict)


async def delete_tenant(services: Services, tenant_id: str, *, purge: bool) -> Deletion:
    """Delete the tenant (keep or purge, above); safe to ask again."""
    now = datetime.now(UTC)
    async with services.sessions.begin() as session:
        await _mark_deleted(session, tenant_id, now)
    await services.authenticator.revoked(tenant_id)
    done = Deletion(tenant=await _tenant(services.sessions, tenant_id))
    done.sandboxes_ended = await _end_sandboxes(services, tenant_id)
    if purge:
        done.purged["snapshots"] = await _delete_snapshots(services, tenant_id)
        done.purged |= await _purge_rows(services.sessions, tenant_id)
        done.remaining = await _remaining(services.sessions, tenant_id)
        if not any(done.remaining.values()):
            async with services.sessions.begin() as session:
                await session.execute(
                    update(Tenant)
                    .where(Tenant.id == tenant_id, Tenant.purged_at.is_(None))
                    .values(purged_at=now)
                )
        done.tenant = await _tenant(services.sessions, tenant_id)
    log.info(
        "tenant=%s: deleted (%s), %d sandboxes ended, purged %s, remaining %s",
        tenant_id,
        "purge" if purge else "keep",
        done.sandboxes_ended,
        done.purged,
        done.remaining,
    )
    return done


def refuse_deleted(tenant: Tenant, what: str) -> None:
    """409 for a change a deleted tenant cannot take (enabled again, a new key)."""
    if tenant.deleted_at is not None:
        raise Conflict(f"tenant {tenant.id!r} is deleted: it cannot be {what}")


async def _mark_deleted(session: AsyncSession, tenant_id: str, now: datetime) -> None:
    tenant = await session.get(Tenant, tenant_id)
    if tenant is None:
        raise NotFound(f"no tenant {tenant_id!r}")
    tenant.disabled = True
    if tenant.deleted_at is None:
        tenant.deleted_at = now
    await session.execute(
        update(ApiKey)
        .where(ApiKey.tenant_id == tenant_id, ApiKey.revoked_at.is_(None))
        .values(revoked_at=now)
    )


async def _tenant(sessions: async_sessionmaker[AsyncSession], tenant_id: str) -> Tenant:
    async with sessions() as session:
        tenant = await session.get(Tenant, tenant_id, populate_existing=True)
    assert tenant is not None  # marked deleted, never removed
    return tenant


async def _end_sandboxes(services: Services, tenant_id: str) -> int:
    """Destroy the tenant's live sandboxes, each through the normal destroy path."""
    query = select(Sandbox.id).where(
        Sandbox.tenant_id == tenant_id, Sandbox.state.in_([s.value for s in LIVE])
    )
    async with services.sessions() as session:
        live = (await session.scalars(query)).all()
    for sandbox_id in live:
        await services.sandboxes.destroy(tenant_id, sandbox_id)
    return len(live)


async def _delete_snapshots(services: Services, tenant_id: str) -> int:
    """Delete the tenant's snapshots on their nodes (then mark their rows); how many.
    One a node keeps (out of reach, or a sandbox still stopping on it) is left."""
    query = select(Snapshot.id).where(
        Snapshot.tenant_id == tenant_id, Snapshot.deleted_at.is_(None)
    )
    async with services.sessions() as session:
        kept = (await session.scalars(query)).all()
    deleted = 0
    for snapshot_id in kept:
        try:
            # an image's files too: the purge takes the tenant's images with it
            await services.sandboxes.snapshots.delete(tenant_id, snapshot_id, image=True)
            deleted += 1
        except NotFound:
            deleted += 1  # gone already
        except CorralError as exc:
            log.warning("tenant=%s: snapshot %s kept (%s)", tenant_id, snapshot_id, exc.message)
    return deleted


async def _purge_rows(sessions: async_sessionmaker[AsyncSession], tenant_id: str) -> dict[str, int]:
    """Delete the tenant's rows that nothing writes any more; how many of each."""
    purged = {"invocations": 0, "blobs": 0}
    for _ in range(MAX_BATCHES):
        async with sessions.begin() as session:
            doomed = (
                await session.scalars(
                    select(Invocation.id)
                    .where(Invocation.tenant_id == tenant_id, Invocation.status.in_(list(FINAL)))
                    .limit(BATCH)
                )
            ).all()
            purged["blobs"] += await blobs.delete_of(session, doomed)
            if doomed:
                await session.execute(delete(Invocation).where(Invocation.id.in_(list(doomed))))
        purged["invocations"] += len(doomed)
        if len(doomed) < BATCH:
            break
    async with sessions.begin() as session:
        functions = select(Function.id).where(Function.tenant_id == tenant_id)
        await session.execute(
            delete(FunctionVersion).where(FunctionVersion.function_id.in_(functions))
        )
        purged["functions"] = await _count(
            session, delete(Function).where(Function.tenant_id == tenant_id)
        )
        await session.execute(
            delete(FunctionArtifact).where(FunctionArtifact.tenant_id == tenant_id)
        )
        purged["images"] = await _count(
            session, delete(TenantImage).where(TenantImage.tenant_id == tenant_id)
        )
        await session.execute(  # deleted on their nodes: counted as snapshots above
            delete(Snapshot).where(
                Snapshot.tenant_id == tenant_id, Snapshot.deleted_at.is_not(None)
            )
        )
        purged["sandboxes"] = await _count(
            session, delete(Sandbox).where(Sandbox.tenant_id == tenant_id, _metered_to_end())
        )
        await session.execute(delete(ConsoleSession).where(ConsoleSession.tenant_id == tenant_id))
    return purged


def _metered_to_end() -> ColumnElement[bool]:
    """A stopped sandbox whose usage is recorded to its end (or that never started)."""
    return (Sandbox.state == SandboxState.STOPPED.value) & (
        Sandbox.started_at.is_(None)
        | Sandbox.ended_at.is_(None)
        | (Sandbox.metered_until >= Sandbox.ended_at)
    )


async def _count(session: AsyncSession, statement: Executable) -> int:
    result = await session.execute(statement)
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


async def _remaining(sessions: async_sessionmaker[AsyncSession], tenant_id: str) -> dict[str, int]:
    """What a purge left: open invocations, sandboxes not yet stopped and metered,
    snapshots still kept."""
    async with sessions() as session:
        invocations = await session.scalar(
            select(func.count()).select_from(Invocation).where(Invocation.tenant_id == tenant_id)
        )
        sandboxes = await session.scalar(
            select(func.count()).select_from(Sandbox).where(Sandbox.tenant_id == tenant_id)
        )
        snapshots = await session.scalar(
            select(func.count()).select_from(Snapshot).where(Snapshot.tenant_id == tenant_id)
        )
    return {
        "invocations": int(invocations or 0),
        "sandboxes": int(sandboxes or 0),
        "snapshots": int(snapshots or 0),
    }
