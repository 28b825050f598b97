"""The leader's ``sandboxes`` job: sandbox records and the nodes' inventories agree.

A live record whose node no longer holds the sandbox is stopped with the node's reason
(expired, idle) or ``lost``; a ``stopping`` record (its destroy acknowledged) is
recorded stopped once its node no longer holds it, and torn down here if it still does
``STOP_GRACE`` after the acknowledgment (that gateway died); a sandbox a node holds
with no live record is destroyed (one with no row at all only once it is
``ORPHAN_GRACE`` old: a create records its row right after its node answers); the
records of a node absent from the catalogue for ``LOST_AFTER`` are stopped as
``lost``. Every change is a compare-and-set from the row as read here, so a row another
writer moved meanwhile is left to the next pass. Then the CPU and memory the nodes read
of live sandboxes reach their records (the daily CPU quota reads them) and their usage
is metered (``app.sandboxes.metering``).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from app.db import sandboxes as sandbox_rows
from app.db.models import Sandbox
from app.errors import CorralError
from app.sandboxes.fleet import Fleet
from app.sandboxes.listing import LIVE
from app.sandboxes.records import Records, at, fields, stopped
from app.sandboxes.teardown import Teardowns
from wire.sandboxes import SandboxState, SandboxStatus

log = logging.getLogger(__name__)

#: a record still ``creating`` after this long lost its create (rows of older releases)
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


class Sync:
    def __init__(self, *, records: Records, fleet: Fleet, teardowns: Teardowns) -> None:
        self._records = records
        self._fleet = fleet
        self._teardowns = teardowns
        self._absent_since: dict[str, datetime] = {}

    async def run(self) -> None:
        """One pass (see the module's docstring)."""
        reports = {n.node_id: n for n in await self._fleet.nodes() if n.address}
        watched = [*(s.value for s in LIVE), SandboxState.STOPPING.value]
        async with self._records.sessions() as session:
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
            client = self._fleet.client(report)
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
                        await self._records.move(row, **fields(row, status))  # lost: next pass
                    elif status.cpu_ms is not None and status.cpu_ms != row.cpu_ms:
                        readings_of.append(
                            sandbox_rows.Reading(
                                row.id, row.state, status.cpu_ms, status.memory_bytes
                            )
                        )
                elif (
                    row.state != SandboxState.CREATING.value or now - row.created_at > CREATE_GRACE
                ):
                    await self._records.move(row, state="stopped", reason="lost", ended_at=now)
            for sandbox_id, status in held.items():
                if sandbox_id not in recorded and await self._orphan(status, now):
                    log.warning(
                        "sandbox=%s on %s has no live record: destroying", sandbox_id, node_id
                    )
                    await self._fleet.discard(client, sandbox_id)
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
                        await self._records.move(row, **stopped(row))
                        continue
                    log.warning("sandbox=%s: its node %s is gone; lost", row.id, holder)
                    await self._records.move(row, state="stopped", reason="lost", ended_at=now)
        await self._records.store_readings(readings_of)
        await self._records.meter()

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
            await self._teardowns.teardown(row)
            return
        await self._records.move(row, **stopped(row))

    async def _orphan(self, status: SandboxStatus, now: datetime) -> bool:
        """Whether a sandbox a node holds, that this pass read no live record of, is to be
        destroyed: it has ended on no record (stopped, or no row) and it is not a create
        whose row is still to come (one commit right after the node answered; a sandbox
        the node made ``ORPHAN_GRACE`` ago that still has no row lost its gateway)."""
        if status.state in (SandboxState.STOPPED, SandboxState.CREATING):
            return False
        async with self._records.sessions() as session:
            row = await session.get(Sandbox, status.sandbox_id)
        if row is not None:
            return row.state == SandboxState.STOPPED.value
        return now - at(status.created_at) > ORPHAN_GRACE
