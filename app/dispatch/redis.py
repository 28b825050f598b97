"""The gateway's transport on Redis Streams: many gateways, many nodes.

Dispatch is one MULTI: the Job onto a node's stream (or its runtime's overflow stream)
and the execution's marker (``keys.inflight``) beside it. A node claims the marker
before it runs the Job (``node.agent.redis``). The gateway's recorder reads its own
results stream and the shared events stream in the ``RECORDER_GROUP`` group, and after
storing what it read acknowledges and deletes the entries, acknowledges and deletes the
Job's delivery, and removes the marker if it still holds the stored claim (one Lua
script, so a newer claim's marker is never removed). Streams are thereby trimmed as
they are read; nothing accumulates.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from pydantic import ValidationError
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from app.dispatch.transport import Entry, GatewayTransport
from wire import keys
from wire.messages import (
    NODE_EVENT,
    RESULT_EVENT,
    Finished,
    Job,
    Marker,
    NodeReport,
    PoolUsage,
    Started,
    Stored,
)

log = logging.getLogger(__name__)

#: Results streams are capped (approximately) at this many entries.
STREAM_MAXLEN = 1_000_000
_READ_COUNT = 512

# KEYS: markers; ARGV: the claims they may hold. Deletes each marker still on its claim.
_RELEASE = """
for i, key in ipairs(KEYS) do
  local raw = redis.call('GET', key)
  if raw then
    local m = cjson.decode(raw)
    if m['claim'] == ARGV[i] then redis.call('DEL', key) end
  end
end
return 0
"""


class RedisGatewayTransport(GatewayTransport):
    def __init__(self, redis: Redis, *, dead_after_s: float, poll_s: float = 1.0) -> None:
        self._redis: Any = redis  # redis-py's stubs type replies as bytes | str | int
        self._dead_after_ms = int(dead_after_s * 1000)
        self._poll_ms = int(poll_s * 1000)
        self.gateway_id = f"gw-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self._release = redis.register_script(_RELEASE)
        self._groups: set[str] = set()

    async def close(self) -> None:
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(keys.gateway(self.gateway_id))
                await pipe.execute()
        except RedisError:
            pass

    async def ready(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except (RedisError, OSError):
            return False

    async def keep_alive(self) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(keys.gateway(self.gateway_id), str(time.time()), px=self._dead_after_ms)
            pipe.sadd(keys.GATEWAYS, self.gateway_id)
            await pipe.execute()

    # --- dispatch ---------------------------------------------------------------------
    async def dispatch(
        self, job: Job, *, node_id: str | None, hold_s: float, queue_s: float
    ) -> None:
        marker = Marker.placing(job, node_id=node_id, hold_s=hold_s)
        stream = marker.stream
        if stream not in self._groups:
            await self._ensure_group(stream, keys.NODE_GROUP)
        wait_ms = int((queue_s + job.deadline_seconds) * 1000)
        async with self._redis.pipeline(transaction=True) as pipe:
            # NOMKSTREAM: if the stream vanished since its group was made (Redis restarted
            # without persistence), make both again rather than a group-less stream.
            pipe.xadd(stream, {"job": job.model_dump_json()}, nomkstream=True)
            pipe.set(keys.inflight(job.invocation_id), marker.model_dump_json(), px=wait_ms)
            if node_id is None:  # the tenant's overflow queue: nodes take from it in turn
                pipe.sadd(keys.queues(job.runtime), job.tenant_id)
            entry_id = (await pipe.execute())[0]
        if entry_id is None:
            self._groups.discard(stream)
            await self._ensure_group(stream, keys.NODE_GROUP)
            await self._redis.xadd(stream, {"job": job.model_dump_json()})

    async def catalogue(self) -> list[NodeReport]:
        ids = sorted(await self._redis.smembers(keys.NODES))
        if not ids:
            return []
        values = await self._redis.mget([keys.node(i) for i in ids])
        reports = []
        for value in values:
            if value is None:
                continue
            try:
                reports.append(NodeReport.model_validate_json(value))
            except ValidationError:
                log.warning("ignoring a node report that does not parse: %.200s", value)
        return reports

    async def backlog(self, runtimes: Sequence[str]) -> dict[str, int]:
        streams = {runtime: await self._overflow(runtime) for runtime in runtimes}
        async with self._redis.pipeline(transaction=False) as pipe:
            for runtime in runtimes:
                for stream in streams[runtime]:
                    pipe.xlen(stream)
            lengths = iter(await pipe.execute())
        return {runtime: sum(int(next(lengths)) for _ in streams[runtime]) for runtime in runtimes}

    async def _overflow(self, runtime: str) -> list[str]:
        """The overflow streams of ``runtime``: one per tenant that queued work there."""
        tenants = await self._redis.smembers(keys.queues(runtime))
        return [keys.jobs(runtime, tenant) for tenant in sorted(tenants)]

    # --- recorder ---------------------------------------------------------------------
    async def results(self) -> AsyncIterator[list[Entry]]:
        streams = [keys.results(self.gateway_id), keys.EVENTS]
        for stream in streams:
            await self._ensure_group(stream, keys.RECORDER_GROUP)
        async for batch in self._read(streams, self.gateway_id, block=True):
            yield batch

    async def _read(
        self, streams: list[str], consumer: str, *, block: bool
    ) -> AsyncIterator[list[Entry]]:
        """Pending entries of ``consumer`` first, then new ones (blocking if asked)."""
        after = dict.fromkeys(streams, "0")
        while after:
            batches = await self._redis.xreadgroup(
                keys.RECORDER_GROUP, consumer, after, count=_READ_COUNT
            )
            entries: list[Entry] = []
            for stream, items in batches or []:
                if not items:
                    after.pop(stream, None)
                for entry_id, fields in items:
                    after[stream] = entry_id
                    entries.extend(await self._decode(stream, entry_id, fields))
            if not batches:
                break
            if entries:
                yield entries
        while True:
            try:
                batches = await self._redis.xreadgroup(
                    keys.RECORDER_GROUP,
                    consumer,
                    dict.fromkeys(streams, ">"),
                    count=_READ_COUNT,
                    block=self._poll_ms if block else None,
                )
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                log.warning("gateway %s: results streams vanished; recreating", self.gateway_id)
                for stream in streams:
                    await self._ensure_group(stream, keys.RECORDER_GROUP)
                continue
            entries = []
            for stream, items in batches or []:
                for entry_id, fields in items:
                    entries.extend(await self._decode(stream, entry_id, fields))
            if entries:
                yield entries
            elif not block:
                return

    async def _decode(
        self, stream: str, entry_id: str, fields: dict[str, Any] | None
    ) -> list[Entry]:
        raw = (fields or {}).get("event") or ""
        event: Started | Finished | Stored | PoolUsage
        try:
            if stream == keys.EVENTS:
                event = NODE_EVENT.validate_json(raw)
            else:
                event = RESULT_EVENT.validate_json(raw)
        except (ValidationError, TypeError, ValueError):
            log.error("stream %s entry %s: not an event; dropping it", stream, entry_id)
            await self._ack_delete([(stream, entry_id)], keys.RECORDER_GROUP)
            return []
        return [Entry(event=event, stream=stream, entry_id=entry_id)]

    async def settle(self, entries: Sequence[Entry]) -> None:
        if not entries:
            return
        markers: list[str] = []
        claims: list[str] = []
        async with self._redis.pipeline(transaction=False) as pipe:
            for entry in entries:
                pipe.xack(entry.stream, keys.RECORDER_GROUP, entry.entry_id)
                pipe.xdel(entry.stream, entry.entry_id)
                event = entry.event
                if isinstance(event, Finished):
                    if event.delivery.stream:
                        pipe.xack(event.delivery.stream, keys.NODE_GROUP, event.delivery.entry_id)
                        pipe.xdel(event.delivery.stream, event.delivery.entry_id)
                    markers.append(keys.inflight(event.invocation_id))
                    claims.append(event.claim)
            await pipe.execute()
        if markers:
            await self._release(keys=markers, args=claims)

    async def _ack_delete(self, items: Sequence[tuple[str, str]], group: str) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            for stream, entry_id in items:
                pipe.xack(stream, group, entry_id)
                pipe.xdel(stream, entry_id)
            await pipe.execute()

    # --- reconciler ---------------------------------------------------------------------
    async def markers(self, invocation_ids: Sequence[str]) -> dict[str, Marker]:
        found: dict[str, Marker] = {}
        ids = list(invocation_ids)
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            values = await self._redis.mget([keys.inflight(i) for i in chunk])
            for invocation_id, value in zip(chunk, values, strict=True):
                if value is not None:
                    found[invocation_id] = Marker.model_validate_json(value)
        return found

    async def notify(self, gateway_id: str, event: Stored) -> None:
        await self._redis.xadd(
            keys.results(gateway_id),
            {"event": event.model_dump_json()},
            maxlen=STREAM_MAXLEN,
            approximate=True,
        )

    async def dead_gateways(self) -> list[str]:
        return await self._silent(keys.GATEWAYS, keys.gateway)

    async def dead_nodes(self) -> list[str]:
        return await self._silent(keys.NODES, keys.node)

    async def _silent(self, members: str, liveness: Any) -> list[str]:
        ids = sorted(await self._redis.smembers(members))
        if not ids:
            return []
        values = await self._redis.mget([liveness(i) for i in ids])
        return [i for i, v in zip(ids, values, strict=True) if v is None]

    async def adopt(self, gateway_id: str) -> list[Entry]:
        stream = keys.results(gateway_id)
        await self._ensure_group(stream, keys.RECORDER_GROUP)
        # What the dead gateway read and never settled becomes this gateway's: on its
        # results stream, and on the shared events stream.
        entries: list[Entry] = []
        for source in (stream, keys.EVENTS):
            pending = await self._redis.xpending_range(
                source,
                keys.RECORDER_GROUP,
                min="-",
                max="+",
                count=_READ_COUNT,
                consumername=gateway_id,
            )
            if not pending:
                continue
            claimed = await self._redis.xclaim(
                source, keys.RECORDER_GROUP, self.gateway_id, 0, [p["message_id"] for p in pending]
            )
            for entry_id, fields in claimed:
                entries.extend(await self._decode(source, entry_id, fields))
        if entries:
            return entries
        async for batch in self._read([stream], self.gateway_id, block=False):
            return batch
        return []

    async def forget_gateway(self, gateway_id: str) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(keys.results(gateway_id))
            pipe.srem(keys.GATEWAYS, gateway_id)
            await pipe.execute()

    async def release(self, node_id: str, runtimes: Sequence[str]) -> int:
        moved = 0
        streams = [(r, s) for r in runtimes for s in await self._overflow(r)]
        for runtime, stream in streams:
            try:
                pending = await self._redis.xpending_range(
                    stream, keys.NODE_GROUP, "-", "+", 1000, consumername=node_id
                )
            except ResponseError:
                continue  # no such stream or group
            for entry in pending:
                entry_id = entry["message_id"]
                requeue = await self._unclaimed_job(stream, entry_id)
                async with self._redis.pipeline(transaction=True) as pipe:
                    if requeue is not None:
                        pipe.xadd(stream, {"job": requeue})
                        pipe.sadd(keys.queues(runtime), keys.tenant_of(stream))
                    pipe.xack(stream, keys.NODE_GROUP, entry_id)
                    pipe.xdel(stream, entry_id)
                    await pipe.execute()
                if requeue is not None:
                    moved += 1
                    log.warning(
                        "node %s died holding entry %s unclaimed: requeued", node_id, entry_id
                    )
        return moved

    async def _unclaimed_job(self, stream: str, entry_id: str) -> str | None:
        """The Job of an entry if its marker still waits for a claim of that Job's token."""
        entries = await self._redis.xrange(stream, entry_id, entry_id)
        if not entries:
            return None
        raw = entries[0][1].get("job")
        try:
            job = Job.model_validate_json(raw or "")
        except ValidationError:
            return None
        found = await self._redis.get(keys.inflight(job.invocation_id))
        marker = Marker.model_validate_json(found) if found else None
        if marker is None or marker.claim != job.claim or marker.claimed_by is not None:
            return None
        return str(raw)

    async def forget_node(self, node_id: str, runtimes: Sequence[str]) -> None:
        for stream in [s for runtime in runtimes for s in await self._overflow(runtime)]:
            try:
                pending = await self._redis.xpending_range(
                    stream, keys.NODE_GROUP, min="-", max="+", count=10_000, consumername=node_id
                )
            except ResponseError:
                continue  # no such stream or group
            if pending:
                await self._ack_delete(
                    [(stream, p["message_id"]) for p in pending], keys.NODE_GROUP
                )
            await self._redis.xgroup_delconsumer(stream, keys.NODE_GROUP, node_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(keys.jobs_for_node(node_id))
            pipe.srem(keys.NODES, node_id)
            await pipe.execute()

    async def _ensure_group(self, stream: str, group: str) -> None:
        try:
            await self._redis.xgroup_create(stream, group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        if group == keys.NODE_GROUP:
            self._groups.add(stream)
