"""In-process dispatch: the embedded default, gateway and node in one event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from app.dispatch.base import Delivery, Dispatcher, NodeInfo
from app.dispatch.messages import Completion, Job

_FORGET_AFTER_S = 300.0


class InProcessDispatcher(Dispatcher):
    def __init__(self) -> None:
        self.gateway_id = "local"
        self._queue: asyncio.Queue[Delivery] = asyncio.Queue()
        self._waiters: dict[str, asyncio.Future[Completion]] = {}
        self._nodes: dict[str, NodeInfo] = {}
        self._unacked: dict[str, dict[str, Delivery]] = {}

    async def close(self) -> None:
        for future in self._waiters.values():
            future.cancel()
        self._waiters.clear()

    async def ready(self) -> bool:
        return True

    async def submit(self, job: Job) -> None:
        self._waiters.setdefault(job.invocation_id, asyncio.get_running_loop().create_future())
        self._queue.put_nowait(Delivery(job=job, attempt=1))

    async def wait(self, invocation_id: str, timeout: float) -> Completion | None:
        future = self._waiters.setdefault(invocation_id, asyncio.get_running_loop().create_future())
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            return None
        finally:
            if future.done():
                self._waiters.pop(invocation_id, None)

    async def queue_depth(self) -> int:
        return self._queue.qsize()

    async def live_nodes(self) -> list[NodeInfo]:
        return list(self._nodes.values())

    async def register(self, node: NodeInfo) -> None:
        self._nodes[node.node_id] = node
        self._unacked.setdefault(node.node_id, {})

    async def unregister(self, node_id: str) -> None:
        self._nodes.pop(node_id, None)
        # Work a departing node never acked goes back on the queue, counted as a new attempt.
        for delivery in self._unacked.pop(node_id, {}).values():
            self._queue.put_nowait(Delivery(job=delivery.job, attempt=delivery.attempt + 1))

    async def deliveries(self, node: NodeInfo) -> AsyncIterator[Delivery]:
        while True:
            delivery = await self._queue.get()
            self._unacked.setdefault(node.node_id, {})[delivery.job.invocation_id] = delivery
            yield delivery

    async def ack(self, node_id: str, delivery: Delivery) -> None:
        self._unacked.get(node_id, {}).pop(delivery.job.invocation_id, None)

    async def complete(self, job: Job, completion: Completion) -> None:
        future = self._waiters.get(job.invocation_id)
        if future is not None and not future.done():
            future.set_result(completion)
            # Nobody may ever wait (asynchronous invocations): forget it after a while.
            asyncio.get_running_loop().call_later(
                _FORGET_AFTER_S, self._waiters.pop, job.invocation_id, None
            )
