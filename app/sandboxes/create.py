"""A sandbox's create: one read and one commit on the gateway.

Admitted against the tenant's sandbox quotas (``app.sandboxes.admission``): the size of
one sandbox and the daily CPU budget, then what its live sandboxes hold together
(``max_concurrent_sandboxes``, memory, CPU, disk), the tenant's ``sandbox_totals`` read
once, with this gateway's creates in flight added, before any node is asked. Then its
``max_sandbox_lifetime_seconds`` (``app.sandboxes.lifetime``); it is placed on a node
that offers the backend and has room for it (``app.sandboxes.fleet``) and made there,
the node sent the image's digest when the control plane's store knows its name (the node
fetches a digest it lacks; ``app.images``); a name it lacks may be one of the tenant's own
images (``app.images.owned``: one more read), made from its snapshot with its environment
and user; any other name is sent as given, for the node's store. Then one
commit records it (``app.db.sandboxes.admit``): the totals taken by a conditional
update, which two gateways racing for the last room cannot both pass, and the row
inserted, already running, holding the node, the image digest and the phase timings.
Whatever fails after the node made the sandbox (refused at that commit, cancelled)
discards it; a gateway that dies in between leaves it to ``sync``, which destroys a
sandbox that still has no row once it is ``ORPHAN_GRACE`` old.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from app.auth.principal import Principal
from app.db.models import Sandbox, Snapshot, TenantImage
from app.errors import ConcurrencyLimited, LifetimeTooLong
from app.images.catalog import ControlImages
from app.images.owned import OwnedImages
from app.quotas.spec import QuotaLimits
from app.sandboxes import lifetime
from app.sandboxes.admission import (
    SANDBOX_RETRY_AFTER_S,
    Ask,
    SandboxAdmission,
    size_refusal,
    totals_refusal,
)
from app.sandboxes.fleet import Fleet
from app.sandboxes.records import Records, at
from app.sandboxes.snapshots import Snapshots
from app.sandboxes.teardown import Teardowns
from app.schemas.sandboxes import CreateSandbox
from wire.ids import new_id
from wire.sandboxes import SandboxSpec, SandboxState

log = logging.getLogger(__name__)


class Creates:
    def __init__(
        self,
        *,
        records: Records,
        fleet: Fleet,
        images: ControlImages,
        owned: OwnedImages,
        admission: SandboxAdmission,
        snapshots: Snapshots,
        teardowns: Teardowns,
    ) -> None:
        self._records = records
        self._fleet = fleet
        self._images = images
        self._owned = owned
        self._admission = admission
        self._snapshots = snapshots
        self._teardowns = teardowns
        #: creates of each tenant this gateway has asked a node for and not yet recorded
        self._in_flight: dict[str, list[Ask]] = {}

    async def create(self, principal: Principal, body: CreateSandbox) -> Sandbox:
        tenant_id = principal.tenant_id
        received = datetime.now(UTC)
        ask = Ask(cpu=body.cpu, memory_mb=body.memory_mb, disk_mb=body.disk_mb)
        too_large = size_refusal(principal.quota, ask)
        if too_large is not None:
            raise too_large
        await self._admission.cpu(principal)
        lifetime_s = float(principal.quota.max_sandbox_lifetime_seconds)
        asked = body.ttl_s if "ttl_s" in body.model_fields_set else None
        body = body.model_copy(update={"ttl_s": lifetime.create_ttl(asked, lifetime_s)})
        snapshot, owned, image_ref = None, None, body.image
        if body.snapshot_id is None:
            digest = await self._images.digest_of(body.image)
            if digest is not None:
                image_ref = digest  # the node fetches a digest it lacks
            else:  # one of the tenant's own images, or a name for the node's store
                owned = await self._owned.find(tenant_id, body.image)
                if owned is not None:
                    body = from_owned(body, owned)
        if body.snapshot_id is not None:
            snapshot = await self._snapshots.get(tenant_id, body.snapshot_id)
            # a tenant's image keeps its name in the record; a snapshot's create, its image's
            image = body.image if owned is not None else snapshot.image
            body = body.model_copy(update={"backend": snapshot.backend, "image": image})
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
        held = await self._records.held(tenant_id)  # the create's one read
        in_flight = self._in_flight.setdefault(tenant_id, [])
        refusal = totals_refusal(principal.quota, held.plus(in_flight), ask)
        if refusal is not None:
            raise refusal  # before any node is asked
        in_flight.append(ask)  # (no await since the check: this gateway's burst is judged)
        try:
            return await self._make(principal, body, row, ask, lifetime_s, snapshot, image_ref)
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
        lifetime_s: float,
        snapshot: Snapshot | None,
        image_ref: str,
    ) -> Sandbox:
        """Place the sandbox, have its node make it, then record it in one commit."""
        if snapshot is not None:  # placed where its snapshot is
            node = await self._fleet.node_by_id(snapshot.node_id, ask)
            image = body.image  # unused: the node starts from the snapshot's digest
        else:
            node = await self._fleet.place(body.backend, ask)
            image = image_ref
        spec = SandboxSpec(
            sandbox_id=row.id,
            tenant_id=row.tenant_id,
            backend=body.backend,
            image=image,
            cpu=body.cpu,
            memory_mb=body.memory_mb,
            disk_mb=body.disk_mb,
            ttl_s=_first_ttl(row, body.ttl_s, lifetime_s),
            idle_timeout_s=body.idle_timeout_s,
            env=body.env,
            network=body.network,
            user=body.user,
            workdir=body.workdir,
            snapshot_id=body.snapshot_id,
        )
        placed = datetime.now(UTC)
        try:
            status = await node.create(spec)
            row.node_id = node.node_id
            row.state = status.state.value
            row.image_digest = status.image_digest
            row.accelerator = status.accelerator
            row.started_at = datetime.now(UTC)
            row.expires_at = at(status.expires_at)
            row.queue_ms = (placed - row.created_at).total_seconds() * 1000
            row.image_ms = status.phases.image_ms
            row.setup_ms = status.phases.setup_ms
            row.start_ms = status.phases.start_ms
            await self.record(row, principal.quota, ask)
        except BaseException:
            # whatever the node made goes (a refusal made nothing: the node answers 404)
            self._teardowns.discard(node, row.id)
            raise
        log.info("sandbox=%s tenant=%s: running on %s", row.id, row.tenant_id, node.node_id)
        return row

    async def record(self, row: Sandbox, quota: QuotaLimits, ask: Ask) -> None:
        """The create's one commit: the sandbox counted in the tenant's totals and its
        row written, unless the totals (moved by another gateway since they were read)
        no longer hold it."""
        if not await self._records.admit(row, quota):
            refusal = totals_refusal(quota, await self._records.held(row.tenant_id), ask)
            raise refusal or ConcurrencyLimited(
                "the tenant's live sandboxes reached its quota while this one was made",
                retry_after=SANDBOX_RETRY_AFTER_S,
            )


def from_owned(body: CreateSandbox, owned: TenantImage) -> CreateSandbox:
    """A create of the tenant's image ``owned``: from its snapshot, with its environment
    under the create's own, and its user and workdir unless the create names them."""
    update: dict[str, object] = {
        "snapshot_id": owned.snapshot_id,
        "env": {**owned.env, **body.env},
    }
    if "user" not in body.model_fields_set:
        update["user"] = owned.user
    if body.workdir is None:
        update["workdir"] = owned.workdir
    return body.model_copy(update=update)


def _first_ttl(row: Sandbox, ttl_s: float, lifetime_s: float) -> float:
    """The TTL the node is asked for: what was granted, less the time the create has
    taken so far if the lifetime would end sooner."""
    left = lifetime.left_s(row.created_at, lifetime_s, datetime.now(UTC))
    if left <= 0:
        raise LifetimeTooLong(f"sandbox {row.id} reached its lifetime before it started")
    return min(ttl_s, left)
