"""The gateway's copy of what the live nodes reported (``wire.messages.NodeReport``).

Read from the transport at most every ``refresh_s``; between two reads the gateway
counts what it placed on each node itself, so a burst does not pile onto the node that
looked emptiest in the last report.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence

from app.dispatch.transport import GatewayTransport
from wire.messages import NodeReport


class Catalogue:
    def __init__(
        self,
        transport: GatewayTransport,
        *,
        refresh_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._transport = transport
        self._refresh_s = refresh_s
        self._clock = clock
        self._read_at = -1e18
        self._nodes: list[NodeReport] = []
        self._backlog: dict[str, int] = {}
        self._placed: collections.Counter[str] = collections.Counter()

    async def nodes(self) -> list[NodeReport]:
        now = self._clock()
        if now - self._read_at >= self._refresh_s:
            self._nodes = await self._transport.catalogue()
            runtimes = sorted({rt for node in self._nodes for rt in node.runtimes})
            self._backlog = await self._transport.backlog(runtimes) if runtimes else {}
            self._placed.clear()
            self._read_at = now
        return self._nodes

    def free(self, node: NodeReport) -> int:
        """Slots the node had free at its last report, less what was placed on it since."""
        return node.slots_free - self._placed[node.node_id]

    def placed(self, node_id: str | None, runtime: str) -> None:
        if node_id is None:
            self._backlog[runtime] = self._backlog.get(runtime, 0) + 1
        else:
            self._placed[node_id] += 1

    def backlog(self, runtime: str) -> int:
        return self._backlog.get(runtime, 0)

    def languages(self, nodes: Sequence[NodeReport]) -> dict[str, str]:
        """Language -> the runtime that offers it, over ``nodes``."""
        return {
            lang: runtime
            for node in nodes
            for runtime, langs in sorted(node.runtimes.items())
            for lang in langs
        }
