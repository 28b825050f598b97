"""Sandboxes as the control plane sees them: the one object the routes (``/v1``, E2B,
the console) and the leader's ``sandboxes`` job call, made of one part per concern:

* ``app.sandboxes.records``: the rows, read and moved by compare-and-set;
* ``app.sandboxes.fleet``: the nodes' clients, placement, the node of a sandbox;
* ``app.sandboxes.create``: a create, admitted and recorded in one commit;
* ``app.sandboxes.teardown``: a destroy acknowledged at once, its teardown off the
  caller's path (drained on close);
* ``app.sandboxes.snapshots``: snapshots, admitted before anything is copied;
* ``app.sandboxes.sync``: records and nodes made to agree, then usage metered.

Every operation on a live sandbox (pause, resume, timeout, exec, files) is routed to
the node that holds it; what the node answers is stored by compare-and-set, and a
``GET`` (``refresh``) shows the node's readings without storing them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.auth.principal import Principal
from app.db.models import Sandbox, Snapshot
from app.db.transactions import Transactions
from app.errors import NodeUnavailable, NotFound
from app.images.catalog import ControlImages
from app.images.owned import OwnedImages
from app.placement.catalogue import Catalogue
from app.sandboxes import lifetime, listing
from app.sandboxes.admission import Ask, SandboxAdmission, size_refusal, totals_refusal
from app.sandboxes.create import Creates
from app.sandboxes.fleet import Fleet
from app.sandboxes.listing import GONE
from app.sandboxes.nodes import NodeClient
from app.sandboxes.place import Placed, SandboxPlace
from app.sandboxes.records import Records, fields
from app.sandboxes.snapshots import Snapshots
from app.sandboxes.sync import Sync
from app.sandboxes.teardown import Teardowns
from app.schemas.sandboxes import DEFAULT_TTL_S, CreateSandbox
from wire.sandboxes import ExecEvent, ExecRequest

log = logging.getLogger(__name__)


class Sandboxes:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        catalogue: Catalogue,
        node_token: str | None,
        images: ControlImages,
        rows: Transactions,
        admission: SandboxAdmission,
        meter_every_s: float = 60.0,
    ) -> None:
        self.admission = admission
        self.records = Records(sessions=sessions, rows=rows, meter_every_s=meter_every_s)
        self.fleet = Fleet(catalogue=catalogue, node_token=node_token)
        self.teardowns = Teardowns(records=self.records, fleet=self.fleet)
        #: the images tenants built (``app.images.owned``): a create may name one
        self.owned = OwnedImages(sessions)
        self.snapshots = Snapshots(records=self.records, fleet=self.fleet, owned=self.owned)
        self.creates = Creates(
            records=self.records,
            fleet=self.fleet,
            images=images,
            owned=self.owned,
            admission=admission,
            snapshots=self.snapshots,
            teardowns=self.teardowns,
        )
        self.reconciler = Sync(records=self.records, fleet=self.fleet, teardowns=self.teardowns)

    async def close(self) -> None:
        await self.teardowns.close()
        await self.fleet.close()

    async def drain(self) -> None:
        """Wait (bounded) for the teardowns still running off the callers' paths."""
        await self.teardowns.drain()

    # --- records ----------------------------------------------------------------------
    async def get(self, tenant_id: str, sandbox_id: str) -> Sandbox:
        return await self.records.get(tenant_id, sandbox_id)

    async def place(self, tenant_id: str, sandbox_id: str) -> SandboxPlace:
        """Where the tenant's sandbox lives and its state (``app.sandboxes.place``)."""
        place = await self.place_of(sandbox_id)
        if place is None or place.tenant_id != tenant_id:
            raise NotFound(f"no sandbox {sandbox_id}")
        return place

    async def place_of(self, sandbox_id: str) -> SandboxPlace | None:
        """Where a sandbox lives, whoever's it is (for a credential that names it:
        ``app.api.e2b.auth``); None: no such sandbox."""
        return await self.records.place_of(sandbox_id)

    async def list_sandboxes(
        self,
        tenant_id: str,
        filters: listing.Filters,
        *,
        limit: int,
        after: tuple[datetime, str] | None = None,
    ) -> list[Sandbox]:
        """The tenant's sandboxes that pass ``filters``, newest first
        (``app.sandboxes.listing``)."""
        return await self.records.of_tenant(tenant_id, filters, limit=limit, after=after)

    async def meter(self) -> int:
        """Record the usage of live and just-ended sandboxes (``app.sandboxes.metering``)."""
        return await self.records.meter()

    async def node_of(self, row: Placed) -> NodeClient:
        """The client of the node holding a live sandbox."""
        return await self.fleet.node_of(row)

    async def node_for(self, tenant_id: str, sandbox_id: str) -> NodeClient:
        return await self.fleet.node_of(await self.place(tenant_id, sandbox_id))

    # --- lifecycle --------------------------------------------------------------------
    async def create(self, principal: Principal, body: CreateSandbox) -> Sandbox:
        """Admit, place, make and record a sandbox (``app.sandboxes.create``)."""
        return await self.creates.create(principal, body)

    async def destroy(self, tenant_id: str, sandbox_id: str) -> Sandbox:
        """Acknowledged at once, ``stopping`` (``app.sandboxes.teardown``)."""
        return await self.teardowns.destroy(tenant_id, sandbox_id)

    async def action(
        self, principal: Principal, sandbox_id: str, action: str, body: Any = None
    ) -> Sandbox:
        """``pause`` or ``resume`` (a resume within the daily CPU budget)."""
        row = await self.get(principal.tenant_id, sandbox_id)
        if action == "resume":
            await self.admission.cpu(principal)
        node = await self.node_of(row)
        return await self.records.apply(row, await node.action(sandbox_id, action, body))

    async def set_timeout(self, principal: Principal, sandbox_id: str, ttl_s: float) -> Sandbox:
        """End the sandbox ``ttl_s`` from now, unless that passes its lifetime's end."""
        row = await self.get(principal.tenant_id, sandbox_id)
        ttl_s = lifetime.timeout_ttl(
            row.created_at,
            ttl_s,
            float(principal.quota.max_sandbox_lifetime_seconds),
            datetime.now(UTC),
        )
        node = await self.node_of(row)
        status = await node.action(sandbox_id, "timeout", {"ttl_s": ttl_s})
        log.info("sandbox=%s: ends in %gs", sandbox_id, ttl_s)
        return await self.records.apply(row, status)

    async def refresh(self, tenant_id: str, sandbox_id: str) -> Sandbox:
        """The record, shown with what its node says now (state, expiry, memory, CPU)
        when it is live. Nothing is written: the leader's ``sync`` stores what lasts."""
        row = await self.get(tenant_id, sandbox_id)
        if row.state in GONE:
            return row
        try:
            node = await self.node_of(row)
            status = await node.status(sandbox_id)
        except (NodeUnavailable, NotFound):
            return row
        for name, value in fields(row, status).items():
            setattr(row, name, value)  # a detached copy: shown, never stored
        return row

    async def exec(
        self, principal: Principal, sandbox_id: str, request: ExecRequest
    ) -> AsyncIterator[ExecEvent]:
        """Run a command, within the tenant's daily CPU budget."""
        node = await self.node_of(await self.place(principal.tenant_id, sandbox_id))
        await self.admission.cpu(principal)
        return node.exec(sandbox_id, request)

    # --- snapshots and forks ----------------------------------------------------------
    async def snapshot(self, principal: Principal, sandbox_id: str) -> Snapshot:
        """Copy the sandbox's files (``app.sandboxes.snapshots``)."""
        return await self.snapshots.snapshot(principal, sandbox_id)

    async def get_snapshot(self, tenant_id: str, snapshot_id: str) -> Snapshot:
        return await self.snapshots.get(tenant_id, snapshot_id)

    async def list_snapshots(self, tenant_id: str, *, limit: int) -> list[Snapshot]:
        return await self.snapshots.of_tenant(tenant_id, limit=limit)

    async def delete_snapshot(self, tenant_id: str, snapshot_id: str) -> None:
        await self.snapshots.delete(tenant_id, snapshot_id)

    async def fork(
        self,
        principal: Principal,
        sandbox_id: str,
        *,
        count: int,
        ttl_s: float | None,
        metadata: dict[str, str],
    ) -> tuple[Snapshot, list[Sandbox]]:
        """``count`` new sandboxes from one snapshot of this one's files (an episode
        branched at a step); each is counted against the quota like any create."""
        source = await self.get(principal.tenant_id, sandbox_id)
        spec = dict(source.spec or {})
        lifetime_s = float(principal.quota.max_sandbox_lifetime_seconds)
        # asked for: refused above the limit (before the snapshot); inherited: cut to it
        inherited = min(float(spec.get("ttl_s", DEFAULT_TTL_S)), lifetime_s)
        ttl_s = inherited if ttl_s is None else lifetime.create_ttl(ttl_s, lifetime_s)
        ask = Ask.of(spec)
        await self.precheck(principal, ask)
        # env values are not recorded; a tenant's image's are its own, so kept
        owned = await self.owned.find(principal.tenant_id, source.image)
        snapshot = await self.snapshot(principal, sandbox_id)
        body = CreateSandbox(
            backend=source.backend,
            image=source.image,
            cpu=ask.cpu,
            memory_mb=ask.memory_mb,
            disk_mb=ask.disk_mb,
            ttl_s=ttl_s,
            idle_timeout_s=spec.get("idle_timeout_s"),
            user=str(spec.get("user", "user")),
            workdir=spec.get("workdir"),
            env=dict(owned.env) if owned is not None else {},
            metadata={**(source.meta or {}), **metadata, "forked_from": sandbox_id},
            snapshot_id=snapshot.id,
        )
        made = await asyncio.gather(
            *(self.create(principal, body) for _ in range(count)), return_exceptions=True
        )
        sandboxes = [m for m in made if isinstance(m, Sandbox)]
        failed = [m for m in made if isinstance(m, BaseException)]
        if failed and not sandboxes:
            raise failed[0]
        return snapshot, sandboxes

    async def precheck(self, principal: Principal, ask: Ask) -> None:
        """Refuse a sandbox that could not be made, before any work for it (a fork's
        snapshot, a build's checks): too large for the quota, no CPU left today, no room
        for one more (each create is judged again, race-free, by ``create``)."""
        too_large = size_refusal(principal.quota, ask)
        if too_large is not None:
            raise too_large
        await self.admission.cpu(principal)
        held = await self.records.held(principal.tenant_id)
        refusal = totals_refusal(principal.quota, held, ask)
        if refusal is not None:
            raise refusal

    # --- reconciliation ---------------------------------------------------------------
    async def sync(self) -> None:
        """The leader's ``sandboxes`` job: records and nodes agree, usage metered
        (``app.sandboxes.sync``)."""
        await self.reconciler.run()
