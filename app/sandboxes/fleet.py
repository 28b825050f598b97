"""The nodes as the gateway's sandbox service reaches them: one client per node (by its
catalogue report), the node of a sandbox, and placement of a new one
(``app.placement.sandboxes``: best of two by live sandboxes and free memory)."""

from __future__ import annotations

import logging

from app.errors import CorralError, NodeUnavailable, NotFound, SandboxNotRunning
from app.placement import sandboxes as placement
from app.placement.catalogue import Catalogue
from app.sandboxes.admission import Ask
from app.sandboxes.listing import GONE
from app.sandboxes.nodes import NodeClient
from app.sandboxes.place import Placed
from wire.messages import NodeReport

log = logging.getLogger(__name__)


class Fleet:
    def __init__(self, *, catalogue: Catalogue, node_token: str | None) -> None:
        self.catalogue = catalogue
        self._token = node_token
        self._clients: dict[tuple[str, str], NodeClient] = {}

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()

    async def nodes(self) -> list[NodeReport]:
        return list(await self.catalogue.nodes())

    def client(self, report: NodeReport) -> NodeClient:
        if self._token is None:
            raise NodeUnavailable("the gateway has no node token (CORRAL_NODE_TOKEN)")
        assert report.address is not None
        key = (report.node_id, report.address)
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = NodeClient(report.node_id, report.address, self._token)
        return client

    async def place(self, backend: str, ask: Ask) -> NodeClient:
        """A node with room for the sandbox (``app.placement.sandboxes``); refused at once
        if no node could ever hold it."""
        reports = await self.catalogue.nodes()
        placement.refuse_too_large(reports, backend, memory_mb=ask.memory_mb, cpu=ask.cpu)
        chosen = placement.choose(reports, backend, memory_mb=ask.memory_mb, cpu=ask.cpu)
        return self.client(chosen)

    async def node_by_id(self, node_id: str, ask: Ask | None = None) -> NodeClient:
        """The client of one node; with ``ask``, refused unless it has room for it."""
        for report in await self.catalogue.nodes():
            if report.node_id == node_id and report.address is not None:
                if ask is not None:
                    placement.check(report, memory_mb=ask.memory_mb, cpu=ask.cpu)
                return self.client(report)
        raise NodeUnavailable(f"node {node_id} is not reachable now")

    async def node_of(self, row: Placed) -> NodeClient:
        """The client of the node holding a live sandbox."""
        if row.state in GONE:
            raise SandboxNotRunning(f"sandbox {row.id} has stopped ({row.reason})")
        for report in await self.catalogue.nodes():
            if report.node_id == row.node_id and report.address is not None:
                return self.client(report)
        raise NodeUnavailable(f"the node of sandbox {row.id} is not reachable now")

    @staticmethod
    async def discard(node: NodeClient, sandbox_id: str) -> None:
        """Destroy a sandbox a node holds without a live record (else ``sync`` will)."""
        try:
            await node.destroy(sandbox_id)
        except NotFound:
            pass  # never made, or gone already
        except CorralError as exc:
            log.warning("sandbox=%s: not destroyed on %s yet (%s)", sandbox_id, node.node_id, exc)
