"""Destroys, acknowledged at once, and the work the gateway does off the caller's path.

``destroy`` moves the row to ``stopping`` and ended (its room in the tenant's totals
freed, its charge closed) in one commit and answers; the node's teardown runs in a task
this object owns (``spawn``), which records the row ``stopped``. ``drain``, at close,
waits (bounded) for what is still running, while the nodes are still there; what a
gateway leaves undone (it died, or the node was out of reach), the leader's ``sync``
finishes (``app.sandboxes.sync``). Creates discard what a node made for them here too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any

from app.db.models import Sandbox
from app.errors import CorralError, NotFound
from app.sandboxes.fleet import Fleet
from app.sandboxes.listing import GONE
from app.sandboxes.nodes import NodeClient
from app.sandboxes.records import Records, fields, stopped
from wire.sandboxes import SandboxState

log = logging.getLogger(__name__)

#: how long closing waits for teardowns still running
DRAIN_S = 10.0


class Teardowns:
    def __init__(self, *, records: Records, fleet: Fleet) -> None:
        self._records = records
        self._fleet = fleet
        self._tasks: set[asyncio.Task[None]] = set()

    def spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``work`` off the caller's path; ``drain`` waits for what is left."""
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def discard(self, node: NodeClient, sandbox_id: str) -> None:
        """Destroy, off the caller's path, a sandbox a node made that has no record."""
        self.spawn(self._fleet.discard(node, sandbox_id), f"discard-{sandbox_id}")

    async def drain(self, timeout_s: float = DRAIN_S) -> None:
        """Wait (bounded) for the teardowns and discards still running: at shutdown,
        while the nodes are still there (what is left, ``sync`` finishes)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)

    async def close(self) -> None:
        await self.drain()
        for task in list(self._tasks):
            task.cancel()

    async def destroy(self, tenant_id: str, sandbox_id: str) -> Sandbox:
        """Acknowledged at once: the row is marked ``stopping``, ended now (its usage is
        metered up to here) and its room in the tenant's quota freed, in one commit, and
        the answer goes; the node's teardown runs off the caller's path (``teardown``).
        A gateway that dies before the teardown leaves it to ``sync``."""
        row = await self._records.get(tenant_id, sandbox_id)
        while row.state not in GONE:
            marked = await self._records.move(
                row,
                state=SandboxState.STOPPING.value,
                reason="destroyed",
                ended_at=datetime.now(UTC),
            )
            if marked is not None:
                self.spawn(self.teardown(marked), f"teardown-{sandbox_id}")
                return marked
            row = await self._records.current(sandbox_id)  # another writer moved it
        return row

    async def teardown(self, row: Sandbox) -> None:
        """Destroy a ``stopping`` sandbox on its node, then record it stopped (its end,
        reason and usage as acknowledged). A node out of reach leaves the row
        ``stopping`` for ``sync``."""
        values: dict[str, Any] = {}
        try:
            if row.node_id is not None:
                node = await self._fleet.node_by_id(row.node_id)
                values = fields(row, await node.destroy(row.id))
        except NotFound:
            pass  # the node no longer had it
        except CorralError as exc:
            log.warning("sandbox=%s: teardown left to sync (%s)", row.id, exc.message)
            return
        await self._records.move(row, **values | stopped(row))  # lost to sync: it recorded it
