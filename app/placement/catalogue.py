"""The gateway's copy of what the live nodes reported (``wire.messages.NodeReport``).

Read from the transport at most every ``refresh_s`` (every time while it is empty, so
the first node's report is seen at once). A report counts the node's running
executions and the Jobs waiting on its stream; the gateway subtracts what it placed on
the node after the report was made, so a burst does not pile onto the node that looked
emptiest in a report that predates it.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence

from app.dispatch.transport import GatewayTransport
from wire.messages import NodeReport

#: How long before a node's report a placement may still be missing from it.
PLACED_MARGIN_S = 0.5


class Catalogue:
    def __init__(
        self,
        transport: GatewayTransport,
        *,
        refresh_s: float,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._wall = wall
        self._transport = transport
        self._refresh_s = refresh_s
        self._clock = clock
        self._read_at = -1e18
        self._nodes: list[NodeReport] = []
        self._backlog: dict[str, int] = {}
        self._placed: dict[str, list[float]] = collections.defaultdict(list)  # node -> times

    async def nodes(self) -> list[NodeReport]:
        now = self._clock()
        # an empty copy is never trusted: "no node" must not outlive the first report
        if not self._nodes or now - self._read_at >= self._refresh_s:
            self._nodes = await self._transport.catalogue()
            runtimes = sorted({rt for node in self._nodes for rt in node.runtimes})
            self._backlog = await self._transport.backlog(runtimes) if runtimes else {}
            # A placement shortly before a report may not be on the node's stream yet when
            # the node counts what waits there: keep counting it for PLACED_MARGIN_S.
            reported = {node.node_id: node.reported_at - PLACED_MARGIN_S for node in self._nodes}
            self._placed = collections.defaultdict(
                list,
                {
                    node_id: [t for t in times if t > reported.get(node_id, float("inf"))]
                    for node_id, times in self._placed.items()
                },
            )
            self._read_at = now
        return self._nodes

    def free(self, node: NodeReport) -> int:
        """Slots the node had free at its last report, less what was placed on it since."""
        return node.slots_free - len(self._placed.get(node.node_id, ()))

    def placed(self, node_id: str | None, runtime: str) -> None:
        if node_id is None:
            self._backlog[runtime] = self._backlog.get(runtime, 0) + 1
        else:
            self._placed[node_id].append(self._wall())

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
