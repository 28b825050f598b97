"""A node's transport on Redis: streams in, one claim script, a results stream out.

A node reads its own job stream (``keys.jobs_for_node``) and the tenants' overflow
streams of its runtimes (``keys.jobs``, one per tenant; ``keys.queues`` lists them) in the
``NODE_GROUP`` consumer group, under its node id as consumer name. It takes overflow work
one tenant after another: each read asks the next tenants in a ring ordered by tenant
(starting after the one the last read ended on) for one Job each, as many tenants as it
has free slots, so a tenant's wait does not grow with another
tenant's backlog. At start it first re-reads what it had taken before a restart
(its pending entries). Claiming runs one Lua script that checks the Job's token against
the dispatch marker, records this node as the holder and publishes ``Started`` on the
gateway's results stream, all at once. A dropped delivery is acknowledged and deleted
at once; a finished one is acknowledged by the recorder, after it stored the result.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from node.agent.transport import Claim, Delivery, NodeTransport
from wire import keys
from wire.messages import DeliveryRef, Finished, Job, NodeReport, PoolUsage, Started

log = logging.getLogger(__name__)

#: Results and events streams are capped (approximately) at this many entries.
STREAM_MAXLEN = 1_000_000
#: How often a node looks for deliveries pending on it that it never received, and how
#: long such a delivery must have been pending to count.
SWEEP_S = 2.0
SWEEP_IDLE_MS = 3000
#: Pending entries of one consumer looked at per stream and sweep.
PENDING_SCAN = 10_000
#: How long a read that includes tenants' overflow streams blocks, and how often the set
#: of tenants with overflow work is read again.
OVERFLOW_POLL_MS = 250
QUEUES_REFRESH_S = 0.25

# KEYS[1] a tenant's overflow stream, KEYS[2] the set of tenants; ARGV tenant.
# Forgets the tenant's queue once it is empty (a dispatch adds it back atomically).
_FORGET_EMPTY = """
if redis.call('XLEN', KEYS[1]) == 0 then redis.call('SREM', KEYS[2], ARGV[1]) end
return 0
"""

# KEYS[1] marker, KEYS[2] results stream
# ARGV claim, node id, incarnation, now (epoch s), Started json, results stream maxlen,
#      the delivery's stream entry (a duplicate entry of the same Job is not the same claim)
_CLAIM = """
local raw = redis.call('GET', KEYS[1])
if not raw then return 'gone' end
local m = cjson.decode(raw)
if m['claim'] ~= ARGV[1] then return 'stale' end
local holder = m['claimed_by']
if holder and holder ~= cjson.null then
  -- the same delivery again (a retried call whose reply was lost): still ours
  if holder == ARGV[2] and m['incarnation'] == ARGV[3] and m['entry'] == ARGV[7] then
    return 'ok'
  end
  return 'taken'
end
m['claimed_by'] = ARGV[2]
m['incarnation'] = ARGV[3]
m['entry'] = ARGV[7]
m['claimed_at'] = tonumber(ARGV[4])
local hold = math.ceil((tonumber(m['deadline_s']) + tonumber(m['hold_s'])) * 1000)
redis.call('SET', KEYS[1], cjson.encode(m), 'PX', hold)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*', 'event', ARGV[5])
return 'ok'
"""


class RedisNodeTransport(NodeTransport):
    def __init__(self, redis: Redis, *, dead_after_s: float, poll_s: float = 1.0) -> None:
        self._redis: Any = redis  # redis-py's stubs type replies as bytes | str | int
        self._dead_after_ms = int(dead_after_s * 1000)
        self._poll_ms = int(poll_s * 1000)
        self._claim = redis.register_script(_CLAIM)
        self._groups: set[str] = set()

    async def announce(self, report: NodeReport) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(keys.node(report.node_id), report.model_dump_json(), px=self._dead_after_ms)
            pipe.sadd(keys.NODES, report.node_id)
            await pipe.execute()

    async def withdraw(self, node_id: str) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(keys.node(node_id))
            pipe.srem(keys.NODES, node_id)
            await pipe.execute()

    async def deliveries(
        self, node_id: str, runtimes: list[str], capacity: Callable[[], int]
    ) -> AsyncIterator[Delivery]:
        own = keys.jobs_for_node(node_id)
        queues = _TenantQueues(self._redis, sorted(runtimes))
        await self._ensure_groups([own])
        taken: dict[tuple[str, str], float] = {}  # (stream, entry id) yielded, still pending
        # What this consumer took before a restart and never saw through comes first.
        overflow = await queues.streams()
        async for delivery in self._pending(node_id, [own, *overflow], taken, idle_ms=0):
            yield delivery
        sweep_at = time.monotonic() + SWEEP_S
        while True:
            if time.monotonic() >= sweep_at:
                overflow = await queues.streams(forget_empty=True)
                async for delivery in self._pending(
                    node_id, [own, *overflow], taken, idle_ms=SWEEP_IDLE_MS
                ):
                    yield delivery
                sweep_at = time.monotonic() + SWEEP_S
            # This node's own stream, and the next tenants' overflow streams in turn: one
            # Job from each of as many tenants as it has free slots.
            turn = await queues.turn(max(1, capacity()))
            try:
                await self._ensure_groups(turn)
                batches = await self._redis.xreadgroup(
                    keys.NODE_GROUP,
                    node_id,
                    dict.fromkeys([own, *turn], ">"),
                    count=1 if turn else max(1, capacity()),
                    block=OVERFLOW_POLL_MS if turn else self._poll_ms,
                )
            except ResponseError as exc:
                # A stream or the group is gone (Redis restarted without persistence, or
                # the reconciler deleted the stream of a node it thought dead).
                if "NOGROUP" not in str(exc):
                    raise
                log.warning("node %s: job streams vanished (%s); recreating", node_id, exc)
                self._groups.clear()
                await self._ensure_groups([own])
                continue
            for stream, entries in batches or []:
                for entry_id, fields in entries:
                    taken[(stream, entry_id)] = time.monotonic()
                    fresh = await self._decode(stream, entry_id, fields)
                    if fresh is not None:
                        yield fresh

    async def _pending(
        self,
        node_id: str,
        streams: list[str],
        taken: dict[tuple[str, str], float],
        *,
        idle_ms: int,
    ) -> AsyncIterator[Delivery]:
        """Entries pending on this consumer that it never handled: taken before a restart,
        or delivered by Redis while the reply never reached this node (a read that failed
        and was retried). Entries no longer pending are forgotten."""
        for stream in streams:
            try:
                pending = await self._redis.xpending_range(
                    stream, keys.NODE_GROUP, "-", "+", PENDING_SCAN, consumername=node_id
                )
            except ResponseError:
                continue  # the stream or group vanished: the read below makes them again
            still = {p["message_id"] for p in pending}
            for key in [k for k in taken if k[0] == stream and k[1] not in still]:
                del taken[key]
            lost = [
                p["message_id"]
                for p in pending
                if (stream, p["message_id"]) not in taken
                and int(p["time_since_delivered"]) >= idle_ms
            ]
            if not lost:
                continue
            if idle_ms:
                log.warning(
                    "node %s: %d deliveries on %s never reached it", node_id, len(lost), stream
                )
            for entry_id, fields in await self._redis.xclaim(
                stream, keys.NODE_GROUP, node_id, 0, lost
            ):
                taken[(stream, entry_id)] = time.monotonic()
                delivery = await self._decode(stream, entry_id, fields)
                if delivery is not None:
                    yield delivery

    async def waiting(self, node_id: str) -> int:
        try:
            groups = await self._redis.xinfo_groups(keys.jobs_for_node(node_id))
        except ResponseError:
            return 0  # no stream yet
        for group in groups:
            if group["name"] == keys.NODE_GROUP:
                return int(group.get("lag") or 0)
        return 0

    async def claim(self, delivery: Delivery, started: Started, *, incarnation: str) -> Claim:
        job = delivery.job
        outcome = await self._claim(
            keys=[keys.inflight(job.invocation_id), keys.results(job.reply_to)],
            args=[
                job.claim,
                started.node_id,
                incarnation,
                started.started_at,
                started.model_dump_json(),
                STREAM_MAXLEN,
                f"{delivery.ref.stream}/{delivery.ref.entry_id}",
            ],
        )
        return Claim(outcome)

    async def drop(self, delivery: Delivery) -> None:
        await self._ack_delete(delivery.ref.stream, delivery.ref.entry_id)

    async def _ack_delete(self, stream: str, entry_id: str) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xack(stream, keys.NODE_GROUP, entry_id)
            pipe.xdel(stream, entry_id)
            await pipe.execute()

    async def finish(self, delivery: Delivery, finished: Finished) -> None:
        await self._redis.xadd(
            keys.results(delivery.job.reply_to),
            {"event": finished.model_dump_json()},
            maxlen=STREAM_MAXLEN,
            approximate=True,
        )

    async def publish(self, event: PoolUsage) -> None:
        await self._redis.xadd(
            keys.EVENTS, {"event": event.model_dump_json()}, maxlen=STREAM_MAXLEN, approximate=True
        )

    async def ready(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except (RedisError, OSError):
            return False

    async def _decode(
        self, stream: str, entry_id: str, fields: dict[str, Any] | None
    ) -> Delivery | None:
        """The Delivery of an entry; an entry that is not a Job is dropped, not retried."""
        try:
            job = Job.model_validate_json((fields or {})["job"])
        except (KeyError, ValueError):
            log.error("stream %s entry %s: not a Job (or deleted); dropping it", stream, entry_id)
            with contextlib.suppress(RedisError):
                await self._ack_delete(stream, entry_id)
            return None
        return Delivery(job=job, ref=DeliveryRef(stream=stream, entry_id=entry_id))

    async def _ensure_groups(self, streams: list[str]) -> None:
        for stream in streams:
            if stream in self._groups:
                continue
            try:
                await self._redis.xgroup_create(stream, keys.NODE_GROUP, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self._groups.add(stream)


class _TenantQueues:
    """The overflow streams of a node's runtimes, one per tenant, taken in turn."""

    def __init__(self, redis: Any, runtimes: list[str]) -> None:
        self._redis = redis
        self._runtimes = runtimes
        self._forget = redis.register_script(_FORGET_EMPTY)
        self._streams: list[str] = []
        self._read_at = -1e18
        self._last = ""  #: the stream the last turn ended on

    async def streams(self, *, forget_empty: bool = False) -> list[str]:
        if forget_empty:
            for stream in self._streams:
                runtime = stream.split(":")[2]
                await self._forget(
                    keys=[stream, keys.queues(runtime)], args=[keys.tenant_of(stream)]
                )
            self._read_at = -1e18
        now = time.monotonic()
        if now - self._read_at >= QUEUES_REFRESH_S:
            found = []
            for runtime in self._runtimes:
                tenants = await self._redis.smembers(keys.queues(runtime))
                found += [keys.jobs(runtime, tenant) for tenant in tenants]
            self._streams, self._read_at = sorted(found), now
        return self._streams

    async def turn(self, count: int) -> list[str]:
        """The next ``count`` tenants' streams in a ring ordered by name, starting after
        the stream the last turn ended on. A tenant that queued since is placed in the
        ring by its name, not by its arrival, so a position counted in a list that has
        grown since cannot skip it."""
        streams = await self.streams()
        if not streams:
            return []
        start = bisect.bisect_right(streams, self._last) % len(streams)
        chosen = (streams[start:] + streams[:start])[: min(count, len(streams))]
        self._last = chosen[-1]
        return chosen
