"""How a node agent meets the rest of Corral: the data plane's only seam.

A node takes ``Delivery``s (a Job and where it came from), **claims** each before it
runs it, and reports the outcome; it never reads or writes the database. Two
implementations: ``node.agent.redis.RedisNodeTransport`` (a node of a cluster) and
the control plane's in-process transport (a node embedded in ``corral serve``).

The claim is what makes a hand-out run at most once: it succeeds for one node, and only
while the Job's claim token is the current one (``Claim.OK``); the node then runs the
Job and ``finish``es it. Any other outcome means another hand-out is current or the
execution is settled, and the node ``drop``s the delivery without running it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from enum import StrEnum

from wire.messages import DeliveryRef, Finished, Job, NodeReport, PoolUsage, Started


@dataclass(frozen=True, slots=True)
class Delivery:
    job: Job
    ref: DeliveryRef


class Claim(StrEnum):
    OK = "ok"  #: this node holds the current token: run it
    STALE = "stale"  #: a newer hand-out of the execution is current
    TAKEN = "taken"  #: another node claimed this token
    GONE = "gone"  #: no marker: settled already, or lost (the reconciler hands it out again)


class NodeTransport(ABC):
    @abstractmethod
    async def announce(self, report: NodeReport) -> None:
        """Refresh this node's liveness and its entry in the placement catalogue."""

    @abstractmethod
    async def withdraw(self, node_id: str) -> None:
        """Leave the catalogue (clean shutdown)."""

    @abstractmethod
    def deliveries(
        self, node_id: str, runtimes: list[str], capacity: Callable[[], int]
    ) -> AsyncIterator[Delivery]:
        """Jobs placed on this node first, then overflow Jobs of its runtimes; at most
        about ``capacity()`` are fetched at a time. Deliveries this node took before a
        restart (same node id) come again first."""

    @abstractmethod
    async def waiting(self, node_id: str) -> int:
        """Jobs placed on this node that it has not taken yet (its report subtracts them
        from its free slots, so placement does not pile more onto it)."""

    @abstractmethod
    async def claim(self, delivery: Delivery, started: Started, *, incarnation: str) -> Claim:
        """Claim the delivery's token for this node; on OK, ``started`` is published."""

    @abstractmethod
    async def drop(self, delivery: Delivery) -> None:
        """Acknowledge a delivery this node will not run (its claim failed)."""

    @abstractmethod
    async def finish(self, delivery: Delivery, finished: Finished) -> None:
        """Publish the outcome to the recorder of the Job's gateway. Raises if it could
        not be published (the agent retries; nothing is acknowledged before the recorder
        has stored it)."""

    @abstractmethod
    async def publish(self, event: PoolUsage) -> None:
        """Publish a node event that belongs to no gateway (idle pool capacity)."""

    @abstractmethod
    async def ready(self) -> bool:
        """True when work can flow (the node's /healthz)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
