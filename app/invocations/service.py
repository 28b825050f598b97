"""The gateway's half of an execution: admit, record, dispatch, wait, answer.

1. The language must be offered by a live node (400 ``unsupported_runtime``, 503
   ``no_capacity``); the caller's limits were checked against the quota already
   (``app.invocations.limits``).
2. Under admission control, place the execution (``app.placement``), then **insert the
   row with its dispatch intent** (the Job, claim token and all) in one committed
   write: from here on the execution is never lost. A connection lost during that
   commit leaves its outcome unknown; the row is then written again only if absent,
   until the database answers (``_record``), so the answer never says "not recorded"
   of a row that was. Then dispatch the Job. If the dispatch fails, or this process
   dies before it, the reconciler sends the Job from the row.
3. Wait for this gateway's recorder to store the node's result: the answer is the
   stored row, built from exactly what was written, whatever the output's size.
4. If nothing was stored in time, read the row: it may be final already (another
   gateway's reconciler stored it); if not, answer 504 ``execution_timeout`` naming the
   invocation, whose outcome will be stored.

``submit`` is the asynchronous variant: steps 1-2, then the queued row is returned at
once and a background task holds the admission slot until the row is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import async_sessionmaker

from app.auth.principal import Principal
from app.db import invocations
from app.db.failures import is_connection_failure
from app.db.writer import BatchWriter
from app.dispatch.transport import GatewayTransport
from app.errors import DatabaseUnavailable, ExecutionTimeout, Unavailable
from app.failpoints import Failpoints
from app.invocations.waiters import Outcome, Waiters
from app.metrics import Metrics
from app.placement.best_of_k import BestOfK
from app.quotas.admission import Admission
from wire.execution import RunSpec
from wire.ids import new_claim, new_id
from wire.messages import Job

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Timing:
    """How long the lifecycle may take beyond an execution's own limits."""

    wait_grace_s: float  #: a caller waits the limits plus this for the stored result
    hold_s: float  #: a claimed marker outlives the limits by this much
    queue_s: float  #: a Job may wait this long for a node before it is handed out again
    #: how long a gateway keeps asking a database that lost the connection mid-commit
    #: whether an invocation's row was recorded, before it answers that it cannot tell
    record_retry_s: float = 10.0


class Invocations:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[Any],
        writer: BatchWriter,
        transport: GatewayTransport,
        placement: BestOfK,
        admission: Admission,
        waiters: Waiters,
        metrics: Metrics,
        timing: Timing,
        failpoints: Failpoints,
    ) -> None:
        self._sessions = sessions
        self._writer = writer
        self._transport = transport
        self._placement = placement
        self._admission = admission
        self._waiters = waiters
        self._metrics = metrics
        self._timing = timing
        self._failpoints = failpoints
        self._background: set[asyncio.Task[None]] = set()

    async def run(
        self,
        principal: Principal,
        spec: RunSpec,
        *,
        kind: str = "run",
        function_version_id: str | None = None,
        record: dict[str, Any] | None = None,
    ) -> invocations.StoredInvocation:
        """Run ``spec`` for ``principal`` and return its stored row."""
        await self.runtime_for(spec.language)
        async with self._admission.admit(
            principal.tenant_id, principal.quota, wall_seconds=_wall(spec)
        ):
            row, job = await self._start(principal, spec, kind, function_version_id, record)
            outcome = await self._waiters.wait(
                row.id, job.deadline_seconds + self._timing.wait_grace_s
            )
        return await self._answer(principal, row, outcome)

    async def submit(
        self,
        principal: Principal,
        spec: RunSpec,
        *,
        kind: str = "run",
        function_version_id: str | None = None,
        record: dict[str, Any] | None = None,
    ) -> invocations.StoredInvocation:
        """Start ``spec`` and return its queued row at once (asynchronous invocation).

        Admission happens here, so a refusal (429) is still the caller's answer. The
        concurrency slot is then held by a background task until the row is stored (or
        the wait runs out); the outcome is stored whether or not this process lives.
        """
        await self.runtime_for(spec.language)
        slot = self._admission.admit(principal.tenant_id, principal.quota, wall_seconds=_wall(spec))
        await slot.__aenter__()
        try:
            row, job = await self._start(principal, spec, kind, function_version_id, record)
        except BaseException as exc:
            await slot.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        task = asyncio.create_task(
            self._hold(slot, row, job.deadline_seconds + self._timing.wait_grace_s),
            name=f"corral-async-{row.id}",
        )
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return row

    async def close(self) -> None:
        """Stop the background holders (their invocations are stored regardless)."""
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    async def runtime_for(self, language: str) -> str:
        """The runtime a live node offers ``language`` in (or the typed refusal)."""
        return (await self._placement.offering(language))[0][1]

    async def languages(self) -> dict[str, str]:
        catalogue = self._placement.catalogue
        return catalogue.languages(await catalogue.nodes())

    async def _start(
        self,
        principal: Principal,
        spec: RunSpec,
        kind: str,
        function_version_id: str | None,
        record: dict[str, Any] | None,
    ) -> tuple[invocations.StoredInvocation, Job]:
        """Place, commit the row with its Job, then dispatch the Job. The placement
        counts against its node until the dispatch is over (``Placement.landed``)."""
        placement = await self._placement.place(spec.language, principal.tenant_id)
        try:
            job = Job(
                invocation_id=new_id("inv"),
                tenant_id=principal.tenant_id,
                kind=kind,
                runtime=placement.runtime,
                spec=spec,
                claim=new_claim(),
                attempt=1,
                reply_to=self._transport.gateway_id,
                enqueued_at=time.time(),
            )
            row = await self._record(
                invocations.Create(
                    invocation_id=job.invocation_id,
                    tenant_id=principal.tenant_id,
                    kind=kind,
                    runtime=placement.runtime,
                    language=spec.language,
                    request=record if record is not None else _request_record(spec),
                    claim=job.claim,
                    job=job.model_dump_json(),
                    function_version_id=function_version_id,
                )
            )
            self._failpoints.hit("invocations.after_commit")
            self._waiters.expect(job.invocation_id)
            try:
                await self._transport.dispatch(
                    job,
                    node_id=placement.node_id,
                    hold_s=self._timing.hold_s,
                    queue_s=self._timing.queue_s,
                )
            except Exception as exc:  # the row holds the Job: the reconciler sends it
                self._metrics.dispatch_failures.inc()
                log.warning(
                    "inv=%s dispatch failed (%r); left to the reconciler", job.invocation_id, exc
                )
            return row, job
        finally:
            placement.landed()

    async def _record(self, create: invocations.Create) -> invocations.StoredInvocation:
        """Commit ``create``'s row. A connection lost during the commit leaves it unknown
        whether the row was made durable (and the reconciler would run a stored Job): a
        "not recorded" answer could then be false, and a retrying client would run the
        code twice. So the row is written again, only if absent, until the database
        answers; if it does not within ``record_retry_s`` the answer says the outcome is
        unknown and names the id (``GET /v1/invocations/{id}`` settles it once the
        database is back)."""
        try:
            return await self._writer.write(create)  # type: ignore[no-any-return]
        except Exception as exc:
            if not is_connection_failure(exc):
                raise
            log.warning(
                "inv=%s the connection was lost while recording it (%r); asking again",
                create.invocation_id,
                exc,
            )
        deadline = time.monotonic() + self._timing.record_retry_s
        delay = 0.05
        while True:
            await asyncio.sleep(delay)
            try:
                row = await self._writer.write(invocations.EnsureCreated(create))
            except Exception as exc:
                if not is_connection_failure(exc):
                    raise
                if time.monotonic() + delay > deadline:
                    log.warning(
                        "inv=%s the database did not answer in %.0fs: recorded or not is unknown",
                        create.invocation_id,
                        self._timing.record_retry_s,
                    )
                    raise DatabaseUnavailable(
                        f"the database failed while invocation {create.invocation_id} was "
                        "being recorded; whether it was is unknown until it is back: "
                        f"GET /v1/invocations/{create.invocation_id} answers",
                        details={"invocation_id": create.invocation_id, "recorded": "unknown"},
                    ) from None
                delay = min(delay * 2, 1.0)
                continue
            log.info("inv=%s recorded once the database answered again", create.invocation_id)
            return row  # type: ignore[no-any-return]

    async def _hold(
        self,
        slot: contextlib.AbstractAsyncContextManager[float],
        row: invocations.StoredInvocation,
        timeout: float,
    ) -> None:
        """Keep an asynchronous invocation's admission slot until it is stored."""
        try:
            outcome = await self._waiters.wait(row.id, timeout)
            if outcome is not None:
                self._metrics.count_invocation(row.kind, str(outcome.get("status")))
            else:
                log.info("inv=%s (async): not stored within %.0fs", row.id, timeout)
        except Exception:
            log.exception("inv=%s (async): waiting for it failed", row.id)
        finally:
            await slot.__aexit__(None, None, None)

    async def _answer(
        self, principal: Principal, row: invocations.StoredInvocation, outcome: Outcome | None
    ) -> invocations.StoredInvocation:
        if outcome is not None:
            for column, value in outcome.items():
                setattr(row, column, value)
            self._metrics.count_invocation(row.kind, row.status)
            return row
        try:
            async with self._sessions() as session:
                stored = await invocations.get(
                    session, tenant_id=principal.tenant_id, invocation_id=row.id
                )
        except (SQLAlchemyError, OSError) as exc:
            log.warning(
                "inv=%s no outcome in time and the database is unreachable: %r", row.id, exc
            )
            raise Unavailable(
                f"invocation {row.id} is accepted but its outcome cannot be read now; "
                f"poll /v1/invocations/{row.id}",
                details={"invocation_id": row.id},
            ) from None
        if stored.status in invocations.OPEN:
            log.warning("inv=%s no outcome in time; still %s", row.id, stored.status)
            raise ExecutionTimeout(
                f"invocation {row.id} did not finish in time; poll /v1/invocations/{row.id}",
                details={"invocation_id": row.id},
            )
        self._metrics.count_invocation(stored.kind, stored.status)
        return stored


def _wall(spec: RunSpec) -> float:
    return spec.limits.wall_seconds


def _request_record(spec: RunSpec) -> dict[str, Any]:
    """What is kept of the request: everything but file contents (names and sizes only)."""
    record = spec.model_dump(mode="json", exclude={"files"})
    record["files"] = {name: len(content) for name, content in spec.files.items()}
    return record
