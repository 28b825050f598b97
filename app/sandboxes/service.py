"""Sandboxes as the control plane sees them: records, quotas, placement, routing.

A create is admitted against the tenant's sandbox quotas (``app.sandboxes.admission``):
the size of one sandbox, the daily CPU budget, and what its live sandboxes hold together
(``max_concurrent_sandboxes``, memory, CPU, disk). That last judgement is made in the
transaction that writes the row, the tenant's creates taking turns in it (``_admit``: a
lock on the tenant's row on PostgreSQL, SQLite's one writer), so two creates racing for
the last room cannot both win, and a burst is refused only past what the quota holds.
Then its ``max_sandbox_lifetime_seconds`` (``app.sandboxes.lifetime``, which judges
timeouts too); it is placed on a node that offers the backend and has room for its
memory and CPU (``app.placement.sandboxes``: best of two by live sandboxes and free
memory), and created there, the node sent the image's digest when the control
plane's store knows its name (the node fetches a digest it lacks; ``app.images``) and
the name as given otherwise; the row then keeps the name, and holds the node, the image
digest and the phase timings. Every later operation is routed to that node. ``sync`` (run by the
reconciler's loop) makes records and nodes agree: a record whose node no longer has the
sandbox is stopped with the node's reason (expired, idle) or "lost"; a sandbox a node
holds with no live record is destroyed. Then it records the usage of live sandboxes,
and a sandbox recorded stopped has its last interval recorded at once
(``app.sandboxes.metering``); the CPU a node read of a live sandbox reaches its record
at each ``sync``, so the daily CPU quota sees it. A snapshot is admitted the same way as
a create (``_reserve_snapshot``): its row, sized as the sandbox's disk use now, is
written before the node copies anything, in a transaction that counts it against
``max_snapshots`` and ``max_storage_mb``; the copy's real size replaces the estimate.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.auth.principal import Principal
from app.db import sandboxes as sandbox_rows
from app.db.models import Sandbox, Snapshot, Tenant
from app.db.transactions import RowReader
from app.errors import (
    ConcurrencyLimited,
    CorralError,
    LifetimeTooLong,
    NodeUnavailable,
    NotFound,
    SandboxNotRunning,
)
from app.images.catalog import ControlImages
from app.placement import sandboxes as placement
from app.placement.catalogue import Catalogue
from app.quotas import readings
from app.quotas.spec import QuotaLimits
from app.sandboxes import lifetime, listing, metering
from app.sandboxes.admission import (
    SANDBOX_RETRY_AFTER_S,
    Ask,
    Held,
    SandboxAdmission,
    size_refusal,
    snapshot_refusal,
    totals_refusal,
)
from app.sandboxes.listing import GONE, LIVE
from app.sandboxes.nodes import NodeClient
from app.sandboxes.place import PLACE, Placed, SandboxPlace
from app.schemas.sandboxes import DEFAULT_TTL_S, CreateSandbox
from wire.ids import new_id
from wire.messages import NodeReport
from wire.sandboxes import ExecEvent, ExecRequest, SandboxSpec, SandboxState, SandboxStatus

log = logging.getLogger(__name__)

#: a record still ``creating`` after this long lost its create (gateway died meanwhile)
CREATE_GRACE = timedelta(minutes=10)
#: a node missing from the catalogue this long has lost its sandboxes (a node only
#: briefly thought dead keeps them: its sandboxes are records' truth, not its heartbeat)
LOST_AFTER = timedelta(minutes=2)
#: a sandbox a node made this long ago with no row lost the gateway that made it (the row
#: is written right after the node answers; this covers clocks that differ)
ORPHAN_GRACE = timedelta(minutes=2)
#: a destroyed sandbox still held by its node this long after its destroy was
#: acknowledged is torn down by ``sync`` (the gateway that acknowledged it died)
STOP_GRACE = timedelta(seconds=30)
#: how long closing waits for teardowns still running
DRAIN_S = 10.0


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def _fields(row: Sandbox, status: SandboxStatus) -> dict[str, Any]:
    """What a node's status of the sandbox changes in its row."""
    fields: dict[str, Any] = {
        "state": status.state.value,
        "expires_at": _at(status.expires_at),
        "image_digest": status.image_digest,
    }
    if status.cpu_ms is not None:
        fields["cpu_ms"] = status.cpu_ms
    if status.memory_bytes is not None:
        fields["memory_bytes"] = status.memory_bytes
    if status.state is SandboxState.STOPPED:
        fields["ended_at"] = row.ended_at or datetime.now(UTC)
        fields["reason"] = status.reason
    return fields


def _stopped(row: Sandbox) -> dict[str, Any]:
    """A destroyed (``stopping``) row's last move: stopped, its end and reason as its
    destroy's acknowledgment recorded them."""
    return {
        "state": SandboxState.STOPPED.value,
        "reason": row.reason or "destroyed",
        "ended_at": row.ended_at or datetime.now(UTC),
    }


class Sandboxes:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        catalogue: Catalogue,
        node_token: str | None,
        images: ControlImages,
        rows: RowReader,
        admission: SandboxAdmission,
        meter_every_s: float = 60.0,
    ) -> None:
        self._sessions = sessions
        self.admission = admission
        self._rows = rows
        self._images = images
        self._meter_every_s = meter_every_s
        self._catalogue = catalogue
        self._token = node_token
        self._clients: dict[tuple[str, str], NodeClient] = {}
        self._absent_since: dict[str, datetime] = {}
        #: creates of each tenant this gateway has asked a node for and not yet recorded
        self._in_flight: dict[str, list[Ask]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        await self.drain()
        for task in list(self._tasks):
            task.cancel()
        for client in self._clients.values():
            await client.close()
        self._clients.clear()

    # --- records ----------------------------------------------------------------------
    async def get(self, tenant_id: str, sandbox_id: str) -> Sandbox:
        row = await self._rows.get(Sandbox, sandbox_id)
        if row is None or row.tenant_id != tenant_id:
            raise NotFound(f"no sandbox {sandbox_id}")
        return row

    async def place(self, tenant_id: str, sandbox_id: str) -> SandboxPlace:
        """Where the tenant's sandbox lives and its state (``app.sandboxes.place``)."""
        place = await self.place_of(sandbox_id)
        if place is None or place.tenant_id != tenant_id:
            raise NotFound(f"no sandbox {sandbox_id}")
        return place

    async def place_of(self, sandbox_id: str) -> SandboxPlace | None:
        """Where a sandbox lives, whoever's it is (for a credential that names it:
        ``app.e2b.auth``); None: no such sandbox."""
        values = await self._rows.read(PLACE, sandbox_id)
        return None if values is None else SandboxPlace.of(values)

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
        async with self._sessions() as session:
            dialect = session.get_bind().dialect.name
            query = listing.query(tenant_id, filters, dialect=dialect, limit=limit, after=after)
            return list((await session.scalars(query)).all())

    async def _move(self, row: Sandbox, **values: Any) -> Sandbox | None:
        """Store ``values`` over ``row`` as it was read (compare-and-set:
        ``app.db.sandboxes``): the row as now stored, or None if another writer moved it
        first (nothing is written then). A row moved to stopped has its last usage
        recorded."""
        async with self._sessions.begin() as session:
            moved = await sandbox_rows.transition(session, row, **values)
        if not moved:
            return None
        for name, value in values.items():
            setattr(row, name, value)
        row.version += 1
        if row.state == SandboxState.STOPPED.value:
            await self._meter_final(row)
        return row

    async def _current(self, sandbox_id: str) -> Sandbox:
        """The row as stored now (after a writer found it moved)."""
        row = await self._rows.get(Sandbox, sandbox_id)
        if row is None:
            raise NotFound(f"no sandbox {sandbox_id}")
        return row

    async def _meter_final(self, row: Sandbox) -> None:
        """The usage of a sandbox just recorded stopped, up to its end (if this fails, the
        leader's next metering pass records it)."""
        try:
            await metering.meter(
                self._sessions, now=datetime.now(UTC), every_s=0.0, sandbox_id=row.id
            )
        except Exception as exc:
            log.warning("sandbox=%s: its last usage is not recorded yet (%r)", row.id, exc)

    async def meter(self) -> int:
        """Record the usage of live and just-ended sandboxes (``app.sandboxes.metering``)."""
        return await metering.meter(
            self._sessions, now=datetime.now(UTC), every_s=self._meter_every_s
        )

    async def _apply(self, row: Sandbox, status: SandboxStatus) -> Sandbox:
        """Store what a node says of the sandbox over the row as read; if another writer
        moved the row meanwhile, the row as it now is (the next ``sync`` brings it to
        the node's word if they still differ)."""
        stored = await self._move(row, **_fields(row, status))
        return stored if stored is not None else await self._current(row.id)

    # --- create -----------------------------------------------------------------------
    async def create(self, principal: Principal, body: CreateSandbox) -> Sandbox:
        tenant_id = principal.tenant_id
        received = datetime.now(UTC)
        ask = Ask(cpu=body.cpu, memory_mb=body.memory_mb, disk_mb=body.disk_mb)
        too_large = size_refusal(principal.quota, ask)
        if too_large is not None:
            raise too_large
        await self.admission.cpu(principal)
        lifetime_s = float(principal.quota.max_sandbox_lifetime_seconds)
        asked = body.ttl_s if "ttl_s" in body.model_fields_set else None
        body = body.model_copy(update={"ttl_s": lifetime.create_ttl(asked, lifetime_s)})
        snapshot = None
        if body.snapshot_id is not None:
            snapshot = await self.get_snapshot(tenant_id, body.snapshot_id)
            body = body.model_copy(update={"backend": snapshot.backend, "image": snapshot.image})
        row = Sandbox(
            id=new_id("sbx"),
            tenant_id=tenant_id,
            backend=body.backend,
            image=body.image,
            state=SandboxState.CREATING.value,
            spec=body.model_dump(mode="json", exclude={"env", "metadata"})
            | {"env_keys": sorted(body.env)},
            meta=dict(body.metadata),
            created_at=received,
            version=0,
        )
        held = await self._held(tenant_id)  # the create's one read
        in_flight = self._in_flight.setdefault(tenant_id, [])
        refusal = totals_refusal(principal.quota, held.plus(in_flight), ask)
        if refusal is not None:
            raise refusal  # before any node is asked
        in_flight.append(ask)  # (no await since the check: this gateway's burst is judged)
        try:
            return await self._make(principal, body, row, ask, received, lifetime_s, snapshot)
        finally:
            in_flight.remove(ask)
            if not in_flight:
                del self._in_flight[tenant_id]

    async def _make(
        self,
        principal: Principal,
        body: CreateSandbox,
        row: Sandbox,
        ask: Ask,
        received: datetime,
        lifetime_s: float,
        snapshot: Snapshot | None,
    ) -> Sandbox:
        """Place the sandbox, have its node make it, then record it in one commit."""
        tenant_id = principal.tenant_id
        if snapshot is not None:
            node = await self._node_by_id(snapshot.node_id, ask)
            image = body.image  # unused: the node starts from the snapshot's digest
        else:
            reports = await self._catalogue.nodes()
            placement.refuse_too_large(reports, body.backend, memory_mb=ask.memory_mb, cpu=ask.cpu)
            node = await self._place(body.backend, ask)
            image = await self._image_ref(body.image)
        spec = SandboxSpec(
            sandbox_id=row.id,
            tenant_id=tenant_id,
            backend=body.backend,
            image=image,
            cpu=body.cpu,
            memory_mb=body.memory_mb,
            disk_mb=body.disk_mb,
            ttl_s=self._first_ttl(row, body.ttl_s, lifetime_s),
            idle_timeout_s=body.idle_timeout_s,
            env=body.env,
            network=body.network,
            user=body.user,
            snapshot_id=body.snapshot_id,
        )
        placed = datetime.now(UTC)
        try:
            status = await node.create(spec)
            row.node_id = node.node_id
            row.state = status.state.value
            row.image_digest = status.image_digest
            row.started_at = datetime.now(UTC)
            row.expires_at = _at(status.expires_at)
            row.queue_ms = (placed - received).total_seconds() * 1000
            row.image_ms = status.phases.image_ms
            row.setup_ms = status.phases.setup_ms
            row.start_ms = status.phases.start_ms
            await self._record(row, principal.quota, ask)
        except BaseException:
            # whatever the node made goes (a refusal made nothing: the node answers 404)
            self._spawn(self._destroy_on(node, row.id), f"discard-{row.id}")
            raise
        log.info("sandbox=%s tenant=%s: running on %s", row.id, tenant_id, node.node_id)
        return row

    async def _held(self, tenant_id: str) -> Held:
        async with self._sessions() as session:
            return await sandbox_rows.held(session, tenant_id)

    async def _record(self, row: Sandbox, quota: QuotaLimits, ask: Ask) -> None:
        """The create's one commit: the sandbox counted in the tenant's totals and its
        row written, unless the totals (moved by another gateway since they were read)
        no longer hold it."""
        async with self._sessions.begin() as session:
            admitted = await sandbox_rows.admit(session, row, quota)
        if not admitted:
            refusal = totals_refusal(quota, await self._held(row.tenant_id), ask)
            raise refusal or ConcurrencyLimited(
                "the tenant's live sandboxes reached its quota while this one was made",
                retry_after=SANDBOX_RETRY_AFTER_S,
            )

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``work`` off the caller's path; ``drain`` waits for what is left."""
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self, timeout_s: float = DRAIN_S) -> None:
        """Wait (bounded) for the teardowns and discards still running: at shutdown,
        while the nodes are still there (what is left, ``sync`` finishes)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)

    async def _destroy_on(self, node: NodeClient, sandbox_id: str) -> None:
        """Destroy a sandbox a node holds without a live record (else ``sync`` will)."""
        try:
            await node.destroy(sandbox_id)
        except NotFound:
            pass  # never made, or gone already
        except CorralError as exc:
            log.warning("sandbox=%s: not destroyed on %s yet (%s)", sandbox_id, node.node_id, exc)

    @staticmethod
    def _first_ttl(row: Sandbox, ttl_s: float, lifetime_s: float) -> float:
        """The TTL the node is asked for: what was granted, less the time the create has
        taken so far if the lifetime would end sooner."""
        left = lifetime.left_s(row.created_at, lifetime_s, datetime.now(UTC))
        if left <= 0:
            raise LifetimeTooLong(f"sandbox {row.id} reached its lifetime before it started")
        return min(ttl_s, left)

    async def _image_ref(self, ref: str) -> str:
        """What the node is sent for the image ``ref``: its digest when the control
        plane's store knows it (the node fetches a digest it lacks), else ``ref`` as
        given, for the node's own store to resolve (an image built on that node)."""
        digest = await self._images.digest_of(ref)
        return digest if digest is not None else ref

    async def _place(self, backend: str, ask: Ask) -> NodeClient:
        """A node with room for the sandbox (``app.placement.sandboxes``)."""
        reports = await self._catalogue.nodes()
        chosen = placement.choose(reports, backend, memory_mb=ask.memory_mb, cpu=ask.cpu)
        return self._client(chosen)

    async def _node_by_id(self, node_id: str, ask: Ask | None = None) -> NodeClient:
        """The client of one node; with ``ask``, refused unless it has room for it."""
        for report in await self._catalogue.nodes():
            if report.node_id == node_id and report.address is not None:
                if ask is not None:
                    placement.check(report, memory_mb=ask.memory_mb, cpu=ask.cpu)
                return self._client(report)
        raise NodeUnavailable(f"node {node_id} is not reachable now")

    def _client(self, report: NodeReport) -> NodeClient:
        if self._token is None:
            raise NodeUnavailable("the gateway has no node token (CORRAL_NODE_TOKEN)")
        assert report.address is not None
        key = (report.node_id, report.address)
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = NodeClient(report.node_id, report.address, self._token)
        return client

    async def node_of(self, row: Placed) -> NodeClient:
        """The client of the node holding a live sandbox."""
        if row.state in GONE:
            raise SandboxNotRunning(f"sandbox {row.id} has stopped ({row.reason})")
        for report in await self._catalogue.nodes():
            if report.node_id == row.node_id and report.address is not None:
                return self._client(report)
        raise NodeUnavailable(f"the node of sandbox {row.id} is not reachable now")

    # --- operations -------------------------------------------------------------------
    async def destroy(self, tenant_id: str, sandbox_id: str) -> Sandbox:
        """Acknowledged at once: the row is marked ``stopping``, ended now (its usage is
        metered up to here) and its room in the tenant's quota freed, in one commit, and
        the answer goes; the node's teardown runs off the caller's path (``_teardown``).
        A gateway that dies before the teardown leaves it to ``sync``."""
        row = await self.get(tenant_id, sandbox_id)
        while row.state not in GONE:
            marked = await self._move(
                row,
                state=SandboxState.STOPPING.value,
                reason="destroyed",
                ended_at=datetime.now(UTC),
            )
            if marked is not None:
                self._spawn(self._teardown(marked), f"teardown-{sandbox_id}")
                return marked
            row = await self._current(sandbox_id)  # another writer moved it: from there
        return row

    async def _teardown(self, row: Sandbox) -> None:
        """Destroy a ``stopping`` sandbox on its node, then record it stopped (its end,
        reason and usage as acknowledged). A node out of reach leaves the row
        ``stopping`` for ``sync``."""
        values: dict[str, Any] = {}
        try:
            if row.node_id is not None:
                node = await self._node_by_id(row.node_id)
                values = _fields(row, await node.destroy(row.id))
        except NotFound:
            pass  # the node no longer had it
        except CorralError as exc:
            log.warning("sandbox=%s: teardown left to sync (%s)", row.id, exc.message)
            return
        await self._move(row, **values | _stopped(row))  # lost to sync's: it recorded it

    async def action(
        self, principal: Principal, sandbox_id: str, action: str, body: Any = None
    ) -> Sandbox:
        """``pause`` or ``resume`` (a resume within the daily CPU budget)."""
        row = await self.get(principal.tenant_id, sandbox_id)
        if action == "resume":
            await self.admission.cpu(principal)
        node = await self.node_of(row)
        return await self._apply(row, await node.action(sandbox_id, action, body))

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
        return await self._apply(row, status)

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
        for name, value in _fields(row, status).items():
            setattr(row, name, value)  # a detached copy: shown, never stored
        return row

    async def exec(
        self, principal: Principal, sandbox_id: str, request: ExecRequest
    ) -> AsyncIterator[ExecEvent]:
        """Run a command, within the tenant's daily CPU budget."""
        node = await self.node_of(await self.place(principal.tenant_id, sandbox_id))
        await self.admission.cpu(principal)
        return node.exec(sandbox_id, request)

    async def node_for(self, tenant_id: str, sandbox_id: str) -> NodeClient:
        return await self.node_of(await self.place(tenant_id, sandbox_id))

    # --- snapshots and forks --------------------------------------------------------------
    async def snapshot(self, principal: Principal, sandbox_id: str) -> Snapshot:
        """Copy the sandbox's files, within the tenant's ``max_snapshots`` and
        ``max_storage_mb`` (judged before anything is copied)."""
        tenant_id = principal.tenant_id
        row = await self.get(tenant_id, sandbox_id)
        node = await self.node_of(row)
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
        await self._reserve_snapshot(snapshot, principal.quota)
        try:
            info = await node.snapshot(sandbox_id, snapshot.id)
        except BaseException:
            await asyncio.shield(self._drop_snapshot_row(snapshot.id))
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

    async def _reserve_snapshot(self, snapshot: Snapshot, quota: QuotaLimits) -> None:
        """Write the row of a snapshot about to be made, sized as its sandbox's disk use
        now, unless the tenant keeps ``max_snapshots`` or it would pass the storage
        quota; the tenant's snapshots take turns here, as creates do in ``_admit``."""
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

    async def _drop_snapshot_row(self, snapshot_id: str) -> None:
        """Forget the row of a snapshot the node did not make."""
        try:
            async with self._sessions() as session, session.begin():
                await session.execute(delete(Snapshot).where(Snapshot.id == snapshot_id))
        except Exception as exc:
            log.warning("snapshot %s: its row is left (%r)", snapshot_id, exc)

    async def get_snapshot(self, tenant_id: str, snapshot_id: str) -> Snapshot:
        async with self._sessions() as session:
            row = await session.get(Snapshot, snapshot_id)
        if row is None or row.tenant_id != tenant_id or row.deleted_at is not None:
            raise NotFound(f"no snapshot {snapshot_id}")
        return row

    async def list_snapshots(self, tenant_id: str, *, limit: int) -> list[Snapshot]:
        query = (
            select(Snapshot)
            .where(Snapshot.tenant_id == tenant_id, Snapshot.deleted_at.is_(None))
            .order_by(Snapshot.created_at.desc())
            .limit(limit)
        )
        async with self._sessions() as session:
            return list((await session.scalars(query)).all())

    async def delete_snapshot(self, tenant_id: str, snapshot_id: str) -> None:
        row = await self.get_snapshot(tenant_id, snapshot_id)
        node = await self._node_by_id(row.node_id)
        await node.delete_snapshot(snapshot_id, tenant_id=tenant_id)
        async with self._sessions() as session, session.begin():
            stored = await session.get(Snapshot, snapshot_id)
            if stored is not None:
                stored.deleted_at = datetime.now(UTC)

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
        await self._precheck_fork(principal, ask)
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

    async def _precheck_fork(self, principal: Principal, ask: Ask) -> None:
        """Refuse a fork none of whose sandboxes could be made, before its snapshot is
        copied: too large for the quota, no CPU left today, no room for one more (each
        create is judged again, race-free, by ``create``)."""
        too_large = size_refusal(principal.quota, ask)
        if too_large is not None:
            raise too_large
        await self.admission.cpu(principal)
        refusal = totals_refusal(principal.quota, await self._held(principal.tenant_id), ask)
        if refusal is not None:
            raise refusal

    # --- reconciliation ---------------------------------------------------------------
    async def sync(self) -> None:
        """Make the records of live and stopping sandboxes and the nodes' inventories
        agree, then meter their usage. Every change is a compare-and-set from the row as
        read here: a row another writer moved meanwhile is left to the next pass."""
        reports = {n.node_id: n for n in await self._catalogue.nodes() if n.address}
        watched = [*(s.value for s in LIVE), SandboxState.STOPPING.value]
        async with self._sessions() as session:
            query = select(Sandbox).where(Sandbox.state.in_(watched))
            rows = list((await session.scalars(query)).all())
        by_node: dict[str | None, list[Sandbox]] = {}
        for row in rows:
            by_node.setdefault(row.node_id, []).append(row)
        now = datetime.now(UTC)
        readings_of: list[sandbox_rows.Reading] = []
        for node_id, report in reports.items():
            if not report.sandbox_backends:
                continue
            client = self._client(report)
            try:
                inventory = await client.inventory()
            except CorralError as exc:
                log.warning("node %s: no sandbox inventory (%s)", node_id, exc.message)
                continue
            held = {s.sandbox_id: s for s in inventory.sandboxes}
            recorded = {row.id for row in by_node.get(node_id, [])}
            for row in by_node.get(node_id, []):
                status = held.get(row.id)
                if row.state == SandboxState.STOPPING.value:
                    await self._finish_stopping(row, status, now)
                elif status is not None:
                    if status.state.value != row.state:
                        await self._move(row, **_fields(row, status))  # lost a race: next pass
                    elif status.cpu_ms is not None and status.cpu_ms != row.cpu_ms:
                        readings_of.append(
                            sandbox_rows.Reading(
                                row.id, row.state, status.cpu_ms, status.memory_bytes
                            )
                        )
                elif (
                    row.state != SandboxState.CREATING.value or now - row.created_at > CREATE_GRACE
                ):
                    await self._move(row, state="stopped", reason="lost", ended_at=now)
            for sandbox_id, status in held.items():
                if sandbox_id not in recorded and await self._orphan(status, now):
                    log.warning(
                        "sandbox=%s on %s has no live record: destroying", sandbox_id, node_id
                    )
                    await self._destroy_on(client, sandbox_id)
        for node_id in list(self._absent_since):
            if node_id in reports:
                del self._absent_since[node_id]
        for holder, node_rows in by_node.items():
            if holder is None or holder in reports:
                continue
            absent = self._absent_since.setdefault(holder, now)
            if now - absent < LOST_AFTER:
                continue
            for row in node_rows:
                if now - row.created_at > CREATE_GRACE or row.state != "creating":
                    if row.state == SandboxState.STOPPING.value:
                        await self._move(row, **_stopped(row))
                        continue
                    log.warning("sandbox=%s: its node %s is gone; lost", row.id, holder)
                    await self._move(row, state="stopped", reason="lost", ended_at=now)
        await self._store_readings(readings_of)
        await self.meter()

    async def _finish_stopping(
        self, row: Sandbox, status: SandboxStatus | None, now: datetime
    ) -> None:
        """A destroyed sandbox whose teardown has not been recorded: stopped, if its node
        no longer holds it; else torn down here once its destroy is ``STOP_GRACE`` old
        (the gateway that acknowledged it died, or could not reach the node)."""
        if status is not None and status.state is not SandboxState.STOPPED:
            if now - (row.ended_at or now) < STOP_GRACE:
                return  # its own teardown is likely on the way
            log.warning("sandbox=%s: its teardown did not end; tearing it down", row.id)
            await self._teardown(row)
            return
        await self._move(row, **_stopped(row))

    async def _orphan(self, status: SandboxStatus, now: datetime) -> bool:
        """Whether a sandbox a node holds, that this pass read no live record of, is to be
        destroyed: it has ended on no record (stopped, or no row) and it is not a create
        whose row is still to come (one commit right after the node answered; a sandbox
        the node made ``ORPHAN_GRACE`` ago that still has no row lost its gateway)."""
        if status.state in (SandboxState.STOPPED, SandboxState.CREATING):
            return False
        async with self._sessions() as session:
            row = await session.get(Sandbox, status.sandbox_id)
        if row is not None:
            return row.state == SandboxState.STOPPED.value
        return now - _at(status.created_at) > ORPHAN_GRACE

    async def _store_readings(self, readings: list[sandbox_rows.Reading]) -> None:
        """The nodes' latest CPU and memory readings of live sandboxes, into their records
        in one transaction (the daily CPU quota reads them: ``app.quotas.readings``)."""
        if readings:
            async with self._sessions.begin() as session:
                await sandbox_rows.store_readings(session, readings)


async def _take_turn(session: AsyncSession, tenant_id: str) -> None:
    """Wait for the tenant's other admissions (of sandboxes, of snapshots) to commit, and
    hold the others back until this transaction ends: a lock on the tenant's row on
    PostgreSQL (one that does not block the rows that refer to it). SQLite has one writer:
    the row written next takes its lock, which serializes the same way."""
    await session.execute(
        select(Tenant.id).where(Tenant.id == tenant_id).with_for_update(key_share=True)
    )
