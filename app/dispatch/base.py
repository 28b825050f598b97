"""The dispatch protocol: a queue of Jobs between the gateway and node agents.

Gateway side: ``submit`` a Job (after its invocation row is stored), then ``wait`` for
the Completion a node publishes once it has stored the result.

Node side: ``deliveries`` yields Jobs; the node stores the result, then ``ack``s the
Delivery and ``complete``s the Job. A Delivery that is never acked (the node died) is
handed to a live node again, with ``attempt`` counting deliveries, so a re-run is
always visible in the stored invocation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from app.dispatch.messages import Completion, Job


@dataclass(slots=True)
class Delivery:
    job: Job
    attempt: int
    token: str = field(default="")  #: implementation handle (a stream entry id)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node_id: str
    runtimes: dict[str, list[str]]  #: runtime name -> languages
    slots: int


class Dispatcher(ABC):
    """Both halves of a dispatch implementation."""

    gateway_id: str

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open connections and background readers."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def ready(self) -> bool:
        """True when the queue can take work."""

    # --- gateway side -------------------------------------------------------------------
    @abstractmethod
    async def submit(self, job: Job) -> None: ...

    @abstractmethod
    async def wait(self, invocation_id: str, timeout: float) -> Completion | None:
        """The Completion, or None if none arrived in time (check the database then)."""

    @abstractmethod
    async def queue_depth(self) -> int: ...

    @abstractmethod
    async def live_nodes(self) -> list[NodeInfo]: ...

    # --- node side ----------------------------------------------------------------------
    @abstractmethod
    async def register(self, node: NodeInfo) -> None:
        """Announce (and refresh) a node; called at start and on each heartbeat."""

    @abstractmethod
    async def unregister(self, node_id: str) -> None: ...

    @abstractmethod
    def deliveries(self, node: NodeInfo) -> AsyncIterator[Delivery]:
        """Jobs for this node, including those reclaimed from dead nodes."""

    @abstractmethod
    async def ack(self, node_id: str, delivery: Delivery) -> None: ...

    @abstractmethod
    async def complete(self, job: Job, completion: Completion) -> None: ...
