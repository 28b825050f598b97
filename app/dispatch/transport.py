"""The control plane's seam to the nodes: dispatch out, node events in.

A gateway ``dispatch``es a Job (after its row and dispatch intent are committed) onto
the stream of the node placement chose, or onto its runtime's overflow stream, with a
dispatch ``Marker`` beside it. Its recorder reads what nodes report on the gateway's own
results stream (``results``), stores it, and only then ``settle``s it: the result entry
and the job's delivery are acknowledged and the marker of the stored claim removed. The
reconciler reads ``markers`` and liveness to judge open invocations, and ``adopt``s the
results stream of a gateway that died.

Two implementations: ``app.dispatch.redis.RedisGatewayTransport`` (many gateways and
nodes) and ``app.dispatch.inprocess.InProcessTransport`` (``corral serve`` alone).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from wire.messages import Finished, Job, Marker, NodeReport, PoolUsage, Started, Stored


@dataclass(frozen=True, slots=True)
class Entry:
    """One event read from a results or events stream, and how to acknowledge it."""

    event: Started | Finished | Stored | PoolUsage
    stream: str
    entry_id: str


class GatewayTransport(ABC):
    gateway_id: str

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open what the transport needs."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release it."""

    @abstractmethod
    async def ready(self) -> bool:
        """True when work can be dispatched."""

    @abstractmethod
    async def keep_alive(self) -> None:
        """Refresh this gateway's liveness (its results stream is adopted if it stops)."""

    # --- dispatch ---------------------------------------------------------------------
    @abstractmethod
    async def dispatch(
        self, job: Job, *, node_id: str | None, hold_s: float, queue_s: float
    ) -> None:
        """Put ``job`` on ``node_id``'s stream (None: its runtime's overflow stream) with its
        marker; the marker waits ``queue_s`` for a claim and, once claimed, lives the job's
        time limits plus ``hold_s``."""

    @abstractmethod
    async def catalogue(self) -> list[NodeReport]:
        """The live nodes' latest reports."""

    @abstractmethod
    async def backlog(self, runtimes: Sequence[str]) -> dict[str, int]:
        """Jobs waiting on each runtime's overflow stream."""

    # --- recorder ---------------------------------------------------------------------
    @abstractmethod
    def results(self) -> AsyncIterator[list[Entry]]:
        """Batches of what nodes report to this gateway, and node events for anyone;
        first what this gateway had read and not settled when its reading was interrupted
        (a lost connection). A gateway that dies leaves the rest to ``adopt``."""

    def drain(self) -> list[Entry]:
        """What this process holds in memory and has not handed to the recorder yet (read
        once more before shutting down; a durable transport holds nothing in memory)."""
        return []

    @abstractmethod
    async def settle(self, entries: Sequence[Entry]) -> None:
        """Acknowledge stored entries: the entry itself, the delivery of a finished Job,
        and the Job's marker if it still holds that claim."""

    # --- reconciler ---------------------------------------------------------------------
    @abstractmethod
    async def markers(self, invocation_ids: Sequence[str]) -> dict[str, Marker]:
        """The markers that exist, by invocation id."""

    @abstractmethod
    async def notify(self, gateway_id: str, event: Stored) -> None:
        """Tell a gateway that a row it may wait for became final."""

    @abstractmethod
    async def dead_gateways(self) -> list[str]:
        """Gateways that announced themselves and went silent."""

    @abstractmethod
    async def adopt(self, gateway_id: str) -> list[Entry]:
        """A batch of what is left on a dead gateway's results stream (its unsettled
        entries first); empty once nothing is left."""

    @abstractmethod
    async def forget_gateway(self, gateway_id: str) -> None:
        """Delete a dead gateway's drained results stream and its entry."""

    @abstractmethod
    async def dead_nodes(self) -> list[str]:
        """Nodes that announced themselves and went silent."""

    @abstractmethod
    async def release(self, node_id: str, runtimes: Sequence[str]) -> int:
        """Put back on its overflow stream every Job a dead node had read and not claimed
        (the marker of an unclaimed Job says nothing of the node that read it); drop what
        it read of superseded or claimed Jobs (their rows are judged by their markers).
        How many were put back."""

    @abstractmethod
    async def forget_node(self, node_id: str, runtimes: Sequence[str]) -> None:
        """Delete a dead node's job stream and what it held pending on the overflow
        streams (its Jobs have been handed out again under new claims)."""
