"""The gateway's copy of what the live nodes reported (``wire.messages.NodeReport``).

Read from the transport at most every ``refresh_s`` (every time while it is empty, so
the first node's report is seen at once). A report counts the node's running
executions and the Jobs waiting on its stream; the gateway subtracts what it placed on
the node and the report cannot have seen, so a burst does not pile onto the node that
looked emptiest in a report that predates it. A placement counts from the moment it is
made until a report made after its Job reached the node's stream (``Placed.landed``):
the row's commit comes in between and may take longer than a report's period.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable, Sequence

from app.dispatch.transport import GatewayTransport
from wire.messages import NodeReport

#: How long before a node's report a Job that reached its stream may still be missing
#: from it (the node reads its stream's length before it stamps the report; clocks skew).
PLACED_MARGIN_S = 0.5


class Placed:
    """A placement on a node, counted against the node's free slots until a report
    made after its Job reached the node's stream."""

    __slots__ = ("_wall", "at")

    def __init__(self, wall: Callable[[], float]) -> None:
        self._wall = wall
        self.at = math.inf  #: when the Job reached the stream (or its dispatch ended)

    def landed(self) -> None:
        """The Job is on the node's stream, or will not be (its dispatch failed: the
        reconciler sends it to the overflow stream)."""
        if self.at == math.inf:
            self.at = self._wall()


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
        self._placed: dict[str, list[Placed]] = collections.defaultdict(list)

    async def nodes(self) -> list[NodeReport]:
        now = self._clock()
        # an empty copy is never trusted: "no node" must not outlive the first report
        if not self._nodes or now - self._read_at >= self._refresh_s:
            self._nodes = await self._transport.catalogue()
            runtimes = sorted({rt for node in self._nodes for rt in node.runtimes})
            self._backlog = await self._transport.backlog(runtimes) if runtimes else {}
            # A Job that reached a node's stream shortly before its report may be missing
            # from it: keep counting it for PLACED_MARGIN_S; one still on its way, always.
            reported = {node.node_id: node.reported_at - PLACED_MARGIN_S for node in self._nodes}
            self._placed = collections.defaultdict(
                list,
                {
                    node_id: [p for p in placed if p.at > reported.get(node_id, math.inf)]
                    for node_id, placed in self._placed.items()
                },
            )
            self._read_at = now
        return self._nodes

    def free(self, node: NodeReport) -> int:
        """Slots the node had free at its last report, less what was placed on it since."""
        return node.slots_free - len(self._placed.get(node.node_id, ()))

    def on_the_way(self) -> int:
        """Placements whose dispatch is not over yet."""
        return sum(p.at == math.inf for placed in self._placed.values() for p in placed)

    def placed(self, node_id: str | None, runtime: str) -> Placed | None:
        if node_id is None:
            self._backlog[runtime] = self._backlog.get(runtime, 0) + 1
            return None
        placed = Placed(self._wall)
        self._placed[node_id].append(placed)
        return placed

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
