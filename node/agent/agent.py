"""The node agent: takes Jobs, claims them, runs them on a backend, reports the outcome.

What a node does with one delivery:

1. **Claim** the Job's token (``NodeTransport.claim``). Only the current token of an
   execution can be claimed, and only by one node; the claim publishes ``Started``.
   Any other outcome: drop the delivery without running it.
2. Run the Job on the backend registered under its runtime's name.
3. **Finish**: publish ``Finished`` (the result) to the recorder of the Job's gateway,
   retrying until it is accepted. The recorder stores it and only then acknowledges the
   delivery; if this node dies first, the control plane's reconciler hands the execution
   out again under a new token (and counts it in ``attempts``).

The agent also announces the node (liveness, free slots, memory and warm inventory for
placement) every ``heartbeat_seconds`` through the transport, never through a database,
and reports the idle capacity its warm pools held. It never reads or writes the
database: results reach it only through the recorder.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from node.agent.memory import MemoryGuard
from node.agent.metrics import NodeMetrics
from node.agent.transport import Claim, Delivery, NodeTransport
from node.fncall.base import FnBackend
from node.settings import NodeSettings
from wire.execution import RunResult
from wire.messages import Finished, NodeReport, PoolUsage, Started

if TYPE_CHECKING:
    from node.sandboxes.manager import SandboxManager

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Longest pause between two retries of a transport call.
MAX_BACKOFF_S = 1.0
#: How often the idle capacity of the warm pools is reported.
USAGE_PERIOD_S = 60.0


class NodeAgent:
    def __init__(
        self,
        settings: NodeSettings,
        transport: NodeTransport,
        backends: dict[str, FnBackend],
        *,
        metrics: NodeMetrics | None = None,
        usage_period_s: float = USAGE_PERIOD_S,
        memory: MemoryGuard | None = None,
    ) -> None:
        self.node_id = settings.resolved_node_id
        self.incarnation = secrets.token_hex(6)
        self.settings = settings
        self.transport = transport
        self.backends = backends
        self.metrics = metrics or NodeMetrics()
        self.address: str | None = None  #: set by the node's HTTP listener, when it has one
        self.sandboxes: SandboxManager | None = None  #: set when the node has sandbox backends
        self._usage_period_s = usage_period_s
        self._slots = asyncio.Semaphore(settings.node_slots)
        self.memory = memory or MemoryGuard(settings.memory_reserve_mb)
        self._busy = 0
        self._memory_mb = settings.resolved_memory_mb
        self._memory_used_mb = 0
        self._started_at = time.time()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._consuming = False
        self.metrics.gauge(
            "corral_pool_workers",
            "Warm-pool workers on this node by runtime and state.",
            ["runtime", "state"],
            lambda: {
                (name, state): float(n)
                for name, rt in self.backends.items()
                for state, n in rt.stats().items()
            },
        )
        self.metrics.gauge(
            "corral_node_slots",
            "Execution slots of this node: total and busy.",
            ["state"],
            lambda: {("total",): float(settings.node_slots), ("busy",): float(self._busy)},
        )
        self.metrics.gauge(
            "corral_node_memory_held_seconds",
            "Seconds this node held new work back because the host was short of memory.",
            [],
            lambda: {(): self.memory.held_seconds},
        )

    # --- life cycle ---------------------------------------------------------------------
    async def start(self) -> None:
        for backend in self.backends.values():
            await backend.start()
        await self._retry("announce", lambda: self.transport.announce(self.report()))
        self._loops = [
            asyncio.create_task(self._consume(), name=f"node-{self.node_id}-consume"),
            asyncio.create_task(self._heartbeat(), name=f"node-{self.node_id}-heartbeat"),
            asyncio.create_task(self._report_usage(), name=f"node-{self.node_id}-usage"),
        ]
        log.info(
            "node %s (incarnation %s): up with runtimes %s",
            self.node_id,
            self.incarnation,
            self.runtimes(),
        )

    async def close(self) -> None:
        """Stop taking work, let running executions finish, release the backends."""
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        self._loops = []
        if self._tasks:
            _done, pending = await asyncio.wait(self._tasks, timeout=self.settings.drain_seconds)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._publish_usage()
        with contextlib.suppress(Exception):
            await self.transport.withdraw(self.node_id)
        for backend in self.backends.values():
            try:
                await backend.close()
            except Exception:
                log.exception("node %s: closing runtime %s failed", self.node_id, backend.name)
        log.info("node %s: down", self.node_id)

    @property
    def healthy(self) -> bool:
        """The work loop runs (the transport's health is checked separately)."""
        return bool(self._loops) and not any(task.done() for task in self._loops)

    def runtimes(self) -> dict[str, list[str]]:
        return {name: [lang.name for lang in rt.languages()] for name, rt in self.backends.items()}

    def report(self, waiting: int = 0) -> NodeReport:
        """This node's entry in the catalogue; ``waiting`` Jobs placed on it and not taken
        yet count as busy slots."""
        warm: dict[str, int] = {}
        pools: dict[str, dict[str, int]] = {}
        for name, backend in self.backends.items():
            warm.update(backend.inventory())
            pools[name] = backend.stats()
        capacity: dict[str, Any] = {}
        if self.sandboxes is not None:
            warm.update(self.sandboxes.warm_inventory())
            pools["sandboxes"] = self.sandboxes.pool_stats()
            held = self.sandboxes.capacity()
            capacity = {
                "sandbox_memory_mb": held.memory_mb,
                "sandbox_memory_free_mb": held.memory_free_mb,
                "sandbox_cpu": held.cpu,
                "sandbox_cpu_free": held.cpu_free,
            }
        return NodeReport(
            node_id=self.node_id,
            incarnation=self.incarnation,
            address=self.address,
            runtimes=self.runtimes(),
            slots=self.settings.node_slots,
            slots_free=max(0, self.settings.node_slots - self._busy - waiting),
            memory_mb=self._memory_mb,
            memory_free_mb=max(
                0,
                min(
                    self._memory_mb - self._memory_used_mb,
                    self.memory.available_mb() - self.memory.reserve_mb,
                ),
            ),
            warm=warm,
            pools=pools,
            sandboxes=self.sandboxes.live_count() if self.sandboxes is not None else 0,
            sandbox_backends=sorted(self.sandboxes.backends) if self.sandboxes is not None else [],
            sandbox_accelerators=(
                self.sandboxes.accelerators() if self.sandboxes is not None else {}
            ),
            sandbox_room=self.sandboxes.room() if self.sandboxes is not None else 0,
            **capacity,
            started_at=self._started_at,
            reported_at=time.time(),
        )

    # --- loops --------------------------------------------------------------------------
    async def _consume(self) -> None:
        runtimes = sorted(self.backends)
        while True:
            try:
                deliveries = self.transport.deliveries(
                    self.node_id, runtimes, lambda: self.settings.node_slots - self._busy
                )
                try:
                    while True:
                        # A free slot first, then the next Job: the choice of what runs
                        # next is made when it can run, with every tenant's work in view.
                        await self._slots.acquire()
                        try:
                            await self.memory.room()
                            delivery = await anext(deliveries)
                        except BaseException:
                            self._slots.release()
                            raise
                        self._busy += 1
                        task = asyncio.create_task(
                            self._handle(delivery), name=f"inv-{delivery.job.invocation_id}"
                        )
                        self._tasks.add(task)
                        task.add_done_callback(self._tasks.discard)
                finally:
                    await deliveries.aclose()  # type: ignore[attr-defined]
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("node %s: taking work failed (%r); retrying", self.node_id, exc)
                await asyncio.sleep(0.5)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_seconds)
            try:
                waiting = await self.transport.waiting(self.node_id)
                await self.transport.announce(self.report(waiting))
            except Exception as exc:
                log.warning("node %s: heartbeat failed: %r", self.node_id, exc)

    async def _report_usage(self) -> None:
        while True:
            await asyncio.sleep(self._usage_period_s)
            try:
                await self._publish_usage()
            except Exception as exc:
                log.warning("node %s: reporting pool usage failed: %r", self.node_id, exc)

    async def _publish_usage(self) -> None:
        now = time.time()
        for backend in self.backends.values():
            for pool, idle in backend.idle_capacity().items():
                self.metrics.idle_instance_seconds.labels(pool).inc(idle.instance_seconds)
                self.metrics.idle_memory_mb_seconds.labels(pool).inc(idle.memory_mb_seconds)
                self.metrics.pool_starts.labels(pool, "no").inc(idle.starts - idle.cold_starts)
                self.metrics.pool_starts.labels(pool, "yes").inc(idle.cold_starts)
                if not (idle.instance_seconds or idle.starts):
                    continue
                await self.transport.publish(
                    PoolUsage(
                        node_id=self.node_id,
                        pool=pool,
                        period_start=now - self._usage_period_s,
                        period_end=now,
                        idle_instance_seconds=idle.instance_seconds,
                        idle_memory_mb_seconds=idle.memory_mb_seconds,
                        starts=idle.starts,
                        cold_starts=idle.cold_starts,
                        start_cpu_ms=idle.start_cpu_ms,
                    )
                )

    # --- one delivery -------------------------------------------------------------------
    async def _handle(self, delivery: Delivery) -> None:
        job = delivery.job
        inv = job.invocation_id
        memory = job.spec.limits.memory_mb
        try:
            started = Started(
                invocation_id=inv, claim=job.claim, node_id=self.node_id, started_at=time.time()
            )
            claim = await self._retry(
                "claim",
                lambda: self.transport.claim(delivery, started, incarnation=self.incarnation),
                give_up_after=self.settings.node_dead_after_seconds,
            )
            self.metrics.claims.labels(claim.value).inc()
            if claim is not Claim.OK:
                log.info(
                    "inv=%s claim %s on %s: %s; not running it", inv, job.claim, self.node_id, claim
                )
                await self._retry("drop", lambda: self.transport.drop(delivery))
                return
            self._memory_used_mb += memory
            try:
                result = await self._run(delivery)
            finally:
                self._memory_used_mb -= memory
            self.metrics.executions.labels(job.runtime, result.outcome).inc()
            finished = Finished(
                invocation_id=inv,
                claim=job.claim,
                attempt=job.attempt,
                node_id=self.node_id,
                started_at=started.started_at,
                finished_at=time.time(),
                queue_ms=max(0.0, (started.started_at - job.enqueued_at) * 1000),
                result=result,
                delivery=delivery.ref,
            )
            await self._retry("finish", lambda: self.transport.finish(delivery, finished))
            log.debug(
                "inv=%s %s on %s (attempt %d)", inv, result.outcome, self.node_id, job.attempt
            )
        except asyncio.CancelledError:
            log.warning(
                "inv=%s cancelled on node %s; it will be handed out again", inv, self.node_id
            )
            raise
        except TimeoutError:
            log.error("inv=%s transport unreachable; left for the reconciler", inv)
        finally:
            self._busy -= 1
            self._slots.release()

    async def _run(self, delivery: Delivery) -> RunResult:
        job = delivery.job
        backend = self.backends.get(job.runtime)
        if backend is None:
            return RunResult(error=f"node {self.node_id} has no runtime {job.runtime!r}")
        try:
            result = await backend.run(
                job.spec, tenant_id=job.tenant_id, invocation_id=job.invocation_id
            )
        except Exception as exc:
            log.exception("inv=%s runtime %s raised", job.invocation_id, job.runtime)
            return RunResult(error=f"runtime {job.runtime} failed: {type(exc).__name__}")
        return result  # each backend judges contention (``StageResult.judge_contention``)

    async def _retry(
        self,
        operation: str,
        call: Callable[[], Awaitable[T]],
        *,
        give_up_after: float | None = None,
    ) -> T:
        """Run a transport call until it succeeds (backing off); TimeoutError after
        ``give_up_after`` seconds, if given."""
        deadline = None if give_up_after is None else time.monotonic() + give_up_after
        delay = 0.05
        while True:
            try:
                return await call()
            except Exception as exc:
                if deadline is not None and time.monotonic() + delay > deadline:
                    raise TimeoutError(f"{operation}: {exc!r}") from exc
                self.metrics.transport_retries.labels(operation).inc()
                log.warning("node %s: %s failed (%r); retrying", self.node_id, operation, exc)
                await asyncio.sleep(delay)
                delay = min(MAX_BACKOFF_S, delay * 2)
