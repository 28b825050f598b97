"""The recorder: the one writer of what nodes report, and the only path to an answer.

Nodes publish ``Started`` and ``Finished`` on the results stream of the gateway that
dispatched the Job; the recorder of that gateway reads a batch, stores it through the
group-commit writer (each write under its claim token: ``app.db.invocations``), and
only then **settles** it (acknowledges the entries and the Jobs' deliveries, removes the
markers) and hands each waiting request the columns that were stored. What this gateway
read but never settled is read again when its reading resumes, or, if the gateway dies,
adopted by the reconciler of another (a new process is a new gateway, with a results
stream of its own). Storing is idempotent (a claim can be stored once), so reading an
event twice changes nothing.

A write that fails is tried again, with backoff, **aside**: the reports whose write
failed are retried by a task of their own while the stream goes on being read (at most
``MAX_RETRYING`` such tasks; past that, reading waits), so one bad report never holds up
the others. A write that fails because the database cannot be reached is tried until it
is stored, however long that takes: nothing read is dropped. A write that fails
``tries`` times for a reason of its own (a poison report) goes to the **dead letters**
(``app.db.dead_letters``: a row an operator lists, with the report and the failure) and
its invocation ends ``errored`` with ``result_not_stored`` in the same transaction; then
the report is settled and its waiter answered, and the stream has moved on.

Idle-capacity events of warm pools (``PoolUsage``) are stored as platform usage; a
``Stored`` notice (the reconciler ended a row elsewhere) answers a local waiter from
the database.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from app.db import dead_letters, invocations, usage
from app.db.dead_letters import RESULT_NOT_STORED
from app.db.failures import is_connection_failure
from app.db.invocations import epoch
from app.db.models import Invocation
from app.db.writer import BatchWriter, Write
from app.dispatch.transport import Entry, GatewayTransport
from app.failpoints import Failpoints
from app.invocations.waiters import Outcome, Waiters
from app.metrics import Metrics
from wire.messages import Finished, PoolUsage, Started, Stored

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 5.0
#: Batches whose failed reports are being retried aside at once; past it, reading waits.
MAX_RETRYING = 8

#: A report that could not be stored, and why.
Failure = tuple[Entry, BaseException]


class Recorder:
    def __init__(
        self,
        *,
        transport: GatewayTransport,
        writer: BatchWriter,
        waiters: Waiters,
        metrics: Metrics,
        failpoints: Failpoints,
        tries: int = 5,
        backoff_s: float = 0.1,
    ) -> None:
        self._transport = transport
        self._writer = writer
        self._waiters = waiters
        self._metrics = metrics
        self._failpoints = failpoints
        self._tries = tries
        self._backoff_s = backoff_s
        self._retrying: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        """Record this gateway's results stream, for as long as the process lives."""
        try:
            while True:
                try:
                    async for batch in self._transport.results():
                        failures = await self._attempt(batch)
                        if failures:
                            await self._retry_aside(failures)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("recorder: reading results failed (%r); retrying", exc)
                    await asyncio.sleep(0.5)
        finally:
            for task in list(self._retrying):
                task.cancel()  # not settled: read again by the next reader, or adopted

    async def record(self, entries: Sequence[Entry]) -> None:
        """Store ``entries`` (retrying; poison reports to the dead letters), settle them
        and answer their waiters; returns once every entry is settled."""
        await self._retry(await self._attempt(list(entries)))

    async def _retry_aside(self, failures: list[Failure]) -> None:
        while len(self._retrying) >= MAX_RETRYING:
            await asyncio.wait(self._retrying, return_when=asyncio.FIRST_COMPLETED)
        task = asyncio.create_task(self._retry(failures), name="corral-recorder-retry")
        self._retrying.add(task)
        task.add_done_callback(self._retrying.discard)

    async def _retry(self, failures: list[Failure]) -> None:
        """Try again until each report is stored or dead-lettered. A failure of the
        database's connection is not the report's fault and does not count."""
        tries: dict[int, int] = {}
        delay = self._backoff_s
        while failures:
            self._metrics.recorder.labels("retried").inc(len(failures))
            pending: list[Entry] = []
            poison: list[Failure] = []
            for entry, exc in failures:
                if not is_connection_failure(exc):
                    tries[id(entry)] = tries.get(id(entry), 0) + 1
                if tries.get(id(entry), 0) >= self._tries:
                    poison.append((entry, exc))
                else:
                    pending.append(entry)
            for entry, exc in poison:
                if not await self._dead_letter(entry, exc, tries[id(entry)]):
                    pending.append(entry)
            if not pending:
                return
            await asyncio.sleep(delay)
            delay = min(MAX_BACKOFF_S, delay * 2)
            failures = await self._attempt(pending)

    async def _attempt(self, entries: list[Entry]) -> list[Failure]:
        """One try at storing ``entries``; returns those not stored, and why."""
        finished = {e.event.invocation_id for e in entries if isinstance(e.event, Finished)}
        writes: list[tuple[list[Entry], Write]] = []
        skipped: list[Entry] = []
        pools: list[Entry] = []
        for entry in entries:
            event = entry.event
            if isinstance(event, Started):
                if event.invocation_id in finished:  # its Finish follows in this batch
                    skipped.append(entry)
                    continue
                writes.append(([entry], _mark_running(event)))
            elif isinstance(event, Finished):
                writes.append(([entry], _finish(event)))
            elif isinstance(event, Stored):
                writes.append(([entry], _read_row(event.invocation_id)))
            else:
                pools.append(entry)
        if pools:
            writes.append((pools, _pool_usage([e.event for e in pools])))  # type: ignore[misc]
        try:
            self._failpoints.hit("recorder.before_commit")
            outcomes = await asyncio.gather(
                *(self._writer.write(write) for _, write in writes), return_exceptions=True
            )
        except Exception as exc:
            log.warning("recorder: storing %d events failed: %r", len(entries), exc)
            return [(entry, exc) for entry in entries]
        stored: list[Entry] = list(skipped)
        failed: list[Failure] = []
        answers: list[tuple[str, Outcome]] = []
        for (group, _), outcome in zip(writes, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("recorder: %s not stored: %r", _what(group), outcome)
                failed.extend((entry, outcome) for entry in group)
                continue
            stored.extend(group)
            event = group[0].event
            if isinstance(event, Finished):
                self._metrics.recorder.labels("stored" if outcome else "superseded").inc()
                if outcome:
                    answers.append((event.invocation_id, outcome))
                else:
                    log.info(
                        "inv=%s result of claim %s from %s not stored: superseded or final",
                        event.invocation_id,
                        event.claim,
                        event.node_id,
                    )
            elif isinstance(event, Stored) and outcome:
                answers.append((event.invocation_id, outcome))
        await self._settle(stored)
        for invocation_id, outcome in answers:
            self._waiters.resolve(invocation_id, outcome)
        return failed

    async def _dead_letter(self, entry: Entry, exc: BaseException, tries: int) -> bool:
        """Keep a poison report as a dead letter, end its invocation, settle it and answer
        its waiter; whether that was stored (if not, the report stays pending)."""
        event = entry.event
        invocation_id = getattr(event, "invocation_id", None)
        claim = event.claim if isinstance(event, Finished) else None
        what = {Finished: "finished", Started: "started", Stored: "stored"}.get(
            type(event), "pool_usage"
        )

        def letter(usage: bool) -> Callable[[AsyncSession], Awaitable[Any]]:
            async def write(session: AsyncSession) -> Any:
                return await dead_letters.add(
                    session,
                    gateway_id=self._transport.gateway_id,
                    kind=what,
                    invocation_id=invocation_id,
                    claim=claim,
                    node_id=getattr(event, "node_id", None),
                    tries=tries,
                    error=repr(exc),
                    event=event.model_dump_json(),
                    usage=usage,
                )

            return write

        try:
            try:
                kept, outcome = await self._writer.write(letter(usage=True))
            except Exception as first:
                if is_connection_failure(first):
                    raise
                # ending the invocation with its usage event may fail as its result did
                kept, outcome = await self._writer.write(letter(usage=False))
        except Exception as failed:
            log.error("recorder: %s: its dead letter not stored: %r", _what([entry]), failed)
            return False
        self._metrics.recorder.labels("dead_lettered").inc()
        log.error(
            "recorder: %s not stored after %d tries (%r): dead letter %s%s",
            _what([entry]),
            tries,
            exc,
            kept.id,
            f", invocation {invocation_id} ended {RESULT_NOT_STORED}" if outcome else "",
        )
        await self._settle([entry])
        if outcome and invocation_id is not None:
            self._waiters.resolve(invocation_id, outcome)
        return True

    async def _settle(self, entries: list[Entry]) -> None:
        """Acknowledge what is stored. If that fails, the entries are read again later and
        storing them again changes nothing."""
        for delay in (0.05, 0.2, 1.0):
            try:
                await self._transport.settle(entries)
                return
            except Exception as exc:
                log.warning("recorder: settling %d entries failed (%r)", len(entries), exc)
                await asyncio.sleep(delay)


def _mark_running(event: Started) -> invocations.MarkRunning:
    return invocations.MarkRunning(
        invocation_id=event.invocation_id,
        claim=event.claim,
        node_id=event.node_id,
        started_at=epoch(event.started_at),
    )


def _finish(event: Finished) -> invocations.Finish:
    return invocations.Finish(
        invocation_id=event.invocation_id,
        claim=event.claim,
        attempt=event.attempt,
        node_id=event.node_id,
        started_at=epoch(event.started_at),
        finished_at=epoch(event.finished_at),
        queue_ms=event.queue_ms,
        result=event.result,
    )


def _read_row(invocation_id: str) -> Callable[[AsyncSession], Awaitable[Outcome | None]]:
    async def read(session: AsyncSession) -> Outcome | None:
        row = await session.get(Invocation, invocation_id)
        if row is None or row.status in invocations.OPEN:
            return None
        return {
            column.key: getattr(row, column.key) for column in Invocation.__mapper__.column_attrs
        }

    return read


def _pool_usage(events: list[PoolUsage]) -> Callable[[AsyncSession], Awaitable[Any]]:
    async def store(session: AsyncSession) -> None:
        await usage.record_pool_usage(session, events)

    return store


def _what(group: list[Entry]) -> str:
    event = group[0].event
    name = type(event).__name__
    return f"{name} of {getattr(event, 'invocation_id', None) or getattr(event, 'pool', '?')}"
