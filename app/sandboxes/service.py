"""Sandboxes as the control plane sees them: records, quotas, placement, routing.

A create is admitted against the tenant's ``max_concurrent_sandboxes`` (the row is
written first and counted after, so two creates racing for the last place cannot both
win) and its ``max_sandbox_lifetime_seconds`` (``app.sandboxes.lifetime``, which judges
timeouts too), placed on a node that offers the backend (best of two by live sandboxes
and free memory), and created there, the node sent the image's digest when the control
plane's store knows its name (the node fetches a digest it lacks; ``app.images``) and
the name as given otherwise; the row then keeps the name, and holds the node, the image
digest and the phase timings. Every later operation is routed to that node. ``sync`` (run by the
reconciler's loop) makes records and nodes agree: a record whose node no longer has the
sandbox is stopped with the node's reason (expired, idle) or "lost"; a sandbox a node
holds with no live record is destroyed. Then it records the usage of live sandboxes,
and a sandbox recorded stopped has its last interval recorded at once
(``app.sandboxes.metering``).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.auth.principal import Principal
from app.db.models import Sandbox, Snapshot
from app.db.transactions import RowReader
from app.errors import (
    ConcurrencyLimited,
    CorralError,
    LifetimeTooLong,
    NoCapacity,
    NodeUnavailable,
    NotFound,
)
from app.images.catalog import ControlImages
from app.placement.catalogue import Catalogue
from app.sandboxes import lifetime, listing, metering
from app.sandboxes.listing import LIVE
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


def _at(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


class Sandboxes:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        catalogue: Catalogue,
        node_token: str | None,
        images: ControlImages,
        rows: RowReader,
        meter_every_s: float = 60.0,
    ) -> None:
        self._sessions = sessions
        self._rows = rows
        self._images = images
        self._meter_every_s = meter_every_s
        self._catalogue = catalogue
        self._token = node_token
        self._clients: dict[tuple[str, str], NodeClient] = {}
        self._absent_since: dict[str, datetime] = {}

    async def close(self) -> None:
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
        values = await self._rows.read(PLACE, sandbox_id)
        if values is None:
            raise NotFound(f"no sandbox {sandbox_id}")
        place = SandboxPlace.of(values)
        if place.tenant_id != tenant_id:
            raise NotFound(f"no sandbox {sandbox_id}")
        return place

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

    async def _update(self, sandbox_id: str, **fields: Any) -> Sandbox:
        async with self._sessions() as session, session.begin():
            row = await session.get(Sandbox, sandbox_id)
            if row is None:
                raise NotFound(f"no sandbox {sandbox_id}")
            for name, value in fields.items():
                setattr(row, name, value)
        if row.state == SandboxState.STOPPED.value:
            await self._meter_final(row)
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
        """Store what a node says of the sandbox."""
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
        return await self._update(row.id, **fields)

    # --- create -----------------------------------------------------------------------
    async def create(self, principal: Principal, body: CreateSandbox) -> Sandbox:
        tenant_id = principal.tenant_id
        received = datetime.now(UTC)
        lifetime_s = float(principal.quota.max_sandbox_lifetime_seconds)
        asked = body.ttl_s if "ttl_s" in body.model_fields_set else None
        body = body.model_copy(update={"ttl_s": lifetime.create_ttl(asked, lifetime_s)})
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
        )
        limit = principal.quota.max_concurrent_sandboxes
        async with self._sessions() as session, session.begin():
            session.add(row)
        async with self._sessions() as session:
            live = await session.scalar(
                select(func.count())
                .select_from(Sandbox)
                .where(Sandbox.tenant_id == tenant_id)
                .where(Sandbox.state.in_([s.value for s in LIVE]))
            )
        if (live or 0) > limit:
            await self._update(
                row.id,
                state=SandboxState.STOPPED.value,
                reason="refused: quota",
                ended_at=datetime.now(UTC),
            )
            raise ConcurrencyLimited(
                f"the tenant holds {limit} live sandboxes, its max_concurrent_sandboxes"
            )
        try:
            if body.snapshot_id is not None:
                node = await self._node_by_id(snapshot.node_id)
                image = body.image  # unused: the node starts from the snapshot's digest
            else:
                node = await self._place(body.backend)
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
            await self._update(row.id, node_id=node.node_id)
            status = await node.create(spec)
        except BaseException as exc:
            reason = exc.message if isinstance(exc, CorralError) else type(exc).__name__
            await self._update(
                row.id,
                state=SandboxState.STOPPED.value,
                reason=f"failed: {reason}",
                ended_at=datetime.now(UTC),
            )
            raise
        log.info("sandbox=%s tenant=%s: running on %s", row.id, tenant_id, node.node_id)
        return await self._update(
            row.id,
            state=status.state.value,
            image_digest=status.image_digest,
            started_at=datetime.now(UTC),
            expires_at=_at(status.expires_at),
            queue_ms=(placed - received).total_seconds() * 1000,
            image_ms=status.phases.image_ms,
            setup_ms=status.phases.setup_ms,
            start_ms=status.phases.start_ms,
        )

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

    async def _place(self, backend: str) -> NodeClient:
        nodes = [
            n
            for n in await self._catalogue.nodes()
            if backend in n.sandbox_backends and n.address is not None
        ]
        if not nodes:
            raise NoCapacity(f"no node offers {backend} sandboxes now")
        with_room = [n for n in nodes if n.sandbox_room > 0]
        if not with_room:
            raise NoCapacity(f"every node offering {backend} sandboxes is full")
        nodes = with_room
        choices = random.sample(nodes, min(2, len(nodes)))
        best = min(choices, key=lambda n: (n.sandboxes, -n.memory_free_mb))
        return self._client(best)

    async def _node_by_id(self, node_id: str) -> NodeClient:
        for report in await self._catalogue.nodes():
            if report.node_id == node_id and report.address is not None:
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
        if row.state == SandboxState.STOPPED.value:
            from app.errors import SandboxNotRunning

            raise SandboxNotRunning(f"sandbox {row.id} has stopped ({row.reason})")
        for report in await self._catalogue.nodes():
            if report.node_id == row.node_id and report.address is not None:
                return self._client(report)
        raise NodeUnavailable(f"the node of sandbox {row.id} is not reachable now")

    # --- operations -------------------------------------------------------------------
    async def destroy(self, tenant_id: str, sandbox_id: str) -> Sandbox:
        row = await self.get(tenant_id, sandbox_id)
        if row.state == SandboxState.STOPPED.value:
            return row
        try:
            node = await self.node_of(row)
            status = await node.destroy(sandbox_id)
        except NotFound:
            return await self._update(
                row.id, state="stopped", reason="lost", ended_at=datetime.now(UTC)
            )
        return await self._apply(row, status)

    async def action(
        self, tenant_id: str, sandbox_id: str, action: str, body: Any = None
    ) -> Sandbox:
        row = await self.get(tenant_id, sandbox_id)
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
        """The record, with the node's live readings (memory, CPU) when it is live."""
        row = await self.get(tenant_id, sandbox_id)
        if row.state == SandboxState.STOPPED.value:
            return row
        try:
            node = await self.node_of(row)
            return await self._apply(row, await node.status(sandbox_id))
        except (NodeUnavailable, NotFound):
            return row

    async def exec(
        self, tenant_id: str, sandbox_id: str, request: ExecRequest
    ) -> AsyncIterator[ExecEvent]:
        node = await self.node_of(await self.place(tenant_id, sandbox_id))
        return node.exec(sandbox_id, request)

    async def node_for(self, tenant_id: str, sandbox_id: str) -> NodeClient:
        return await self.node_of(await self.place(tenant_id, sandbox_id))

    # --- snapshots and forks --------------------------------------------------------------
    async def snapshot(self, tenant_id: str, sandbox_id: str) -> Snapshot:
        row = await self.get(tenant_id, sandbox_id)
        node = await self.node_of(row)
        info = await node.snapshot(sandbox_id, new_id("snap"))
        snapshot = Snapshot(
            id=info.snapshot_id,
            tenant_id=tenant_id,
            sandbox_id=sandbox_id,
            node_id=node.node_id,
            backend=row.backend,
            image=row.image,
            image_digest=info.image_digest,
            size_bytes=info.size_bytes,
            created_at=datetime.now(UTC),
        )
        async with self._sessions() as session, session.begin():
            session.add(snapshot)
        log.info("sandbox=%s: snapshot %s (%d bytes)", sandbox_id, snapshot.id, info.size_bytes)
        return snapshot

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
        snapshot = await self.snapshot(principal.tenant_id, sandbox_id)
        body = CreateSandbox(
            backend=source.backend,
            image=source.image,
            cpu=float(spec.get("cpu", 1.0)),
            memory_mb=int(spec.get("memory_mb", 512)),
            disk_mb=int(spec.get("disk_mb", 1024)),
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

    # --- reconciliation ---------------------------------------------------------------
    async def sync(self) -> None:
        """Make the records of live sandboxes and the nodes' inventories agree, then meter
        their usage."""
        reports = {n.node_id: n for n in await self._catalogue.nodes() if n.address}
        async with self._sessions() as session:
            rows = list(
                (
                    await session.scalars(
                        select(Sandbox).where(Sandbox.state.in_([s.value for s in LIVE]))
                    )
                ).all()
            )
        by_node: dict[str | None, list[Sandbox]] = {}
        for row in rows:
            by_node.setdefault(row.node_id, []).append(row)
        now = datetime.now(UTC)
        for node_id, report in reports.items():
            if not report.sandbox_backends:
                continue
            try:
                inventory = await self._client(report).inventory()
            except CorralError as exc:
                log.warning("node %s: no sandbox inventory (%s)", node_id, exc.message)
                continue
            held = {s.sandbox_id: s for s in inventory.sandboxes}
            live_ids = {row.id for row in by_node.get(node_id, [])}
            for row in by_node.get(node_id, []):
                status = held.get(row.id)
                if status is not None:
                    if status.state.value != row.state:
                        await self._apply(row, status)
                elif (
                    row.state != SandboxState.CREATING.value or now - row.created_at > CREATE_GRACE
                ):
                    await self._update(row.id, state="stopped", reason="lost", ended_at=now)
            for sandbox_id, status in held.items():
                if sandbox_id not in live_ids and status.state is not SandboxState.STOPPED:
                    known = await self._is_recorded_live(sandbox_id)
                    if not known:
                        log.warning(
                            "sandbox=%s on %s has no live record: destroying", sandbox_id, node_id
                        )
                        try:
                            await self._client(report).destroy(sandbox_id)
                        except CorralError as exc:
                            log.warning("sandbox=%s: %s", sandbox_id, exc.message)
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
                    log.warning("sandbox=%s: its node %s is gone; lost", row.id, holder)
                    await self._update(row.id, state="stopped", reason="lost", ended_at=now)
        await self.meter()

    async def _is_recorded_live(self, sandbox_id: str) -> bool:
        async with self._sessions() as session:
            row = await session.get(Sandbox, sandbox_id)
        return row is not None and row.state in {s.value for s in LIVE}
