"""Redis Streams dispatch: many gateways, many nodes.

Jobs go on one stream per runtime (``keys.jobs``), read by the ``corral-nodes``
consumer group, each node a consumer named by its node id. A node acks (XACK, XDEL)
only after the result is in the database. Entries left pending by a node whose
liveness key has expired are XCLAIMed by a live node; ``min-idle-time`` makes two
claimers race safely (the loser's claim finds the entry freshly idle and gets nothing).
The delivery count Redis keeps becomes the invocation's ``attempts``.

Completions go back on the gateway's own reply stream (``keys.replies``), read by
one background task per gateway that resolves the waiting requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from app.dispatch import keys
from app.dispatch.base import Delivery, Dispatcher, NodeInfo
from app.dispatch.messages import Completion, Job

log = logging.getLogger(__name__)

_REPLY_STREAM_MAXLEN = 100_000
_REPLY_STREAM_TTL_S = 24 * 3600
_CLAIM_MIN_IDLE_MS = 200


class RedisStreamsDispatcher(Dispatcher):
    def __init__(
        self,
        redis: Redis,
        *,
        runtimes: list[str],
        node_dead_after_s: float,
        poll_s: float = 1.0,
    ) -> None:
        self._redis: Any = redis  # redis-py's stubs type replies as bytes | str | int
        self._runtimes = runtimes
        self._dead_after_s = node_dead_after_s
        self._poll_ms = int(poll_s * 1000)
        self.gateway_id = f"gw-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self._waiters: dict[str, asyncio.Future[Completion]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._groups_made: set[str] = set()

    # --- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        self._reader = asyncio.create_task(self._read_replies(), name="corral-reply-reader")

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            self._reader = None
        for future in self._waiters.values():
            future.cancel()
        self._waiters.clear()
        with contextlib.suppress(RedisError):
            await self._redis.delete(keys.replies(self.gateway_id))

    async def ready(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except (RedisError, OSError):
            return False

    # --- gateway side -------------------------------------------------------------------
    async def submit(self, job: Job) -> None:
        await self._ensure_group(job.runtime)
        self._waiters.setdefault(job.invocation_id, asyncio.get_running_loop().create_future())
        # NOMKSTREAM: if the stream vanished since the group was made (Redis restarted
        # without persistence), re-create stream and group rather than a group-less stream.
        if (
            await self._redis.xadd(
                keys.jobs(job.runtime), {"job": job.model_dump_json()}, nomkstream=True
            )
            is None
        ):
            self._groups_made.discard(job.runtime)
            await self._ensure_group(job.runtime)
            await self._redis.xadd(keys.jobs(job.runtime), {"job": job.model_dump_json()})

    async def wait(self, invocation_id: str, timeout: float) -> Completion | None:
        future = self._waiters.setdefault(invocation_id, asyncio.get_running_loop().create_future())
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            return None
        finally:
            self._waiters.pop(invocation_id, None)

    async def queue_depth(self) -> int:
        total = 0
        for runtime in self._runtimes:
            total += int(await self._redis.xlen(keys.jobs(runtime)))
        return total

    async def live_nodes(self) -> list[NodeInfo]:
        ids = sorted(await self._redis.smembers(keys.NODES))
        if not ids:
            return []
        values = await self._redis.mget([keys.node(i) for i in ids])
        nodes = []
        for node_id, value in zip(ids, values, strict=True):
            if value is None:
                continue
            data = json.loads(value)
            nodes.append(NodeInfo(node_id, data["runtimes"], int(data["slots"])))
        return nodes

    async def _read_replies(self) -> None:
        stream = keys.replies(self.gateway_id)
        last_id = "$"
        while True:
            try:
                batches = await self._redis.xread({stream: last_id}, block=self._poll_ms)
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError):
                log.exception("gateway %s: reading replies failed; retrying", self.gateway_id)
                await asyncio.sleep(0.5)
                continue
            for _stream, entries in batches or []:
                for entry_id, fields in entries:
                    last_id = entry_id
                    completion = Completion.model_validate_json(fields["completion"])
                    future = self._waiters.get(completion.invocation_id)
                    if future is not None and not future.done():
                        future.set_result(completion)

    # --- node side ----------------------------------------------------------------------
    async def register(self, node: NodeInfo) -> None:
        info = json.dumps({"runtimes": node.runtimes, "slots": node.slots})
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(keys.node(node.node_id), info, px=int(self._dead_after_s * 1000))
            pipe.sadd(keys.NODES, node.node_id)
            await pipe.execute()

    async def unregister(self, node_id: str) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(keys.node(node_id))
            pipe.srem(keys.NODES, node_id)
            await pipe.execute()

    async def deliveries(self, node: NodeInfo) -> AsyncIterator[Delivery]:
        streams = [keys.jobs(runtime) for runtime in node.runtimes]
        while True:
            for runtime in node.runtimes:
                await self._ensure_group(runtime)
            try:
                for stream in streams:
                    async for delivery in self._reclaim(stream, node.node_id):
                        yield delivery
                batches = await self._redis.xreadgroup(
                    keys.NODE_GROUP,
                    node.node_id,
                    dict.fromkeys(streams, ">"),
                    count=1,
                    block=self._poll_ms,
                )
            except ResponseError as exc:
                # The stream or group is gone (Redis restarted without persistence, or
                # someone deleted the key): make them again rather than fail forever.
                if "NOGROUP" not in str(exc) and "no longer exists" not in str(exc):
                    raise
                log.warning("node %s: job streams vanished (%s); recreating", node.node_id, exc)
                self._groups_made.clear()
                continue
            for stream, entries in batches or []:
                for entry_id, fields in entries:
                    fresh = await self._decode(stream, entry_id, fields, attempt=1)
                    if fresh is not None:
                        yield fresh

    async def ack(self, node_id: str, delivery: Delivery) -> None:
        stream = keys.jobs(delivery.job.runtime)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xack(stream, keys.NODE_GROUP, delivery.token)
            pipe.xdel(stream, delivery.token)
            await pipe.execute()

    async def complete(self, job: Job, completion: Completion) -> None:
        stream = keys.replies(job.reply_to)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.xadd(
                stream,
                {"completion": completion.model_dump_json()},
                maxlen=_REPLY_STREAM_MAXLEN,
                approximate=True,
            )
            pipe.expire(stream, _REPLY_STREAM_TTL_S)
            await pipe.execute()

    async def _reclaim(self, stream: str, node_id: str) -> AsyncIterator[Delivery]:
        """Take over entries pending on consumers whose liveness key has expired."""
        pending = await self._redis.xpending_range(
            stream, keys.NODE_GROUP, min="-", max="+", count=100
        )
        if not pending:
            return
        owners = {p["consumer"] for p in pending if p["consumer"] != node_id}
        if not owners:
            return
        alive = await self._redis.mget([keys.node(owner) for owner in sorted(owners)])
        dead = {o for o, v in zip(sorted(owners), alive, strict=True) if v is None}
        for entry in pending:
            if entry["consumer"] not in dead:
                continue
            claimed = await self._redis.xclaim(
                stream, keys.NODE_GROUP, node_id, _CLAIM_MIN_IDLE_MS, [entry["message_id"]]
            )
            for entry_id, fields in claimed:
                if fields is None:  # deleted meanwhile
                    continue
                attempt = int(entry["times_delivered"]) + 1
                log.warning(
                    "invocation entry %s: reclaimed from dead node %s (attempt %d)",
                    entry_id,
                    entry["consumer"],
                    attempt,
                )
                delivery = await self._decode(stream, entry_id, fields, attempt=attempt)
                if delivery is not None:
                    yield delivery

    async def _decode(
        self, stream: str, entry_id: str, fields: dict[str, Any], *, attempt: int
    ) -> Delivery | None:
        """The Delivery of an entry; an entry that is not a Job is dropped, not retried."""
        try:
            job = Job.model_validate_json(fields["job"])
        except (KeyError, ValueError):
            log.error("stream %s entry %s: not a Job; dropping it", stream, entry_id)
            await self._redis.xack(stream, keys.NODE_GROUP, entry_id)
            await self._redis.xdel(stream, entry_id)
            return None
        return Delivery(job=job, attempt=attempt, token=entry_id)

    async def _ensure_group(self, runtime: str) -> None:
        if runtime in self._groups_made:
            return
        try:
            await self._redis.xgroup_create(
                keys.jobs(runtime), keys.NODE_GROUP, id="0", mkstream=True
            )
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._groups_made.add(runtime)
