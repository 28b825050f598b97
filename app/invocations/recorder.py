"""The recorder: the one writer of what nodes report, and the only path to an answer.

Nodes publish ``Started`` and ``Finished`` on the results stream of the gateway that
dispatched the Job; the recorder of that gateway reads a batch, stores it through the
group-commit writer (each write under its claim token: ``app.db.invocations``), and
only then **settles** it (acknowledges the entries and the Jobs' deliveries, removes the
markers) and hands each waiting request the columns that were stored. A write that
fails is retried, with backoff, until it is stored: nothing read is ever dropped. What
this gateway read but never settled is read again when its reading resumes, or, if the
gateway dies, adopted by the reconciler of another (a new process is a new gateway, with
a results stream of its own). Storing is idempotent (a claim can be stored once), so
reading an event twice changes nothing.

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

from app.db import invocations, usage
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


class Recorder:
    def __init__(
        self,
        *,
        transport: GatewayTransport,
        writer: BatchWriter,
        waiters: Waiters,
        metrics: Metrics,
        failpoints: Failpoints,
    ) -> None:
        self._transport = transport
        self._writer = writer
        self._waiters = waiters
        self._metrics = metrics
        self._failpoints = failpoints

    async def run(self) -> None:
        """Record this gateway's results stream, for as long as the process lives."""
        while True:
            try:
                async for batch in self._transport.results():
                    await self.record(batch)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("recorder: reading results failed (%r); retrying", exc)
                await asyncio.sleep(0.5)

    async def record(self, entries: Sequence[Entry]) -> None:
        """Store ``entries``, retrying until all are stored; settle them; answer waiters."""
        pending = list(entries)
        delay = 0.05
        while pending:
            pending = await self._attempt(pending)
            if pending:
                self._metrics.recorder.labels("retried").inc(len(pending))
                await asyncio.sleep(delay)
                delay = min(MAX_BACKOFF_S, delay * 2)

    async def _attempt(self, entries: list[Entry]) -> list[Entry]:
        """One try at storing ``entries``; returns those not stored."""
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
            return entries
        stored: list[Entry] = list(skipped)
        failed: list[Entry] = []
        answers: list[tuple[str, Outcome]] = []
        for (group, _), outcome in zip(writes, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("recorder: %s not stored: %r", _what(group), outcome)
                failed.extend(group)
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
