"""The gateway's half of an execution: admit, record, dispatch, wait, answer.

1. Check the requested limits against the tenant's quota (422 ``limit_too_high``).
2. Find a runtime that a live node offers for the language (400/503 otherwise).
3. Under admission control, insert the invocation row (committed: from here on the
   execution is never lost), submit the Job, and wait for the node's Completion.
4. If no Completion arrives in time, read the row: it may be final already; if not,
   answer 504 ``execution_timeout`` naming the invocation, whose result will be stored.

``submit`` is the asynchronous variant: steps 1-3 (admission included), then the queued
row is returned at once and a background task holds the admission slot until the node's
Completion arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker

from app.auth.principal import Principal
from app.db import invocations
from app.db.models import Invocation
from app.db.writer import BatchWriter
from app.dispatch.base import Dispatcher
from app.dispatch.messages import Completion, Job
from app.errors import ExecutionTimeout, LimitTooHigh, NoCapacity, UnsupportedRuntime
from app.ids import new_id
from app.metrics import Metrics
from app.quotas.admission import Admission
from runtimes.models import RunResult, RunSpec

log = logging.getLogger(__name__)

_NODE_CACHE_S = 1.0


class Executor:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[Any],
        writer: BatchWriter,
        dispatcher: Dispatcher,
        admission: Admission,
        metrics: Metrics,
        wait_grace_s: float,
    ) -> None:
        self._sessions = sessions
        self._writer = writer
        self._dispatcher = dispatcher
        self._admission = admission
        self._metrics = metrics
        self._grace_s = wait_grace_s
        self._nodes_read_at = -1e9
        self._languages: dict[str, str] = {}  # language -> runtime offering it
        self._background: set[asyncio.Task[None]] = set()  # asynchronous invocations

    async def run(
        self,
        principal: Principal,
        spec: RunSpec,
        *,
        kind: str = "run",
        function_version_id: str | None = None,
        record: dict[str, Any] | None = None,
    ) -> tuple[Invocation, RunResult | None]:
        """Run ``spec`` for ``principal``; the stored row and, if it came inline, the result.

        ``record`` is what the invocation row keeps of the request (default: the spec
        without file contents).
        """
        runtime, wall = await self._check(principal, spec)
        async with self._admission.admit(principal.tenant_id, principal.quota, wall_seconds=wall):
            row, job = await self._dispatch(
                principal, spec, runtime, kind, function_version_id, record
            )
            completion = await self._dispatcher.wait(row.id, job.deadline_seconds + self._grace_s)
        return await self._answer(principal, row, completion)

    async def submit(
        self,
        principal: Principal,
        spec: RunSpec,
        *,
        kind: str = "run",
        function_version_id: str | None = None,
        record: dict[str, Any] | None = None,
    ) -> Invocation:
        """Start ``spec`` and return its queued row at once (asynchronous invocation).

        Admission happens here, so a refusal (429) is still the caller's answer. The
        concurrency slot is then handed to a background task that holds it until the
        node's Completion arrives (or the deadline passes); the result itself is stored
        by the node, so nothing is lost if this process goes away: the slot's lease
        expires on its own.
        """
        runtime, wall = await self._check(principal, spec)
        slot = self._admission.admit(principal.tenant_id, principal.quota, wall_seconds=wall)
        await slot.__aenter__()
        try:
            row, job = await self._dispatch(
                principal, spec, runtime, kind, function_version_id, record
            )
        except BaseException as exc:
            await slot.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        task = asyncio.create_task(
            self._hold(slot, row, job.deadline_seconds + self._grace_s),
            name=f"corral-async-{row.id}",
        )
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return row

    async def _hold(
        self, slot: contextlib.AbstractAsyncContextManager[float], row: Invocation, timeout: float
    ) -> None:
        """Keep an asynchronous invocation's admission slot until it completes."""
        try:
            completion = await self._dispatcher.wait(row.id, timeout)
            if completion is not None:
                self._metrics.invocations.labels(row.kind, completion.status).inc()
            else:
                log.info("async invocation %s: no completion in %.0fs", row.id, timeout)
        except Exception:
            log.exception("async invocation %s: waiting for its completion failed", row.id)
        finally:
            await slot.__aexit__(None, None, None)

    async def _check(self, principal: Principal, spec: RunSpec) -> tuple[str, float]:
        """Limits against the quota, and the runtime for the language; (runtime, wall s)."""
        quota = principal.quota
        limits = spec.limits
        if limits.memory_mb > quota.max_memory_mb:
            raise LimitTooHigh(
                f"memory_limit_mb {limits.memory_mb} is over the tenant's max_memory_mb "
                f"{quota.max_memory_mb}"
            )
        wall = limits.compile_timeout_s + limits.run_timeout_s
        if limits.run_timeout_s > quota.max_wall_seconds:
            raise LimitTooHigh(
                f"run_timeout {limits.run_timeout_s}s is over the tenant's max_wall_seconds "
                f"{quota.max_wall_seconds}s"
            )
        return await self.runtime_for(spec.language), wall

    async def _dispatch(
        self,
        principal: Principal,
        spec: RunSpec,
        runtime: str,
        kind: str,
        function_version_id: str | None,
        record: dict[str, Any] | None,
    ) -> tuple[Invocation, Job]:
        """Insert the queued row (committed), then submit the Job."""
        invocation_id = new_id("inv")
        request = record if record is not None else _request_record(spec)
        row: Invocation = await self._writer.write(
            invocations.Create(
                invocation_id=invocation_id,
                tenant_id=principal.tenant_id,
                kind=kind,
                runtime=runtime,
                language=spec.language,
                request=request,
                function_version_id=function_version_id,
            )
        )
        job = Job(
            invocation_id=invocation_id,
            tenant_id=principal.tenant_id,
            kind=kind,
            runtime=runtime,
            spec=spec,
            reply_to=self._dispatcher.gateway_id,
            enqueued_at=time.time(),
        )
        await self._dispatcher.submit(job)
        return row, job

    async def _answer(
        self, principal: Principal, row: Invocation, completion: Completion | None
    ) -> tuple[Invocation, RunResult | None]:
        if completion is not None and completion.result is not None:
            _apply(row, completion, completion.result)
            self._metrics.invocations.labels(row.kind, row.status).inc()
            return row, completion.result
        async with self._sessions() as session:
            stored = await invocations.get(
                session, tenant_id=principal.tenant_id, invocation_id=row.id
            )
        if stored.status in invocations.OPEN:
            log.warning("invocation %s: no result in time; still %s", row.id, stored.status)
            raise ExecutionTimeout(
                f"invocation {row.id} did not finish in time; poll /v1/invocations/{row.id}",
                details={"invocation_id": row.id},
            )
        self._metrics.invocations.labels(stored.kind, stored.status).inc()
        return stored, None

    async def runtime_for(self, language: str) -> str:
        now = time.monotonic()
        if now - self._nodes_read_at > _NODE_CACHE_S or language not in self._languages:
            nodes = await self._dispatcher.live_nodes()
            self._nodes_read_at = now
            self._languages = {
                lang: runtime
                for node in nodes
                for runtime, langs in sorted(node.runtimes.items())
                for lang in langs
            }
            if not nodes:
                raise NoCapacity("no node agent is alive")
        try:
            return self._languages[language]
        except KeyError:
            offered = ", ".join(sorted(self._languages)) or "none"
            raise UnsupportedRuntime(
                f"no node runs language {language!r} (offered: {offered})"
            ) from None

    async def languages(self) -> dict[str, str]:
        nodes = await self._dispatcher.live_nodes()
        return {
            lang: runtime
            for node in nodes
            for runtime, langs in sorted(node.runtimes.items())
            for lang in langs
        }


def _apply(row: Invocation, completion: Completion, result: RunResult) -> None:
    """Fill the in-memory row from an inline Completion (what the node stored)."""
    row.status = completion.status
    row.error = completion.error
    row.attempts = completion.attempt
    row.queue_ms = completion.queue_ms
    row.setup_ms, row.exec_ms, row.teardown_ms = result.setup_ms, result.exec_ms, result.teardown_ms
    row.cpu_ms, row.peak_memory_kb = result.cpu_ms, result.peak_memory_kb


def _request_record(spec: RunSpec) -> dict[str, Any]:
    """What is kept of the request: everything but file contents (names and sizes only)."""
    record = spec.model_dump(mode="json", exclude={"files"})
    record["files"] = {name: len(content) for name, content in spec.files.items()}
    return record
