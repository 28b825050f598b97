"""Best of k: sample k nodes that can take the work now, keep the best scored.

A node scores for warm inventory first (a worker already bound to this tenant and
language, then a spare one of the language: the call skips a cold start), then for
the share of its slots and memory that is free. Sampling k instead of scanning every
node keeps a placement O(k) and spreads concurrent gateways' choices (e2b's
placement does the same). With no node free the work goes to the runtime's overflow
stream, which any node of that runtime drains; past ``max_queued`` waiting there,
placement refuses with ``no_capacity``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from app.errors import NoCapacity, UnsupportedRuntime
from app.placement.catalogue import Catalogue, Placed
from wire.messages import NodeReport, pool_key


@dataclass(frozen=True, slots=True)
class Placement:
    runtime: str
    node_id: str | None  #: None: the runtime's overflow stream
    placed: Placed | None = None  #: counted against the node until ``landed``

    def landed(self) -> None:
        """The dispatch is over (the Job is on the node's stream, or it failed)."""
        if self.placed is not None:
            self.placed.landed()


class BestOfK:
    def __init__(
        self, catalogue: Catalogue, *, k: int, max_queued: int, rng: random.Random | None = None
    ) -> None:
        self.catalogue = catalogue
        self._k = k
        self._max_queued = max_queued
        self._rng = rng or random.Random()

    async def offering(self, language: str) -> list[tuple[NodeReport, str]]:
        """The live nodes that run ``language``, with the runtime each runs it in; the
        typed refusal when there are none."""
        nodes = await self.catalogue.nodes()
        if not nodes:
            raise NoCapacity("no node agent is alive", details={"language": language})
        offering = [(node, rt) for node in nodes if (rt := node.runtime_for(language))]
        if not offering:
            offered = ", ".join(sorted(self.catalogue.languages(nodes))) or "none"
            raise UnsupportedRuntime(f"no node runs language {language!r} (offered: {offered})")
        return offering

    async def place(self, language: str, tenant_id: str) -> Placement:
        offering = await self.offering(language)
        with_room = [(node, rt) for node, rt in offering if self.catalogue.free(node) > 0]
        if with_room:
            sample = self._rng.sample(with_room, min(self._k, len(with_room)))
            node, runtime = max(sample, key=lambda c: self._score(c[0], c[1], language, tenant_id))
            return Placement(runtime, node.node_id, self.catalogue.placed(node.node_id, runtime))
        runtime = offering[0][1]
        waiting = self.catalogue.backlog(runtime)
        if waiting >= self._max_queued:
            raise NoCapacity(
                f"every {runtime} node is busy and {waiting} executions are waiting",
                details={"runtime": runtime, "waiting": waiting, "nodes": len(offering)},
            )
        self.catalogue.placed(None, runtime)
        return Placement(runtime, None)

    def _score(self, node: NodeReport, runtime: str, language: str, tenant_id: str) -> float:
        warm = 0.0
        if node.warm.get(pool_key(runtime, language, tenant_id), 0) > 0:
            warm = 2.0
        elif node.warm.get(pool_key(runtime, language), 0) > 0:
            warm = 1.0
        slots = self.catalogue.free(node) / max(1, node.slots)
        memory = node.memory_free_mb / max(1, node.memory_mb)
        return warm + slots + 0.5 * memory
