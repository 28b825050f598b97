"""In-process transport: the embedded default, one gateway and one node in one process.

It keeps the semantics of the Redis transport, in memory: job streams per node and per
runtime, dispatch markers with their expiry, claims that succeed once per token, the
gateway's results queue read by the same recorder, node reports that expire. A crash
loses all of it, and nothing more: every open invocation is still in the database with
its dispatch intent, and the reconciler hands it out again when the process restarts.

A node's report ages only while the process runs. The node and everyone who judges its
report share one event loop, so a loop held up for seconds (a long collection, the
process starved of CPU) stops the node's heartbeat and the judge alike: in wall time
the node would look dead to whatever runs before the heartbeat once the loop runs
again: a request would be refused ("no node agent is alive"), a reconciler pass could
hand out what runs on the node a second time. The node's heartbeat calls the transport
at least every half ``dead_after_s`` while the loop runs (``NodeSettings`` requires
that of ``CORRAL_HEARTBEAT_SECONDS`` and ``CORRAL_NODE_DEAD_AFTER_SECONDS``, the
variables this transport's ``dead_after_s`` comes from too), so a longer gap between
two calls can only be the loop held up; it counts as half ``dead_after_s``. The cap
only ever errs towards alive: a node whose heartbeat stopped while the loop runs is
dead on time as long as someone reads the catalogue at least that often (the gateway's
placement and its reconciler do), later if nobody does.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import itertools
import time
from collections.abc import AsyncIterator, Callable, Sequence

from app.dispatch.transport import Entry, GatewayTransport
from node.agent.transport import Claim, Delivery, NodeTransport
from wire import keys
from wire.messages import (
    DeliveryRef,
    Finished,
    Job,
    Marker,
    NodeReport,
    PoolUsage,
    Started,
    Stored,
)

_BATCH = 512


class InProcessTransport(GatewayTransport, NodeTransport):
    def __init__(self, *, dead_after_s: float, clock: Callable[[], float] = time.time) -> None:
        self.gateway_id = "local"
        self._dead_after_s = dead_after_s
        self._clock = clock
        self._seen = clock()  #: the wall time of the last call that aged the reports
        self._running = 0.0  #: the process's running time since then, stalls capped
        self._streams: dict[str, collections.deque[tuple[str, Job]]] = collections.defaultdict(
            collections.deque
        )
        self._arrived = asyncio.Condition()
        self._markers: dict[str, tuple[Marker, float]] = {}  # invocation -> (marker, expiry)
        self._reports: dict[str, tuple[NodeReport, float]] = {}  # node -> (report, expiry)
        self._results: asyncio.Queue[Entry] = asyncio.Queue()
        self._seq = itertools.count(1)

    async def ready(self) -> bool:
        return True

    async def keep_alive(self) -> None:
        return None

    # --- gateway: dispatch ------------------------------------------------------------
    async def dispatch(
        self, job: Job, *, node_id: str | None, hold_s: float, queue_s: float
    ) -> None:
        marker = Marker.placing(job, node_id=node_id, hold_s=hold_s)
        stream = marker.stream
        self._markers[job.invocation_id] = (marker, self._clock() + queue_s + job.deadline_seconds)
        self._streams[stream].append((f"{next(self._seq)}-0", job))
        async with self._arrived:
            self._arrived.notify_all()

    def _report_time(self) -> float:
        """The clock reports age by: wall time, a gap between calls capped at half
        ``dead_after_s`` (see the module's docstring)."""
        now = self._clock()
        self._running += min(max(0.0, now - self._seen), self._dead_after_s / 2)
        self._seen = now
        return self._running

    async def catalogue(self) -> list[NodeReport]:
        now = self._report_time()
        return [report for report, expiry in self._reports.values() if expiry > now]

    async def backlog(self, runtimes: Sequence[str]) -> dict[str, int]:
        return {
            runtime: sum(
                len(q) for s, q in self._streams.items() if s.startswith(keys.jobs(runtime, ""))
            )
            for runtime in runtimes
        }

    # --- gateway: recorder ------------------------------------------------------------
    async def results(self) -> AsyncIterator[list[Entry]]:
        while True:
            batch = [await self._results.get()]
            while len(batch) < _BATCH and not self._results.empty():
                batch.append(self._results.get_nowait())
            yield batch

    def drain(self) -> list[Entry]:
        entries = []
        while not self._results.empty():
            entries.append(self._results.get_nowait())
        return entries

    async def settle(self, entries: Sequence[Entry]) -> None:
        for entry in entries:
            event = entry.event
            if isinstance(event, Finished):
                held = self._markers.get(event.invocation_id)
                if held is not None and held[0].claim == event.claim:
                    del self._markers[event.invocation_id]

    # --- gateway: reconciler ----------------------------------------------------------
    async def markers(self, invocation_ids: Sequence[str]) -> dict[str, Marker]:
        now = self._clock()
        found = {}
        for invocation_id in invocation_ids:
            held = self._markers.get(invocation_id)
            if held is None:
                continue
            if held[1] <= now:
                del self._markers[invocation_id]
                continue
            found[invocation_id] = held[0]
        return found

    async def notify(self, gateway_id: str, event: Stored) -> None:
        self._results.put_nowait(Entry(event=event, stream="", entry_id=""))

    async def dead_gateways(self) -> list[str]:
        return []

    async def adopt(self, gateway_id: str) -> list[Entry]:
        return []

    async def forget_gateway(self, gateway_id: str) -> None:
        return None

    async def dead_nodes(self) -> list[str]:
        now = self._report_time()
        return sorted(node for node, (_, expiry) in self._reports.items() if expiry <= now)

    async def release(self, node_id: str, runtimes: Sequence[str]) -> int:
        return 0  # the embedded node pops what it reads: nothing is held by a dead reader

    async def forget_node(self, node_id: str, runtimes: Sequence[str]) -> None:
        self._reports.pop(node_id, None)
        self._streams.pop(keys.jobs_for_node(node_id), None)

    # --- node -------------------------------------------------------------------------
    async def announce(self, report: NodeReport) -> None:
        self._reports[report.node_id] = (report, self._report_time() + self._dead_after_s)

    async def withdraw(self, node_id: str) -> None:
        self._reports.pop(node_id, None)

    async def deliveries(
        self, node_id: str, runtimes: list[str], capacity: Callable[[], int]
    ) -> AsyncIterator[Delivery]:
        own = keys.jobs_for_node(node_id)
        prefixes = tuple(keys.jobs(runtime, "") for runtime in runtimes)
        last = ""  # the overflow stream taken from last
        while True:
            # Its own stream first, then the tenants' overflow queues in a ring ordered by
            # name, starting after the one taken from last.
            overflow = sorted(s for s, q in self._streams.items() if q and s.startswith(prefixes))
            start = bisect.bisect_right(overflow, last)
            delivery = self._take([own, *overflow[start:], *overflow[:start]])
            if delivery is not None:
                if delivery.ref.stream != own:
                    last = delivery.ref.stream
                yield delivery
                continue
            async with self._arrived:
                await self._arrived.wait_for(
                    lambda: (
                        bool(self._streams.get(own))
                        or any(q for s, q in self._streams.items() if s.startswith(prefixes))
                    )
                )

    async def waiting(self, node_id: str) -> int:
        return len(self._streams.get(keys.jobs_for_node(node_id), ()))

    def _take(self, streams: list[str]) -> Delivery | None:
        for stream in streams:
            queue = self._streams.get(stream)
            if queue:
                entry_id, job = queue.popleft()
                return Delivery(job=job, ref=DeliveryRef(stream=stream, entry_id=entry_id))
        return None

    async def claim(self, delivery: Delivery, started: Started, *, incarnation: str) -> Claim:
        job = delivery.job
        now = self._clock()
        held = self._markers.get(job.invocation_id)
        if held is None or held[1] <= now:
            return Claim.GONE
        marker = held[0]
        if marker.claim != job.claim:
            return Claim.STALE
        entry = f"{delivery.ref.stream}/{delivery.ref.entry_id}"
        if marker.claimed_by is not None:
            same = (marker.claimed_by, marker.incarnation, marker.entry) == (
                started.node_id,
                incarnation,
                entry,
            )
            return Claim.OK if same else Claim.TAKEN
        claimed = marker.model_copy(
            update={
                "claimed_by": started.node_id,
                "incarnation": incarnation,
                "entry": entry,
                "claimed_at": now,
            }
        )
        self._markers[job.invocation_id] = (claimed, now + marker.deadline_s + marker.hold_s)
        self._results.put_nowait(Entry(event=started, stream="", entry_id=""))
        return Claim.OK

    async def drop(self, delivery: Delivery) -> None:
        return None

    async def finish(self, delivery: Delivery, finished: Finished) -> None:
        self._results.put_nowait(Entry(event=finished, stream="", entry_id=""))

    async def publish(self, event: PoolUsage) -> None:
        self._results.put_nowait(Entry(event=event, stream="", entry_id=""))
