"""The node agent: takes Jobs from dispatch, runs them on a backend, stores the result.

Order of a delivery, which is what makes an acknowledged result durable:

1. ``mark_running`` (attempt = delivery count). If the row is final already (a node
   stored it and died before acking), skip to 4.
2. Past ``max_attempts`` the invocation is failed as lost instead of run again.
3. Run on the backend; store the result and its usage in one transaction.
4. Ack the delivery, then publish the Completion to the waiting gateway.

A node that dies anywhere before 4 leaves the delivery pending; a live node reclaims
it. So every execution ends stored exactly once, and a re-run shows as ``attempts``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import async_sessionmaker

from app.db import invocations, nodes
from app.db.models import utcnow
from app.db.writer import BatchWriter
from app.dispatch.base import Delivery, Dispatcher, NodeInfo
from app.dispatch.messages import Completion, Job
from runtimes.base import Runtime
from runtimes.models import RunResult

if TYPE_CHECKING:
    from app.settings import Settings

log = logging.getLogger(__name__)

#: Results with at most this much output travel inside the Completion.
INLINE_RESULT_BYTES = 256 * 1024

#: Called with (runtime, status) after each stored result; the gateway counts metrics.
ResultHook = Callable[[str, str], None]


class NodeAgent:
    def __init__(
        self,
        settings: Settings,
        dispatcher: Dispatcher,
        sessions: async_sessionmaker[Any],
        writer: BatchWriter,
        runtimes: dict[str, Runtime],
        *,
        on_result: ResultHook | None = None,
    ) -> None:
        self.node_id = settings.resolved_node_id
        self._settings = settings
        self._dispatcher = dispatcher
        self._sessions = sessions
        self._writer = writer
        self.runtimes = runtimes
        self._on_result = on_result
        self._slots = asyncio.Semaphore(settings.node_slots)
        self._tasks: set[asyncio.Task[None]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self.info = NodeInfo(
            node_id=self.node_id,
            runtimes={
                name: [lang.name for lang in rt.languages()] for name, rt in runtimes.items()
            },
            slots=settings.node_slots,
        )

    async def start(self) -> None:
        for runtime in self.runtimes.values():
            await runtime.start()
        await self._heartbeat_once()
        self._loops = [
            asyncio.create_task(self._consume(), name=f"node-{self.node_id}-consume"),
            asyncio.create_task(self._heartbeat(), name=f"node-{self.node_id}-heartbeat"),
        ]
        log.info("node %s: up with runtimes %s", self.node_id, self.info.runtimes)

    async def close(self, *, drain_seconds: float = 10.0) -> None:
        """Stop taking work, let running executions finish, release the backends."""
        for task in self._loops:
            task.cancel()
        for task in self._loops:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._loops = []
        if self._tasks:
            _done, pending = await asyncio.wait(self._tasks, timeout=drain_seconds)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._dispatcher.unregister(self.node_id)
        with contextlib.suppress(Exception):
            async with self._sessions.begin() as session:
                await nodes.heartbeat(
                    session,
                    node_id=self.node_id,
                    runtimes=self.info.runtimes,
                    slots=self.info.slots,
                    state="down",
                )
        for runtime in self.runtimes.values():
            try:
                await runtime.close()
            except Exception:
                log.exception("node %s: closing runtime %s failed", self.node_id, runtime.name)
        log.info("node %s: down", self.node_id)

    def stats(self) -> dict[str, dict[str, int]]:
        return {name: rt.stats() for name, rt in self.runtimes.items()}

    # --- loops --------------------------------------------------------------------------
    async def _consume(self) -> None:
        while True:
            try:
                deliveries = self._dispatcher.deliveries(self.info)
                while True:
                    await self._slots.acquire()
                    try:
                        delivery = await anext(deliveries)
                    except BaseException:
                        self._slots.release()
                        raise
                    task = asyncio.create_task(self._handle(delivery))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("node %s: dispatch failed; reconnecting", self.node_id)
                await asyncio.sleep(0.5)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self._settings.heartbeat_seconds)
            try:
                await self._heartbeat_once()
            except Exception:
                log.exception("node %s: heartbeat failed", self.node_id)

    async def _heartbeat_once(self) -> None:
        await self._dispatcher.register(self.info)
        async with self._sessions.begin() as session:
            await nodes.heartbeat(
                session, node_id=self.node_id, runtimes=self.info.runtimes, slots=self.info.slots
            )

    # --- one delivery -------------------------------------------------------------------
    async def _handle(self, delivery: Delivery) -> None:
        job = delivery.job
        try:
            completion = await self._execute(job, delivery.attempt)
            await self._dispatcher.ack(self.node_id, delivery)
            await self._dispatcher.complete(job, completion)
        except asyncio.CancelledError:
            log.warning("invocation %s: cancelled on node %s", job.invocation_id, self.node_id)
            raise
        except Exception:
            # Not acked: the delivery stays pending and a live node will take it over.
            log.exception(
                "invocation %s: node %s failed to finish it", job.invocation_id, self.node_id
            )
        finally:
            self._slots.release()

    async def _execute(self, job: Job, attempt: int) -> Completion:
        inv = job.invocation_id
        started_at = utcnow()
        queue_ms = max(0.0, (time.time() - job.enqueued_at) * 1000)
        if attempt > self._settings.max_attempts:
            reason = (
                f"lost: delivered {attempt - 1} times to nodes that died before finishing it; "
                "not run again"
            )
            log.error("invocation %s: %s", inv, reason)
            await self._writer.write(
                invocations.Fail(
                    invocation_id=inv,
                    tenant_id=job.tenant_id,
                    kind=job.kind,
                    error=reason,
                    node_id=self.node_id,
                )
            )
            return await self._final_status(job)

        running = invocations.MarkRunning(
            invocation_id=inv, node_id=self.node_id, attempt=attempt, started_at=started_at
        )
        if attempt == 1:
            # A first delivery cannot find its row final: mark it running without waiting.
            self._writer.post(running, what=f"invocation {inv} running")
        elif not await self._writer.write(running):
            log.info("invocation %s: already final; acking delivery %d", inv, attempt)
            return await self._final_status(job)
        else:
            log.warning(
                "invocation %s: running again on %s (attempt %d)", inv, self.node_id, attempt
            )
        result = await self._run(job)
        status = await self._writer.write(
            invocations.Finish(
                invocation_id=inv,
                tenant_id=job.tenant_id,
                kind=job.kind,
                node_id=self.node_id,
                attempt=attempt,
                result=result,
                queue_ms=queue_ms,
                started_at=started_at,
            )
        )
        if status is None:
            return await self._final_status(job)
        if self._on_result is not None:
            self._on_result(job.runtime, str(status))
        log.info("invocation %s: %s on %s (attempt %d)", inv, status, self.node_id, attempt)
        return Completion(
            invocation_id=inv,
            status=str(status),
            attempt=attempt,
            error=result.error,
            queue_ms=queue_ms,
            result=result if _output_size(result) <= INLINE_RESULT_BYTES else None,
        )

    async def _run(self, job: Job) -> RunResult:
        runtime = self.runtimes.get(job.runtime)
        if runtime is None:
            return RunResult(error=f"node {self.node_id} has no runtime {job.runtime!r}")
        try:
            return await runtime.run(
                job.spec, tenant_id=job.tenant_id, invocation_id=job.invocation_id
            )
        except Exception as exc:
            log.exception("invocation %s: runtime %s raised", job.invocation_id, job.runtime)
            return RunResult(error=f"runtime {job.runtime} failed: {type(exc).__name__}")

    async def _final_status(self, job: Job) -> Completion:
        """The Completion for a row another attempt already finished (read it back)."""
        async with self._sessions() as session:
            row = await invocations.get(
                session, tenant_id=job.tenant_id, invocation_id=job.invocation_id
            )
            return Completion(
                invocation_id=row.id, status=row.status, attempt=row.attempts, error=row.error
            )


def _output_size(result: RunResult) -> int:
    stages = [s for s in (result.compile, result.run) if s is not None]
    return sum(len(s.stdout) + len(s.stderr) for s in stages) + sum(
        len(v) for v in result.files.values()
    )
